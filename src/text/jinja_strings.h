#pragma once
// Python str semantics over UTF-8 text, for the Jinja engine: Python counts, indexes and strips
// code points (not bytes) and has its own notions of whitespace, printable characters and case.
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace dspark::jinja {

// Code points of valid UTF-8 text (template sources and JSON strings are validated on entry).
std::u32string decode_utf8(std::string_view text);
std::string encode_utf8(std::u32string_view code_points);
bool is_ascii(std::string_view text);
size_t code_point_count(std::string_view text);

// str.isspace() for one code point.
bool is_python_space(char32_t c);
// str.isprintable() for one code point (used by repr()). Exact for assigned code points in the
// control, format, separator, surrogate and private-use categories; unassigned code points count
// as printable.
bool is_python_printable(char32_t c);

// str.upper() / str.lower() / str.title() / str.capitalize() / str.swapcase().
std::string python_upper(std::string_view text);
std::string python_lower(std::string_view text);
std::string python_title(std::string_view text);
std::string python_capitalize(std::string_view text);

// str.strip(chars) family; chars == nullopt strips whitespace.
enum class StripSide { kLeft, kRight, kBoth };
std::string python_strip(std::string_view text, const std::optional<std::string>& chars,
                         StripSide side);
// str.split(sep, maxsplit) and str.rsplit; sep == nullopt splits on runs of whitespace.
std::vector<std::string> python_split(std::string_view text, const std::optional<std::string>& sep,
                                      int64_t max_split, bool from_right);
// str.splitlines(keepends).
std::vector<std::string> python_splitlines(std::string_view text, bool keep_ends);
// str.replace(old, new, count); count < 0 replaces all.
std::string python_replace(std::string_view text, std::string_view old_text,
                           std::string_view new_text, int64_t count);
// str.find / str.rfind / str.count, in code points; -1 when absent.
int64_t python_find(std::string_view text, std::string_view needle, bool from_right);
int64_t python_count(std::string_view text, std::string_view needle);

// markupsafe.escape: & < > " ' as HTML entities.
std::string html_escape(std::string_view text);

}  // namespace dspark::jinja
