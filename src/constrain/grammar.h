#pragma once
// Byte-level context-free grammars for constrained decoding (response_format), and a matcher that
// follows one text through a grammar byte by byte.
//
// The JSON grammars write JSON the way Python's json.dumps does by default: ", " between items,
// ": " between a key and its value, no other whitespace. Fixing the layout keeps every constrained
// answer in one canonical form and spends no tokens on free whitespace. Strings must be valid
// UTF-8 (a token may end inside a multi-byte character).
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <string_view>

namespace dspark::constrain {

class Grammar;

// Whether `value` nests arrays and objects deeper than `limit`, found without recursing. Callers
// holding a request's JSON check this before copying or serialising it (nlohmann's copy and dump
// recurse, and a schema nested 50,000 deep would overflow the stack there).
bool json_nested_deeper_than(const nlohmann::json& value, int limit);
bool json_nested_deeper_than(const nlohmann::ordered_json& value, int limit);

// Any JSON object (response_format {"type": "json_object"}).
std::shared_ptr<const Grammar> json_object_grammar();

// What compiling one schema may spend. A request's schema is untrusted input: nesting, size and
// time are bounded, and going past a bound throws dspark::Error naming it. Compilation is linear
// in the schema's size (bounded counts such as maxLength unroll into at most 1000 rules each).
struct CompileBudget {
  std::chrono::steady_clock::time_point deadline = std::chrono::steady_clock::time_point::max();
  // Polled during compilation (a server passes "the client left or the server is stopping");
  // once it returns true the compile is abandoned.
  std::function<bool()> cancelled;
  // Levels of nested schemas (properties, items, anyOf branches, $ref targets...).
  int max_depth = 64;
  // Grammar rules the schema may unroll into.
  size_t max_rules = 200000;
};
// The budget the overloads without one use: the defaults above and a 5 second deadline.
CompileBudget default_compile_budget();

// JSON accepted by `schema` (response_format {"type": "json_schema"}). Throws dspark::Error naming
// the keyword and its JSON pointer for what it does not support. Object properties come in the
// order `properties` lists them; required ones must appear, others may be left out;
// `additionalProperties` absent counts as false (OpenAI's strict mode) when `properties` is given
// and as true (any members) otherwise. Additional members come after the declared ones; their
// keys are any strings (a declared name is not excluded).
std::shared_ptr<const Grammar> json_schema_grammar(const nlohmann::json& schema);
// The same for a schema parsed with its key order kept: properties then come in the order the
// schema text lists them (nlohmann::json sorts keys), as OpenAI's structured outputs write them.
std::shared_ptr<const Grammar> json_schema_grammar(const nlohmann::ordered_json& schema);
std::shared_ptr<const Grammar> json_schema_grammar(const nlohmann::json& schema,
                                                   const CompileBudget& budget);
std::shared_ptr<const Grammar> json_schema_grammar(const nlohmann::ordered_json& schema,
                                                   const CompileBudget& budget);

// Where one text stands in a grammar. A value type: copies advance independently.
class Matcher {
 public:
  explicit Matcher(std::shared_ptr<const Grammar> grammar);
  Matcher(const Matcher&);
  Matcher& operator=(const Matcher&);
  Matcher(Matcher&&) noexcept;
  Matcher& operator=(Matcher&&) noexcept;
  ~Matcher();

  // Takes `byte` if the grammar allows it next and returns true; otherwise returns false and
  // leaves the matcher as it was.
  bool advance(uint8_t byte);
  // Takes every byte of `bytes`, or none of them (returns false).
  bool advance(std::string_view bytes);
  // Whether the text so far is a whole sentence of the grammar (the end may come now).
  bool complete() const;
  // Whether any byte may follow (false once a sentence can only end).
  bool can_continue() const;

  // Equal matchers accept the same continuations; the hash is for caching per-state results.
  bool operator==(const Matcher& other) const;
  size_t hash() const;

 private:
  struct State;
  std::shared_ptr<const Grammar> grammar_;
  std::unique_ptr<State> state_;
};

}  // namespace dspark::constrain
