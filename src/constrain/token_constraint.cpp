#include "constrain/token_constraint.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <mutex>
#include <string_view>
#include <unordered_map>
#include <utility>

#include "base/error.h"
#include "text/tokenizer.h"

namespace dspark::constrain {

// Nodes in depth-first preorder: a node's first child follows it, its subtree ends at
// subtree_end, where its next sibling starts. A walk reads the array forward and skips a refused
// subtree in one jump.
struct TokenVocabulary::Trie {
  struct Node {
    uint32_t subtree_end = 0;
    // ids ending here: ids[first_id, first_id + id_count); in the subtree: [first_id, ids_end).
    uint32_t first_id = 0;
    uint32_t ids_end = 0;
    uint16_t id_count = 0;
    uint8_t byte = 0;   // the edge from the parent
    bool text = false;  // read from a character boundary, every path down is plain text
  };
  std::vector<Node> nodes;
  std::vector<int32_t> ids;

  // Plain text, the body of a JSON string without escapes: UTF-8 without controls, '"' and '\\'.
  // Most tokens are plain text, and inside a string each character leads back to the same
  // grammar state, so the walk takes such subtrees whole. The reader's states: at a character
  // boundary, or inside a character with what the next byte must be.
  enum TextState : int8_t {
    kNotText = -1,
    kBoundary,
    kTail1,  // then 1 continuation byte
    kTail2,
    kTail3,
    kAfterE0,  // then A0..BF and one more (no overlong forms)
    kAfterED,  // then 80..9F and one more (no surrogates)
    kAfterF0,  // then 90..BF and two more (no overlong forms)
    kAfterF4,  // then 80..8F and two more (nothing past U+10FFFF)
    kTextStates
  };
  static TextState next_text_state(TextState state, uint8_t byte);

  static Trie build(const std::vector<std::optional<std::string>>& bytes);
  // Sets allowed[id] for every id whose bytes the grammar accepts from `start`.
  void mark_accepted(const Matcher& start, std::vector<uint8_t>& allowed) const;

 private:
  class Walk;
};

TokenVocabulary::Trie TokenVocabulary::Trie::build(
    const std::vector<std::optional<std::string>>& bytes) {
  std::vector<std::pair<std::string_view, int32_t>> entries;
  for (size_t id = 0; id < bytes.size(); ++id) {
    // A token that adds no bytes cannot move the text forward: it is never allowed.
    if (bytes[id] && !bytes[id]->empty()) {
      entries.emplace_back(*bytes[id], static_cast<int32_t>(id));
    }
  }
  // Sorted, the entries list the trie's paths in preorder.
  std::sort(entries.begin(), entries.end());

  Trie trie;
  trie.nodes.emplace_back();
  std::vector<uint32_t> path = {0};  // the nodes spelling the previous entry, root first
  std::string_view previous;
  auto close_to = [&](size_t depth) {
    while (path.size() > depth + 1) {
      Node& node = trie.nodes[path.back()];
      node.subtree_end = static_cast<uint32_t>(trie.nodes.size());
      node.ids_end = static_cast<uint32_t>(trie.ids.size());
      path.pop_back();
    }
  };
  for (const auto& [text, id] : entries) {
    size_t common = 0;
    while (common < previous.size() && common < text.size() && previous[common] == text[common]) {
      ++common;
    }
    close_to(common);
    for (size_t depth = common; depth < text.size(); ++depth) {
      Node node;
      node.byte = static_cast<uint8_t>(text[depth]);
      // Entries that end at a node come right as it is made, before any below it.
      node.first_id = static_cast<uint32_t>(trie.ids.size());
      trie.nodes.push_back(node);
      path.push_back(static_cast<uint32_t>(trie.nodes.size() - 1));
    }
    Node& last = trie.nodes[path.back()];
    if (last.id_count == UINT16_MAX) fail("token vocabulary: too many ids spell '{}'", text);
    ++last.id_count;
    trie.ids.push_back(id);
    previous = text;
  }
  close_to(0);
  trie.nodes[0].subtree_end = static_cast<uint32_t>(trie.nodes.size());
  trie.nodes[0].ids_end = static_cast<uint32_t>(trie.ids.size());
  // text_from[n] bit s: node n's byte and every path below it are plain text when read from
  // reader state s. Children follow their parent, so a backward pass sees them first.
  std::vector<uint8_t> text_from(trie.nodes.size(), 0);
  for (size_t n = trie.nodes.size(); n-- > 1;) {
    Node& node = trie.nodes[n];
    for (int s = kBoundary; s < kTextStates; ++s) {
      const TextState after = next_text_state(static_cast<TextState>(s), node.byte);
      bool text = after != kNotText;
      for (uint32_t child = static_cast<uint32_t>(n) + 1; child < node.subtree_end && text;
           child = trie.nodes[child].subtree_end) {
        text = (text_from[child] >> after) & 1;
      }
      if (text) text_from[n] |= static_cast<uint8_t>(1u << s);
    }
    node.text = text_from[n] & (1u << kBoundary);
  }
  return trie;
}

TokenVocabulary::Trie::TextState TokenVocabulary::Trie::next_text_state(TextState state,
                                                                        uint8_t byte) {
  const bool tail = byte >= 0x80 && byte <= 0xBF;
  switch (state) {
    case kBoundary:
      if (byte >= 0x20 && byte < 0x7F) return byte == '"' || byte == '\\' ? kNotText : kBoundary;
      if (byte >= 0xC2 && byte <= 0xDF) return kTail1;
      if (byte == 0xE0) return kAfterE0;
      if (byte == 0xED) return kAfterED;
      if (byte >= 0xE1 && byte <= 0xEF) return kTail2;
      if (byte == 0xF0) return kAfterF0;
      if (byte >= 0xF1 && byte <= 0xF3) return kTail3;
      if (byte == 0xF4) return kAfterF4;
      return kNotText;
    case kTail1:
      return tail ? kBoundary : kNotText;
    case kTail2:
      return tail ? kTail1 : kNotText;
    case kTail3:
      return tail ? kTail2 : kNotText;
    case kAfterE0:
      return byte >= 0xA0 && byte <= 0xBF ? kTail1 : kNotText;
    case kAfterED:
      return byte >= 0x80 && byte <= 0x9F ? kTail1 : kNotText;
    case kAfterF0:
      return byte >= 0x90 && byte <= 0xBF ? kTail2 : kNotText;
    case kAfterF4:
      return byte >= 0x80 && byte <= 0x8F ? kTail2 : kNotText;
    default:
      return kNotText;
  }
}

namespace {

struct MatcherHash {
  size_t operator()(const Matcher& matcher) const { return matcher.hash(); }
};

}  // namespace

// Many trie nodes stand at the same grammar state (inside a string, every plain character leads
// back to the same one), so the walk numbers the states it meets and memoizes each (state, byte)
// step: a node then costs a table lookup, and the matcher only advances once per distinct step.
// From a state that takes any plain text, a subtree of plain-text tokens is taken whole.
class TokenVocabulary::Trie::Walk {
 public:
  Walk(const Trie& trie, const Matcher& start, std::vector<uint8_t>& allowed)
      : trie_(trie), allowed_(allowed), probe_(start) {
    steps_.reserve(64);  // a walk meets a few dozen states
    state_of(start);
  }

  void visit_children(uint32_t node_index, int32_t state) {
    const uint32_t end = trie_.nodes[node_index].subtree_end;
    uint32_t child_index = node_index + 1;
    while (child_index < end) {
      const Node& child = trie_.nodes[child_index];
      if (child.text && takes_any_text(state)) {
        for (uint32_t i = child.first_id; i < child.ids_end; ++i) allowed_[trie_.ids[i]] = 1;
      } else if (const int32_t next = step(state, child.byte); next != kRejected) {
        for (uint32_t i = 0; i < child.id_count; ++i) allowed_[trie_.ids[child.first_id + i]] = 1;
        if (child.subtree_end > child_index + 1) visit_children(child_index, next);
      }
      child_index = child.subtree_end;
    }
  }

 private:
  static constexpr int32_t kUnknown = -2;
  static constexpr int32_t kRejected = -1;

  int32_t state_of(const Matcher& matcher) {
    const auto found = ids_.find(matcher);
    if (found != ids_.end()) return found->second;
    const auto number = static_cast<int32_t>(states_.size());
    ids_.emplace(matcher, number);
    states_.push_back(matcher);
    steps_.emplace_back();
    steps_.back().fill(kUnknown);
    takes_any_text_.push_back(-1);
    return number;
  }

  // Whether the grammar takes any plain text from `state` and is back at `state` after every
  // whole character (the inside of a JSON string): it follows the text reader's steps from
  // (kBoundary, state) through every byte, pairing reader and grammar states.
  bool takes_any_text(int32_t state) {
    if (takes_any_text_[static_cast<size_t>(state)] < 0) {
      // Computed before indexing again: following the reader may number new states.
      const bool takes = follows_text_reader(state);
      takes_any_text_[static_cast<size_t>(state)] = takes ? 1 : 0;
    }
    return takes_any_text_[static_cast<size_t>(state)] != 0;
  }

  bool follows_text_reader(int32_t state) {
    static const auto text_steps = [] {
      std::array<std::array<Trie::TextState, 256>, Trie::kTextStates> table;
      for (int reader = 0; reader < Trie::kTextStates; ++reader) {
        for (unsigned byte = 0; byte < 256; ++byte) {
          table[reader][byte] = Trie::next_text_state(static_cast<Trie::TextState>(reader),
                                                      static_cast<uint8_t>(byte));
        }
      }
      return table;
    }();
    std::vector<std::pair<Trie::TextState, int32_t>> pending = {{Trie::kBoundary, state}};
    std::vector<std::pair<Trie::TextState, int32_t>> seen = pending;
    while (!pending.empty()) {
      const auto [reader, grammar] = pending.back();
      pending.pop_back();
      for (unsigned byte = 0; byte < 256; ++byte) {
        const Trie::TextState reader_next = text_steps[reader][byte];
        if (reader_next == Trie::kNotText) continue;
        const int32_t grammar_next = step(grammar, static_cast<uint8_t>(byte));
        if (grammar_next == kRejected) return false;
        if (reader_next == Trie::kBoundary) {
          if (grammar_next != state) return false;
          continue;
        }
        const std::pair<Trie::TextState, int32_t> pair = {reader_next, grammar_next};
        if (std::find(seen.begin(), seen.end(), pair) == seen.end()) {
          seen.push_back(pair);
          pending.push_back(pair);
        }
      }
    }
    return true;
  }

  int32_t step(int32_t state, uint8_t byte) {
    const int32_t known = steps_[static_cast<size_t>(state)][byte];
    if (known != kUnknown) return known;
    probe_ = states_[static_cast<size_t>(state)];  // reuses the scratch matcher's storage
    const int32_t next = probe_.advance(byte) ? state_of(probe_) : kRejected;
    steps_[static_cast<size_t>(state)][byte] = next;
    return next;
  }

  const Trie& trie_;
  std::vector<uint8_t>& allowed_;
  std::vector<Matcher> states_;                  // by state number
  std::vector<std::array<int32_t, 256>> steps_;  // [state][byte]: next state, or kRejected
  std::vector<int8_t> takes_any_text_;           // [state]: -1 not known yet, else 0 or 1
  std::unordered_map<Matcher, int32_t, MatcherHash> ids_;
  Matcher probe_;
};

void TokenVocabulary::Trie::mark_accepted(const Matcher& start,
                                          std::vector<uint8_t>& allowed) const {
  Walk(*this, start, allowed).visit_children(0, 0);
}

namespace {

// The cache starts over when its sets would pass 4096 states or 64 MiB (one byte per id: 400
// states of a 150k vocabulary); a JSON answer visits a few dozen.
constexpr size_t kMaxCachedStates = 4096;
constexpr size_t kMaxCachedBytes = size_t{64} << 20;

}  // namespace

struct TokenVocabulary::Cache {
  std::mutex mutex;
  // A key holds its grammar alive, so a freed grammar's address never finds stale sets.
  std::unordered_map<Matcher, std::shared_ptr<const std::vector<uint8_t>>, MatcherHash> by_state;
};

TokenVocabulary::TokenVocabulary(std::vector<std::optional<std::string>> bytes)
    : bytes_(std::move(bytes)),
      trie_(std::make_unique<Trie>(Trie::build(bytes_))),
      cache_(std::make_unique<Cache>()) {}

TokenVocabulary::~TokenVocabulary() = default;

std::shared_ptr<const TokenVocabulary> TokenVocabulary::from_tokenizer(const Tokenizer& tokenizer) {
  const int32_t size = tokenizer.vocab_size();
  std::vector<std::optional<std::string>> bytes(static_cast<size_t>(size));
  for (int32_t id = 0; id < size; ++id) {
    std::optional<std::string> token = tokenizer.token_bytes(id);
    // Added tokens written as markup (<think>, <tool_call>, <|fim_prefix|>, ...) drive the
    // reasoning and tool-call parsers even when not special: an answer never holds them as one
    // token (ordinary tokens can still spell the text). llguidance draws the same line.
    if (token && tokenizer.is_added(id) && token->size() >= 2 && token->front() == '<' &&
        token->back() == '>') {
      token.reset();
    }
    bytes[static_cast<size_t>(id)] = std::move(token);
  }
  return std::make_shared<const TokenVocabulary>(std::move(bytes));
}

int32_t TokenVocabulary::size() const {
  return static_cast<int32_t>(bytes_.size());
}

const std::optional<std::string>& TokenVocabulary::bytes(int32_t id) const {
  if (id < 0 || id >= size()) fail("token vocabulary: id {} is outside [0, {})", id, size());
  return bytes_[static_cast<size_t>(id)];
}

TokenConstraint::TokenConstraint(std::shared_ptr<const Grammar> grammar,
                                 std::shared_ptr<const TokenVocabulary> vocabulary,
                                 std::vector<int32_t> end_ids)
    : matcher_(std::move(grammar)),
      vocabulary_(std::move(vocabulary)),
      end_ids_(std::move(end_ids)) {
  for (const int32_t id : end_ids_) {
    if (id < 0 || id >= vocabulary_->size()) {
      fail("token constraint: end id {} is outside the vocabulary [0, {})", id,
           vocabulary_->size());
    }
  }
}

bool TokenConstraint::is_end_id(int32_t id) const {
  return std::find(end_ids_.begin(), end_ids_.end(), id) != end_ids_.end();
}

const TokenConstraint::AllowedSet& TokenConstraint::allowed() const {
  if (current_) return *current_;
  TokenVocabulary::Cache& cache = *vocabulary_->cache_;
  {
    std::lock_guard lock(cache.mutex);
    const auto found = cache.by_state.find(matcher_);
    if (found != cache.by_state.end()) {
      current_ = found->second;
      return *current_;
    }
  }
  // Walked outside the lock: another thread may walk the same state meanwhile, and both
  // results are equal.
  auto walked = std::make_shared<AllowedSet>(vocabulary_->size(), 0);
  vocabulary_->trie_->mark_accepted(matcher_, *walked);
  current_ = std::move(walked);
  std::lock_guard lock(cache.mutex);
  const size_t limit =
      std::min(kMaxCachedStates, kMaxCachedBytes / std::max<size_t>(current_->size(), 1));
  if (cache.by_state.size() >= limit) cache.by_state.clear();
  cache.by_state.emplace(matcher_, current_);
  return *current_;
}

void TokenConstraint::mask_logits(float* logits, int64_t vocab) const {
  if (ended_) {
    std::fill(logits, logits + vocab, -INFINITY);
    return;
  }
  const AllowedSet& set = allowed();
  const int64_t known = std::min<int64_t>(vocab, static_cast<int64_t>(set.size()));
  // End ids follow complete() whatever their bytes: keep their logits aside.
  const bool end_allowed = matcher_.complete();
  std::vector<float> end_logits;
  for (const int32_t id : end_ids_) end_logits.push_back(id < known ? logits[id] : -INFINITY);
  const uint8_t* allowed_ids = set.data();
  if (std::none_of(allowed_ids, allowed_ids + known, [](uint8_t allowed) { return allowed; }) &&
      !(end_allowed && !end_ids_.empty())) {
    fail(
        "token constraint: no token can continue the answer here: the grammar needs bytes that "
        "no token of the vocabulary spells");
  }
  // A select rather than a branch: the compiler vectorizes it (this runs once per token).
  for (int64_t id = 0; id < known; ++id) {
    logits[id] = allowed_ids[id] ? logits[id] : -INFINITY;
  }
  for (int64_t id = known; id < vocab; ++id) logits[id] = -INFINITY;
  for (size_t i = 0; i < end_ids_.size(); ++i) {
    if (end_ids_[i] < known) logits[end_ids_[i]] = end_allowed ? end_logits[i] : -INFINITY;
  }
}

bool TokenConstraint::allows(int32_t id) const {
  if (ended_ || id < 0 || id >= vocabulary_->size()) return false;
  if (is_end_id(id)) return matcher_.complete();
  if (current_) return (*current_)[static_cast<size_t>(id)] != 0;
  // One token's check is a few advances on a copy, far cheaper than a cold walk.
  const std::optional<std::string>& bytes = vocabulary_->bytes(id);
  if (!bytes || bytes->empty()) return false;
  Matcher probe = matcher_;
  return probe.advance(*bytes);
}

void TokenConstraint::accept(int32_t id) {
  if (ended_) fail("token constraint: token {} comes after the end of the answer", id);
  if (id < 0 || id >= vocabulary_->size()) {
    fail("token constraint: token {} is outside the vocabulary [0, {})", id, vocabulary_->size());
  }
  if (is_end_id(id)) {
    if (!matcher_.complete()) {
      fail("token constraint: end token {} before the answer is complete", id);
    }
    ended_ = true;
  } else {
    const std::optional<std::string>& bytes = vocabulary_->bytes(id);
    if (!bytes || bytes->empty() || !matcher_.advance(*bytes)) {
      fail("token constraint: the grammar does not allow token {} here", id);
    }
  }
  current_.reset();
}

bool TokenConstraint::complete() const {
  return ended_ || matcher_.complete();
}

bool TokenConstraint::finished() const {
  return ended_ || (matcher_.complete() && !matcher_.can_continue());
}

}  // namespace dspark::constrain
