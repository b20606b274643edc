#pragma once
// Reading untrusted client text safely: UTF-8 validation, a JSON nesting limit checked by a flat
// scan before any recursive code (nlohmann's copy, dump, the template engine, the schema
// compiler) sees the value, and a JSON dump that never throws on invalid UTF-8 (model output cut
// mid-character, echoed client bytes).
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

namespace dspark::server {

// The deepest JSON nesting (arrays + objects) a request may carry anywhere: in the body and in
// JSON text carried inside string fields (tool-call arguments). Deep enough for any real schema
// or conversation; shallow enough that every recursive walk stays a few hundred frames.
constexpr int kMaxJsonDepth = 128;

// Size caps on nested request fields. The body as a whole is capped (--max-body-mb), but one
// field could still fill it: megabytes of template variables rendered into every prompt, of tool
// schemas in every prompt and output parser, of metadata nothing reads. Each cap is far above real
// use (a coding agent's largest tool schemas are a few KiB; a file written through a tool call's
// arguments can be large, hence the larger cap there) and refused with a 400 naming the field.
constexpr size_t kMaxTemplateKwargsBytes = size_t{64} << 10;  // chat_template_kwargs
constexpr size_t kMaxToolBytes = size_t{256} << 10;           // one tool: name, description, schema
constexpr size_t kMaxToolsBytes = size_t{1} << 20;            // every tool together
constexpr size_t kMaxToolArgumentsBytes = size_t{1} << 20;    // one call's arguments in history
constexpr size_t kMaxResponseSchemaBytes = size_t{256} << 10;  // response_format's schema
constexpr size_t kMaxMetadataBytes = size_t{16} << 10;         // metadata (OpenAI, Anthropic)

// Offset of the first byte that is not part of well-formed UTF-8 (overlong forms, surrogates and
// code points past U+10FFFF are malformed), or npos.
size_t invalid_utf8_offset(std::string_view text);

// Whether JSON text nests deeper than kMaxJsonDepth (a flat scan; strings are skipped).
bool nests_too_deep(std::string_view text);

// Throws ApiError 400 when `text` (named `what` in the message) is not UTF-8, nests deeper than
// kMaxJsonDepth, or holds a NaN / Infinity literal or a number too large for a double (each named
// by the path of keys it sits under). The scan is flat; malformed JSON is left to the parser.
void check_json_text(std::string_view text, std::string_view what);

// check_json_text, then parse; a syntax error is a 400 too.
nlohmann::json parse_json_input(std::string_view text, std::string_view what);
nlohmann::ordered_json parse_ordered_json_input(std::string_view text, std::string_view what);

// The size a cap above measures: a string's length, any other value's compact JSON text.
size_t field_bytes(const nlohmann::json& value);
// Throws ApiError 400 naming `field` when field_bytes(value) > limit.
void check_field_size(const nlohmann::json& value, const std::string& field, size_t limit);

// dump() with invalid UTF-8 replaced by U+FFFD instead of a type_error.
std::string dump_json(const nlohmann::json& value);
std::string dump_json(const nlohmann::ordered_json& value);

}  // namespace dspark::server
