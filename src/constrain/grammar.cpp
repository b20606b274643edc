#include "constrain/grammar.h"

#include <algorithm>
#include <iterator>
#include <map>
#include <memory>
#include <utility>
#include <vector>

#include "base/error.h"
#include "constrain/grammar_rules.h"

namespace dspark::constrain {

uint32_t GrammarBuilder::declare(std::string name) {
  names_.push_back(std::move(name));
  rules_.emplace_back();
  defined_.push_back(false);
  return static_cast<uint32_t>(rules_.size() - 1);
}

void GrammarBuilder::define(uint32_t rule, std::vector<Sequence> alternatives) {
  if (alternatives.empty()) fail("grammar rule {} has no alternatives", names_[rule]);
  rules_[rule] = std::move(alternatives);
  defined_[rule] = true;
}

uint32_t GrammarBuilder::add(std::string name, std::vector<Sequence> alternatives) {
  uint32_t id = declare(std::move(name));
  define(id, std::move(alternatives));
  return id;
}

Element GrammarBuilder::bytes(const ByteSet& set) {
  auto found = std::find(byte_sets_.begin(), byte_sets_.end(), set);
  if (found == byte_sets_.end()) found = byte_sets_.insert(byte_sets_.end(), set);
  return {Element::Kind::kBytes, static_cast<uint32_t>(found - byte_sets_.begin())};
}

Element GrammarBuilder::byte_range(uint8_t first, uint8_t last) {
  ByteSet set{};
  for (unsigned value = first; value <= last; ++value)
    set[value >> 6] |= uint64_t{1} << (value & 63);
  return bytes(set);
}

Sequence GrammarBuilder::literal(std::string_view text) {
  Sequence sequence;
  for (char c : text) sequence.push_back(byte(static_cast<uint8_t>(c)));
  return sequence;
}

namespace {

// Works out, for every flat position, the expansions (see Grammar) by following rule references
// until a byte set is reached. Expansions with the same pushes are merged into one byte set.
class ExpansionSolver {
 public:
  struct Pending {
    ByteSet bytes;
    std::vector<uint32_t> push;
  };

  ExpansionSolver(const std::vector<Element>& elements, const std::vector<std::string>& names,
                  const std::vector<std::vector<uint32_t>>& alternative_starts,
                  const std::vector<uint32_t>& owner, const std::vector<ByteSet>& byte_sets)
      : elements_(elements),
        names_(names),
        alternative_starts_(alternative_starts),
        owner_(owner),
        byte_sets_(byte_sets),
        expansions_(elements.size()),
        nullable_(elements.size(), 0),
        visit_(elements.size(), kUnvisited) {}

  void solve(uint32_t position) {
    if (visit_[position] == kDone) return;
    if (visit_[position] == kActive) {
      fail("grammar rule {} is left-recursive (reaches itself before any byte)",
           names_[owner_[position]]);
    }
    visit_[position] = kActive;
    const Element& element = elements_[position];
    Merged result;
    bool nullable = false;
    if (element.kind == Element::Kind::kEnd) {
      nullable = true;
    } else if (element.kind == Element::Kind::kBytes) {
      Pending pending{byte_sets_[element.value], {}};
      if (elements_[position + 1].kind != Element::Kind::kEnd) pending.push.push_back(position + 1);
      result.add(std::move(pending));
    } else {
      const uint32_t after = position + 1;
      const bool tail = elements_[after].kind == Element::Kind::kEnd;
      bool rule_nullable = false;
      for (uint32_t start : alternative_starts_[element.value]) {
        solve(start);
        for (const Pending& inner : expansions_[start]) {
          Pending pending{inner.bytes, {}};
          if (!tail) pending.push.push_back(after);
          pending.push.insert(pending.push.end(), inner.push.begin(), inner.push.end());
          result.add(std::move(pending));
        }
        rule_nullable = rule_nullable || nullable_[start];
      }
      if (rule_nullable) {
        solve(after);
        for (const Pending& rest : expansions_[after]) result.add(rest);
        nullable = nullable_[after] != 0;
      }
    }
    expansions_[position] = std::move(result.list);
    nullable_[position] = nullable ? 1 : 0;
    visit_[position] = kDone;
  }

  const std::vector<Pending>& expansions(uint32_t position) const { return expansions_[position]; }
  bool nullable(uint32_t position) const { return nullable_[position] != 0; }

 private:
  enum Visit : uint8_t { kUnvisited, kActive, kDone };

  // Expansions in the order found, one per distinct push list.
  struct Merged {
    std::vector<Pending> list;
    std::map<std::vector<uint32_t>, size_t> index;

    void add(Pending pending) {
      auto [found, inserted] = index.emplace(pending.push, list.size());
      if (inserted) {
        list.push_back(std::move(pending));
      } else {
        ByteSet& bytes = list[found->second].bytes;
        for (int word = 0; word < 4; ++word) bytes[word] |= pending.bytes[word];
      }
    }
  };

  const std::vector<Element>& elements_;
  const std::vector<std::string>& names_;
  const std::vector<std::vector<uint32_t>>& alternative_starts_;
  const std::vector<uint32_t>& owner_;
  const std::vector<ByteSet>& byte_sets_;
  std::vector<std::vector<Pending>> expansions_;
  std::vector<uint8_t> nullable_;
  std::vector<Visit> visit_;
};

}  // namespace

std::shared_ptr<const Grammar> GrammarBuilder::build(
    uint32_t root, const std::function<void()>& on_progress) const {
  for (size_t rule = 0; rule < rules_.size(); ++rule) {
    if (!defined_[rule]) fail("grammar rule {} is declared but never defined", names_[rule]);
  }
  // Position 0 refers to the root rule and is followed by an end: the start of every parse.
  std::vector<Element> elements{GrammarBuilder::rule(root), {Element::Kind::kEnd, 0}};
  std::vector<uint32_t> owner{root, root};
  std::vector<std::vector<uint32_t>> alternative_starts(rules_.size());
  for (size_t rule = 0; rule < rules_.size(); ++rule) {
    for (const Sequence& alternative : rules_[rule]) {
      alternative_starts[rule].push_back(static_cast<uint32_t>(elements.size()));
      for (const Element& element : alternative) {
        elements.push_back(element);
        owner.push_back(static_cast<uint32_t>(rule));
      }
      elements.push_back({Element::Kind::kEnd, 0});
      owner.push_back(static_cast<uint32_t>(rule));
    }
  }

  ExpansionSolver solver(elements, names_, alternative_starts, owner, byte_sets_);
  auto grammar = std::make_shared<Grammar>();
  grammar->start_position_ = 0;
  std::map<ByteSet, uint32_t> set_ids;
  auto intern = [&](const ByteSet& set) {
    auto [found, inserted] =
        set_ids.emplace(set, static_cast<uint32_t>(grammar->byte_sets_.size()));
    if (inserted) grammar->byte_sets_.push_back(set);
    return found->second;
  };
  for (uint32_t position = 0; position < elements.size(); ++position) {
    if (on_progress && position % 256 == 0) on_progress();
    solver.solve(position);
    grammar->expansion_begin_.push_back(static_cast<uint32_t>(grammar->expansions_.size()));
    ByteSet first{};
    for (const auto& pending : solver.expansions(position)) {
      grammar->expansions_.push_back({intern(pending.bytes),
                                      static_cast<uint32_t>(grammar->pushes_.size()),
                                      static_cast<uint32_t>(pending.push.size())});
      grammar->pushes_.insert(grammar->pushes_.end(), pending.push.begin(), pending.push.end());
      for (int word = 0; word < 4; ++word) first[word] |= pending.bytes[word];
    }
    grammar->nullable_.push_back(solver.nullable(position) ? 1 : 0);
    grammar->first_bytes_.push_back(first);
  }
  grammar->expansion_begin_.push_back(static_cast<uint32_t>(grammar->expansions_.size()));
  return grammar;
}

// The parse stacks the text so far leaves open, laid out flat as [length, positions...] per
// stack, bottom first. A stack's top is the position the text goes on from (not yet expanded:
// expanding only on the next byte keeps the set small and makes every text that reaches the same
// point leave the same stacks). Stacks are kept sorted and distinct so equal states compare equal.
//
// Matchers are copied at every node of a vocabulary walk, so short states live inline and a copy
// costs one allocation.
class FlatStacks {
 public:
  FlatStacks() = default;
  FlatStacks(const FlatStacks& other) { assign(other.begin(), other.end()); }
  FlatStacks& operator=(const FlatStacks& other) {
    if (this != &other) assign(other.begin(), other.end());
    return *this;
  }

  void assign(const uint32_t* first, const uint32_t* last) {
    const size_t size = static_cast<size_t>(last - first);
    if (size > capacity_) {
      capacity_ = std::max(size, 2 * capacity_);
      heap_ = std::make_unique<uint32_t[]>(capacity_);
    }
    std::copy(first, last, data());
    size_ = size;
  }

  uint32_t* data() { return heap_ ? heap_.get() : inline_; }
  const uint32_t* data() const { return heap_ ? heap_.get() : inline_; }
  const uint32_t* begin() const { return data(); }
  const uint32_t* end() const { return data() + size_; }
  size_t size() const { return size_; }
  uint32_t operator[](size_t i) const { return data()[i]; }
  bool operator==(const FlatStacks& other) const {
    return std::equal(begin(), end(), other.begin(), other.end());
  }

 private:
  static constexpr size_t kInline = 28;
  uint32_t inline_[kInline];
  std::unique_ptr<uint32_t[]> heap_;
  size_t size_ = 0;
  size_t capacity_ = kInline;
};

struct Matcher::State {
  FlatStacks stacks;
};

namespace {

// Sorts the stacks in `flat` and drops duplicates, writing the result to `out`.
void normalize(const std::vector<uint32_t>& flat, FlatStacks& out) {
  struct Span {
    uint32_t offset;
    uint32_t length;
  };
  thread_local std::vector<Span> spans;
  spans.clear();
  for (size_t i = 0; i < flat.size(); i += flat[i] + 1) {
    spans.push_back({static_cast<uint32_t>(i + 1), flat[i]});
  }

  auto begin = [&](const Span& span) { return flat.begin() + span.offset; };
  auto less = [&](const Span& a, const Span& b) {
    return std::lexicographical_compare(begin(a), begin(a) + a.length, begin(b),
                                        begin(b) + b.length);
  };
  auto equal = [&](const Span& a, const Span& b) {
    return std::equal(begin(a), begin(a) + a.length, begin(b), begin(b) + b.length);
  };
  std::sort(spans.begin(), spans.end(), less);
  spans.erase(std::unique(spans.begin(), spans.end(), equal), spans.end());
  thread_local std::vector<uint32_t> sorted;
  sorted.clear();
  for (const Span& span : spans) {
    sorted.push_back(span.length);
    sorted.insert(sorted.end(), begin(span), begin(span) + span.length);
  }
  out.assign(sorted.data(), sorted.data() + sorted.size());
}

}  // namespace

Matcher::Matcher(std::shared_ptr<const Grammar> grammar)
    : grammar_(std::move(grammar)), state_(std::make_unique<State>()) {
  const uint32_t start[] = {1, grammar_->start_position()};
  state_->stacks.assign(std::begin(start), std::end(start));
}

Matcher::Matcher(const Matcher& other)
    : grammar_(other.grammar_), state_(std::make_unique<State>(*other.state_)) {}

Matcher& Matcher::operator=(const Matcher& other) {
  if (this != &other) {
    grammar_ = other.grammar_;
    if (state_) {
      state_->stacks = other.state_->stacks;
    } else {
      state_ = std::make_unique<State>(*other.state_);
    }
  }
  return *this;
}

Matcher::Matcher(Matcher&&) noexcept = default;
Matcher& Matcher::operator=(Matcher&&) noexcept = default;
Matcher::~Matcher() = default;

bool Matcher::advance(uint8_t byte) {
  const Grammar& grammar = *grammar_;
  thread_local std::vector<uint32_t> next;
  next.clear();
  const FlatStacks& stacks = state_->stacks;
  size_t stack_count = 0;
  for (size_t i = 0; i < stacks.size(); i += stacks[i] + 1) {
    const uint32_t* stack = stacks.data() + i + 1;
    // Walk down while everything above could be empty: the byte may belong to a lower position.
    for (uint32_t depth = stacks[i]; depth > 0; --depth) {
      const uint32_t position = stack[depth - 1];
      if (contains(grammar.first_bytes(position), byte)) {
        for (const auto* expansion = grammar.expansions_begin(position);
             expansion != grammar.expansions_end(position); ++expansion) {
          if (!contains(grammar.byte_set(expansion->byte_set), byte)) continue;
          next.push_back(depth - 1 + expansion->push_length);
          next.insert(next.end(), stack, stack + depth - 1);
          const uint32_t* push = grammar.pushes(*expansion);
          next.insert(next.end(), push, push + expansion->push_length);
          ++stack_count;
        }
      }
      if (!grammar.nullable(position)) break;
    }
  }
  if (stack_count == 0) return false;
  if (stack_count == 1) {
    state_->stacks.assign(next.data(), next.data() + next.size());
  } else {
    normalize(next, state_->stacks);
  }
  return true;
}

bool Matcher::advance(std::string_view bytes) {
  const FlatStacks saved = state_->stacks;
  for (char c : bytes) {
    if (!advance(static_cast<uint8_t>(c))) {
      state_->stacks = saved;
      return false;
    }
  }
  return true;
}

bool Matcher::complete() const {
  const FlatStacks& stacks = state_->stacks;
  for (size_t i = 0; i < stacks.size(); i += stacks[i] + 1) {
    bool all_nullable = true;
    for (uint32_t k = 0; k < stacks[i] && all_nullable; ++k) {
      all_nullable = grammar_->nullable(stacks[i + 1 + k]);
    }
    if (all_nullable) return true;
  }
  return false;
}

bool Matcher::can_continue() const {
  const FlatStacks& stacks = state_->stacks;
  for (size_t i = 0; i < stacks.size(); i += stacks[i] + 1) {
    for (uint32_t depth = stacks[i]; depth > 0; --depth) {
      const uint32_t position = stacks[i + depth];
      if (grammar_->expansions_begin(position) != grammar_->expansions_end(position)) return true;
      if (!grammar_->nullable(position)) break;
    }
  }
  return false;
}

bool Matcher::operator==(const Matcher& other) const {
  return grammar_ == other.grammar_ && state_->stacks == other.state_->stacks;
}

size_t Matcher::hash() const {
  uint64_t hash = 0xcbf29ce484222325ull ^ reinterpret_cast<uintptr_t>(grammar_.get());
  for (uint32_t value : state_->stacks) {
    hash = (hash ^ value) * 0x100000001b3ull;
    hash ^= hash >> 29;
  }
  return static_cast<size_t>(hash);
}

}  // namespace dspark::constrain
