#pragma once
// A grammar applied to a tokenizer's vocabulary: which token ids may come next, as a logit mask.
//
// Each id's bytes go into a trie once per vocabulary; the allowed set for a matcher state is a
// walk of that trie that drops every branch the grammar rejects, cached by state in the
// vocabulary (JSON answers revisit the same few states: inside a string, after a key, ...; and
// every answer to json_object shares one grammar, so later requests find the sets warm).
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "constrain/grammar.h"

namespace dspark {
class Tokenizer;
}

namespace dspark::constrain {

class TokenVocabulary {
 public:
  // bytes[id]: the bytes token `id` adds to the text; nullopt for ids a grammar never allows
  // (special and control tokens).
  explicit TokenVocabulary(std::vector<std::optional<std::string>> bytes);
  // Tokenizer::token_bytes of every id; special added tokens and added tokens written as markup
  // (<think>, <tool_call>, ...) are never allowed.
  static std::shared_ptr<const TokenVocabulary> from_tokenizer(const Tokenizer& tokenizer);
  ~TokenVocabulary();

  int32_t size() const;
  const std::optional<std::string>& bytes(int32_t id) const;

 private:
  friend class TokenConstraint;
  struct Trie;
  struct Cache;
  std::vector<std::optional<std::string>> bytes_;
  std::unique_ptr<Trie> trie_;
  std::unique_ptr<Cache> cache_;  // allowed sets by matcher state, for every constraint on it
};

// One answer's constraint. Not for concurrent use of one object; copies (one per speculative
// verify row) and other constraints may run on other threads (the vocabulary's cache is locked).
class TokenConstraint {
 public:
  // `end_ids` (the end-of-sequence ids) are allowed exactly when the text is complete.
  TokenConstraint(std::shared_ptr<const Grammar> grammar,
                  std::shared_ptr<const TokenVocabulary> vocabulary, std::vector<int32_t> end_ids);

  // Sets the logit of every id not allowed next to -infinity; ids >= the vocabulary's size are
  // never allowed.
  void mask_logits(float* logits, int64_t vocab) const;
  bool allows(int32_t id) const;
  // Advances over `id`; throws dspark::Error if it is not allowed.
  void accept(int32_t id);
  bool complete() const;
  // Whether the answer is over: an end id was accepted, or the text is complete and no byte may
  // follow (only an end id would be allowed).
  bool finished() const;

 private:
  // [id] != 0: the bytes of id may come next (end ids are decided by complete() alone).
  using AllowedSet = std::vector<uint8_t>;

  const AllowedSet& allowed() const;
  bool is_end_id(int32_t id) const;

  Matcher matcher_;
  std::shared_ptr<const TokenVocabulary> vocabulary_;
  std::vector<int32_t> end_ids_;
  bool ended_ = false;  // an end id was accepted: nothing may follow
  // The allowed set of the current state, kept while the state lasts (accept drops it).
  mutable std::shared_ptr<const AllowedSet> current_;
};

}  // namespace dspark::constrain
