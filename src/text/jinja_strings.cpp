#include "text/jinja_strings.h"

#include <locale.h>
#include <wctype.h>

#include <algorithm>
#include <iterator>

#include "base/error.h"
#include "text/jinja_value.h"
#include "text/utf8.h"

namespace dspark::jinja {
namespace {

struct CodePointRange {
  char32_t first;
  char32_t last;
};

// Assigned code points that Python 3.11 (Unicode 14) str.isprintable() rejects: categories Cc, Cf,
// Cs, Co, Zl, Zp and Zs other than the ASCII space. Generated from unicodedata.
constexpr CodePointRange kNonPrintable[] = {
    {0x0, 0x1F},        {0x7F, 0xA0},       {0xAD, 0xAD},       {0x600, 0x605},
    {0x61C, 0x61C},     {0x6DD, 0x6DD},     {0x70F, 0x70F},     {0x890, 0x891},
    {0x8E2, 0x8E2},     {0x1680, 0x1680},   {0x180E, 0x180E},   {0x2000, 0x200F},
    {0x2028, 0x202F},   {0x205F, 0x2064},   {0x2066, 0x206F},   {0x3000, 0x3000},
    {0xD800, 0xF8FF},   {0xFEFF, 0xFEFF},   {0xFFF9, 0xFFFB},   {0x110BD, 0x110BD},
    {0x110CD, 0x110CD}, {0x13430, 0x13438}, {0x1BCA0, 0x1BCA3}, {0x1D173, 0x1D17A},
    {0xE0001, 0xE0001}, {0xE0020, 0xE007F}, {0xF0000, 0xFFFFD}, {0x100000, 0x10FFFD},
};

struct SpecialCase {
  char32_t code_point;
  const char32_t* mapping;
};

// Full case mappings that differ from the one-to-one mappings (Unicode SpecialCasing), generated
// from Python 3.11: characters whose upper()/lower() is several code points, and characters whose
// title() differs from upper(). The one-to-one mappings come from glibc's C.UTF-8 locale, which
// agrees with Python on every code point (checked when these tables were generated).
#include "text/jinja_casing.inc"

locale_t utf8_locale() {
  static const locale_t locale = newlocale(LC_CTYPE_MASK, "C.UTF-8", locale_t{});
  if (locale == locale_t{}) fail("jinja: the C.UTF-8 locale, needed for case mapping, is missing");
  return locale;
}

template <size_t N>
const char32_t* find_special(const SpecialCase (&table)[N], char32_t c) {
  const auto it =
      std::lower_bound(std::begin(table), std::end(table), c,
                       [](const SpecialCase& row, char32_t key) { return row.code_point < key; });
  return it != std::end(table) && it->code_point == c ? it->mapping : nullptr;
}

void append_upper(std::u32string& out, char32_t c) {
  if (c < 0x80) {
    out.push_back(c >= 'a' && c <= 'z' ? c - 32 : c);
  } else if (const char32_t* special = find_special(kUpperSpecial, c)) {
    out += special;
  } else {
    out.push_back(static_cast<char32_t>(towupper_l(static_cast<wint_t>(c), utf8_locale())));
  }
}

char32_t simple_lower(char32_t c) {
  if (c < 0x80) return c >= 'A' && c <= 'Z' ? c + 32 : c;
  return static_cast<char32_t>(towlower_l(static_cast<wint_t>(c), utf8_locale()));
}

void append_title(std::u32string& out, char32_t c) {
  if (const char32_t* special = find_special(kTitleSpecial, c)) {
    out += special;
  } else {
    append_upper(out, c);
  }
}

bool is_cased(char32_t c) {
  if (c < 0x80) return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
  const auto wc = static_cast<wint_t>(c);
  return iswupper_l(wc, utf8_locale()) || iswlower_l(wc, utf8_locale()) ||
         find_special(kTitleSpecial, c) != nullptr;
}

// Unicode Case_Ignorable, restricted to the characters likely to sit next to a capital sigma.
bool is_case_ignorable(char32_t c) {
  return c == 0x27 || c == 0x2E || c == 0x3A || c == 0x5E || c == 0x60 || c == 0xA8 || c == 0xAD ||
         c == 0xAF || c == 0xB4 || c == 0xB7 || c == 0xB8 || c == 0x2019 ||
         (c >= 0x300 && c <= 0x36F);
}

void append_lower(std::u32string& out, const std::u32string& text, size_t i) {
  const char32_t c = text[i];
  constexpr char32_t kCapitalSigma = 0x3A3;
  if (c == kCapitalSigma) {
    // Final_Sigma: a sigma ending a word lowercases to the final form.
    size_t j = i;
    bool cased_before = false;
    while (j > 0) {
      --j;
      if (is_case_ignorable(text[j])) continue;
      cased_before = is_cased(text[j]);
      break;
    }
    bool cased_after = false;
    for (size_t k = i + 1; k < text.size(); ++k) {
      if (is_case_ignorable(text[k])) continue;
      cased_after = is_cased(text[k]);
      break;
    }
    out.push_back(cased_before && !cased_after ? 0x3C2 : 0x3C3);
  } else if (const char32_t* special = find_special(kLowerSpecial, c)) {
    out += special;
  } else {
    out.push_back(simple_lower(c));
  }
}

bool in_set(char32_t c, const std::u32string& set) {
  return set.find(c) != std::u32string::npos;
}

size_t byte_offset_to_code_points(std::string_view text, size_t byte_offset) {
  return code_point_count(text.substr(0, byte_offset));
}

}  // namespace

std::u32string decode_utf8(std::string_view text) {
  std::u32string out;
  out.reserve(text.size());
  for (size_t pos = 0; pos < text.size();) {
    char32_t c;
    const size_t length = utf8_decode(text, pos, &c);
    if (length == 0) fail("jinja: text is not valid UTF-8 at byte {}", pos);
    out.push_back(c);
    pos += length;
  }
  return out;
}

std::string encode_utf8(std::u32string_view code_points) {
  std::string out;
  out.reserve(code_points.size());
  for (char32_t c : code_points) utf8_append(out, c);
  return out;
}

bool is_ascii(std::string_view text) {
  return std::all_of(text.begin(), text.end(),
                     [](char c) { return static_cast<uint8_t>(c) < 0x80; });
}

size_t code_point_count(std::string_view text) {
  size_t count = 0;
  for (char c : text) count += (static_cast<uint8_t>(c) & 0xC0) != 0x80;
  return count;
}

bool is_python_space(char32_t c) {
  return (c >= 0x9 && c <= 0xD) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 ||
         c == 0x1680 || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F ||
         c == 0x205F || c == 0x3000;
}

bool is_python_printable(char32_t c) {
  for (const auto& range : kNonPrintable) {
    if (c < range.first) return true;
    if (c <= range.last) return false;
  }
  return true;
}

std::string python_upper(std::string_view text) {
  std::u32string out;
  for (char32_t c : decode_utf8(text)) append_upper(out, c);
  return encode_utf8(out);
}

std::string python_lower(std::string_view text) {
  const std::u32string code_points = decode_utf8(text);
  std::u32string out;
  for (size_t i = 0; i < code_points.size(); ++i) append_lower(out, code_points, i);
  return encode_utf8(out);
}

std::string python_title(std::string_view text) {
  const std::u32string code_points = decode_utf8(text);
  std::u32string out;
  bool previous_cased = false;
  for (size_t i = 0; i < code_points.size(); ++i) {
    if (previous_cased) {
      append_lower(out, code_points, i);
    } else {
      append_title(out, code_points[i]);
    }
    previous_cased = is_cased(code_points[i]);
  }
  return encode_utf8(out);
}

std::string python_capitalize(std::string_view text) {
  const std::u32string code_points = decode_utf8(text);
  std::u32string out;
  for (size_t i = 0; i < code_points.size(); ++i) {
    if (i == 0) {
      append_title(out, code_points[i]);
    } else {
      append_lower(out, code_points, i);
    }
  }
  return encode_utf8(out);
}

std::string python_strip(std::string_view text, const std::optional<std::string>& chars,
                         StripSide side) {
  const std::u32string code_points = decode_utf8(text);
  const std::u32string set = chars ? decode_utf8(*chars) : std::u32string();
  auto strip_it = [&](char32_t c) { return chars ? in_set(c, set) : is_python_space(c); };
  size_t begin = 0;
  size_t end = code_points.size();
  if (side != StripSide::kRight) {
    while (begin < end && strip_it(code_points[begin])) ++begin;
  }
  if (side != StripSide::kLeft) {
    while (end > begin && strip_it(code_points[end - 1])) --end;
  }
  return encode_utf8(std::u32string_view(code_points).substr(begin, end - begin));
}

std::vector<std::string> python_split(std::string_view text, const std::optional<std::string>& sep,
                                      int64_t max_split, bool from_right) {
  std::vector<std::string> parts;
  if (sep && sep->empty()) fail("ValueError: empty separator");
  if (!sep) {
    const std::u32string cps = decode_utf8(text);
    std::vector<std::pair<size_t, size_t>> words;  // [begin, end) in code points
    if (!from_right) {
      size_t i = 0;
      while (true) {
        while (i < cps.size() && is_python_space(cps[i])) ++i;
        if (i == cps.size()) break;
        if (max_split >= 0 && static_cast<int64_t>(words.size()) == max_split) {
          words.emplace_back(i, cps.size());  // the rest, trailing whitespace included
          break;
        }
        size_t j = i;
        while (j < cps.size() && !is_python_space(cps[j])) ++j;
        words.emplace_back(i, j);
        i = j;
      }
    } else {
      size_t i = cps.size();
      while (true) {
        while (i > 0 && is_python_space(cps[i - 1])) --i;
        if (i == 0) break;
        if (max_split >= 0 && static_cast<int64_t>(words.size()) == max_split) {
          words.emplace_back(0, i);  // the rest, leading whitespace included
          break;
        }
        size_t j = i;
        while (j > 0 && !is_python_space(cps[j - 1])) --j;
        words.emplace_back(j, i);
        i = j;
      }
      std::reverse(words.begin(), words.end());
    }
    for (const auto& [begin, end] : words) {
      parts.push_back(encode_utf8(std::u32string_view(cps).substr(begin, end - begin)));
    }
    return parts;
  }
  if (!from_right) {
    size_t start = 0;
    while (max_split < 0 || static_cast<int64_t>(parts.size()) < max_split) {
      const size_t found = text.find(*sep, start);
      if (found == std::string_view::npos) break;
      parts.emplace_back(text.substr(start, found - start));
      start = found + sep->size();
    }
    parts.emplace_back(text.substr(start));
    return parts;
  }
  size_t end = text.size();
  while (max_split < 0 || static_cast<int64_t>(parts.size()) < max_split) {
    if (end < sep->size()) break;
    const size_t found = text.rfind(*sep, end - sep->size());
    if (found == std::string_view::npos) break;
    parts.emplace_back(text.substr(found + sep->size(), end - found - sep->size()));
    end = found;
  }
  parts.emplace_back(text.substr(0, end));
  std::reverse(parts.begin(), parts.end());
  return parts;
}

std::vector<std::string> python_splitlines(std::string_view text, bool keep_ends) {
  const std::u32string cps = decode_utf8(text);
  std::vector<std::string> lines;
  size_t start = 0;
  size_t i = 0;
  while (i < cps.size()) {
    const char32_t c = cps[i];
    const bool boundary = c == '\n' || c == '\r' || c == 0x0B || c == 0x0C || c == 0x1C ||
                          c == 0x1D || c == 0x1E || c == 0x85 || c == 0x2028 || c == 0x2029;
    if (!boundary) {
      ++i;
      continue;
    }
    size_t end = i + 1;
    if (c == '\r' && end < cps.size() && cps[end] == '\n') ++end;
    const size_t line_end = keep_ends ? end : i;
    lines.push_back(encode_utf8(std::u32string_view(cps).substr(start, line_end - start)));
    start = i = end;
  }
  if (start < cps.size()) lines.push_back(encode_utf8(std::u32string_view(cps).substr(start)));
  return lines;
}

std::string python_replace(std::string_view text, std::string_view old_text,
                           std::string_view new_text, int64_t count) {
  std::string out;
  if (old_text.empty()) {
    // Python inserts the replacement before every code point and at the end.
    const std::u32string cps = decode_utf8(text);
    int64_t done = 0;
    for (char32_t c : cps) {
      if (count < 0 || done < count) {
        out += new_text;
        ++done;
      }
      utf8_append(out, c);
      check_string_size(out.size(), "replace");
    }
    if (count < 0 || done < count) out += new_text;
    return out;
  }
  size_t start = 0;
  int64_t done = 0;
  while (count < 0 || done < count) {
    const size_t found = text.find(old_text, start);
    if (found == std::string_view::npos) break;
    out += text.substr(start, found - start);
    out += new_text;
    check_string_size(out.size(), "replace");
    start = found + old_text.size();
    ++done;
  }
  out += text.substr(start);
  return out;
}

int64_t python_find(std::string_view text, std::string_view needle, bool from_right) {
  const size_t found = from_right ? text.rfind(needle) : text.find(needle);
  if (found == std::string_view::npos) return -1;
  return static_cast<int64_t>(byte_offset_to_code_points(text, found));
}

int64_t python_count(std::string_view text, std::string_view needle) {
  if (needle.empty()) return static_cast<int64_t>(code_point_count(text)) + 1;
  int64_t count = 0;
  for (size_t pos = text.find(needle); pos != std::string_view::npos;
       pos = text.find(needle, pos + needle.size())) {
    ++count;
  }
  return count;
}

std::string html_escape(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&#34;";
        break;
      case '\'':
        out += "&#39;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

}  // namespace dspark::jinja
