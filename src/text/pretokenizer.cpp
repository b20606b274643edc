#include "text/pretokenizer.h"

#include <array>
#include <nlohmann/json.hpp>
#include <utility>

#include "base/error.h"
#include "text/tokenizer_json.h"
#include "text/unicode_regex.h"
#include "text/utf8.h"

namespace dspark {
namespace {

// GPT-2's split pattern, which ByteLevel applies when use_regex is set.
constexpr std::string_view kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

struct ByteLevelTables {
  std::array<std::string, 256> byte_to_char;
  std::array<int16_t, 512> char_to_byte;  // every stand-in is below U+0200
};

const ByteLevelTables& byte_level_tables() {
  static const ByteLevelTables tables = [] {
    ByteLevelTables t;
    t.char_to_byte.fill(-1);
    // Printable bytes stand for themselves; the others are moved to U+0100 upwards in order.
    int next_free = 0;
    for (int byte = 0; byte < 256; ++byte) {
      const bool printable = (byte >= '!' && byte <= '~') || (byte >= 0xA1 && byte <= 0xAC) ||
                             (byte >= 0xAE && byte <= 0xFF);
      const char32_t code_point = printable ? char32_t(byte) : char32_t(256 + next_free++);
      utf8_append(t.byte_to_char[byte], code_point);
      t.char_to_byte[code_point] = static_cast<int16_t>(byte);
    }
    return t;
  }();
  return tables;
}

enum class SplitBehavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };

SplitBehavior parse_behavior(const std::string& name, std::string_view source) {
  if (name == "Removed") return SplitBehavior::kRemoved;
  if (name == "Isolated") return SplitBehavior::kIsolated;
  if (name == "MergedWithPrevious") return SplitBehavior::kMergedWithPrevious;
  if (name == "MergedWithNext") return SplitBehavior::kMergedWithNext;
  if (name == "Contiguous") return SplitBehavior::kContiguous;
  fail("{}: unknown split behavior '{}'", source, name);
}

struct Span {
  size_t begin;
  size_t end;
  bool is_match;
};

// Cuts `text` at the matches of `regex` and groups matches and gaps as `behavior` says, following
// HF's NormalizedString::split.
void split_piece(const PreToken& piece, const UnicodeRegex& regex, SplitBehavior behavior,
                 bool invert, std::vector<PreToken>& out) {
  const std::string& text = piece.text;
  std::vector<Span> spans;
  size_t previous = 0;
  regex.for_each_match(text, [&](size_t begin, size_t end) {
    if (begin > previous) spans.push_back({previous, begin, invert});
    spans.push_back({begin, end, !invert});
    previous = end;
  });
  if (previous < text.size()) spans.push_back({previous, text.size(), invert});

  std::vector<std::pair<size_t, size_t>> kept;
  switch (behavior) {
    case SplitBehavior::kRemoved:
      for (const Span& span : spans) {
        if (!span.is_match) kept.emplace_back(span.begin, span.end);
      }
      break;
    case SplitBehavior::kIsolated:
      for (const Span& span : spans) kept.emplace_back(span.begin, span.end);
      break;
    case SplitBehavior::kMergedWithPrevious: {
      bool previous_match = false;
      for (const Span& span : spans) {
        if (span.is_match && !previous_match && !kept.empty()) {
          kept.back().second = span.end;
        } else {
          kept.emplace_back(span.begin, span.end);
        }
        previous_match = span.is_match;
      }
      break;
    }
    case SplitBehavior::kMergedWithNext: {
      bool previous_match = false;
      for (size_t i = spans.size(); i-- > 0;) {
        const Span& span = spans[i];
        if (span.is_match && !previous_match && !kept.empty()) {
          kept.back().first = span.begin;
        } else {
          kept.emplace_back(span.begin, span.end);
        }
        previous_match = span.is_match;
      }
      std::reverse(kept.begin(), kept.end());
      break;
    }
    case SplitBehavior::kContiguous: {
      bool previous_match = false;
      for (const Span& span : spans) {
        if (span.is_match == previous_match && !kept.empty()) {
          kept.back().second = span.end;
        } else {
          kept.emplace_back(span.begin, span.end);
        }
        previous_match = span.is_match;
      }
      break;
    }
  }
  for (const auto& [begin, end] : kept) {
    if (begin == end) continue;
    out.push_back({text.substr(begin, end - begin), piece.at_input_start && begin == 0});
  }
}

class SplitPreTokenizer final : public PreTokenizer {
 public:
  SplitPreTokenizer(const std::string& pattern, SplitBehavior behavior, bool invert)
      : regex_(pattern), behavior_(behavior), invert_(invert) {}
  void pre_tokenize(std::vector<PreToken>& pieces) const override {
    std::vector<PreToken> out;
    out.reserve(pieces.size() * 4);
    for (const PreToken& piece : pieces) split_piece(piece, regex_, behavior_, invert_, out);
    pieces = std::move(out);
  }

 private:
  UnicodeRegex regex_;
  SplitBehavior behavior_;
  bool invert_;
};

class ByteLevelPreTokenizer final : public PreTokenizer {
 public:
  ByteLevelPreTokenizer(bool add_prefix_space, bool use_regex)
      : add_prefix_space_(add_prefix_space) {
    if (use_regex) regex_ = std::make_unique<UnicodeRegex>(kGpt2Pattern);
  }
  void pre_tokenize(std::vector<PreToken>& pieces) const override {
    if (add_prefix_space_) {
      for (PreToken& piece : pieces) {
        if (piece.text.empty() || piece.text[0] != ' ') piece.text.insert(0, 1, ' ');
      }
    }
    if (regex_) {
      std::vector<PreToken> out;
      out.reserve(pieces.size() * 4);
      for (const PreToken& piece : pieces) {
        split_piece(piece, *regex_, SplitBehavior::kIsolated, false, out);
      }
      pieces = std::move(out);
    }
    const auto& table = byte_level_tables().byte_to_char;
    for (PreToken& piece : pieces) {
      std::string mapped;
      mapped.reserve(piece.text.size() * 2);
      for (const char c : piece.text) mapped += table[static_cast<uint8_t>(c)];
      piece.text = std::move(mapped);
    }
  }

 private:
  bool add_prefix_space_;
  std::unique_ptr<UnicodeRegex> regex_;
};

class MetaspacePreTokenizer final : public PreTokenizer {
 public:
  enum class Prepend { kAlways, kFirst, kNever };
  MetaspacePreTokenizer(char32_t replacement, Prepend prepend, bool split)
      : prepend_(prepend), split_(split) {
    utf8_append(replacement_, replacement);
    if (split_) splitter_ = std::make_unique<UnicodeRegex>(regex_escape(replacement_));
  }
  void pre_tokenize(std::vector<PreToken>& pieces) const override {
    std::vector<PreToken> out;
    out.reserve(pieces.size() * 4);
    for (PreToken& piece : pieces) {
      std::string replaced;
      replaced.reserve(piece.text.size() + replacement_.size());
      for (const char c : piece.text) {
        if (c == ' ') {
          replaced += replacement_;
        } else {
          replaced += c;
        }
      }
      const bool starts_with_replacement =
          replaced.compare(0, replacement_.size(), replacement_) == 0;
      const bool prepend =
          prepend_ == Prepend::kAlways || (prepend_ == Prepend::kFirst && piece.at_input_start);
      if (prepend && !starts_with_replacement) replaced.insert(0, replacement_);
      piece.text = std::move(replaced);
      if (split_) {
        split_piece(piece, *splitter_, SplitBehavior::kMergedWithNext, false, out);
      } else if (!piece.text.empty()) {
        out.push_back(std::move(piece));
      }
    }
    pieces = std::move(out);
  }

 private:
  std::string replacement_;
  Prepend prepend_;
  bool split_;
  std::unique_ptr<UnicodeRegex> splitter_;
};

class SequencePreTokenizer final : public PreTokenizer {
 public:
  explicit SequencePreTokenizer(std::vector<std::unique_ptr<PreTokenizer>> steps)
      : steps_(std::move(steps)) {}
  void pre_tokenize(std::vector<PreToken>& pieces) const override {
    for (const auto& step : steps_) step->pre_tokenize(pieces);
  }

 private:
  std::vector<std::unique_ptr<PreTokenizer>> steps_;
};

MetaspacePreTokenizer::Prepend metaspace_prepend(const nlohmann::json& spec,
                                                 std::string_view source) {
  if (spec.contains("prepend_scheme")) {
    const std::string scheme = spec.at("prepend_scheme").get<std::string>();
    if (scheme == "always") return MetaspacePreTokenizer::Prepend::kAlways;
    if (scheme == "first") return MetaspacePreTokenizer::Prepend::kFirst;
    if (scheme == "never") return MetaspacePreTokenizer::Prepend::kNever;
    fail("{}: unknown Metaspace prepend_scheme '{}'", source, scheme);
  }
  return spec.value("add_prefix_space", true) ? MetaspacePreTokenizer::Prepend::kAlways
                                              : MetaspacePreTokenizer::Prepend::kNever;
}

}  // namespace

const std::string& byte_level_char(uint8_t byte) {
  return byte_level_tables().byte_to_char[byte];
}

int byte_level_byte(char32_t code_point) {
  if (code_point >= 512) return -1;
  return byte_level_tables().char_to_byte[code_point];
}

std::unique_ptr<PreTokenizer> PreTokenizer::from_json(const nlohmann::json& spec,
                                                      std::string_view source) {
  if (spec.is_null()) return nullptr;
  const std::string type = spec.at("type").get<std::string>();
  if (type == "Split") {
    return std::make_unique<SplitPreTokenizer>(
        pattern_to_regex(spec.at("pattern"), source),
        parse_behavior(spec.at("behavior").get<std::string>(), source),
        spec.value("invert", false));
  }
  if (type == "ByteLevel") {
    return std::make_unique<ByteLevelPreTokenizer>(spec.value("add_prefix_space", true),
                                                   spec.value("use_regex", true));
  }
  if (type == "Digits") {
    // Rust's char::is_numeric is the N category; "individual" isolates each digit.
    const bool individual = spec.value("individual_digits", false);
    return std::make_unique<SplitPreTokenizer>(individual ? R"(\p{N})" : R"(\p{N}+)",
                                               SplitBehavior::kIsolated, false);
  }
  if (type == "Metaspace") {
    return std::make_unique<MetaspacePreTokenizer>(
        json_single_char(spec.value("replacement", nlohmann::json("\u2581")), "replacement",
                         source),
        metaspace_prepend(spec, source), spec.value("split", true));
  }
  if (type == "Sequence") {
    std::vector<std::unique_ptr<PreTokenizer>> steps;
    for (const auto& step : spec.at("pretokenizers")) {
      if (auto pre_tokenizer = from_json(step, source)) steps.push_back(std::move(pre_tokenizer));
    }
    return std::make_unique<SequencePreTokenizer>(std::move(steps));
  }
  fail("{}: unsupported pre_tokenizer type '{}'", source, type);
}

}  // namespace dspark
