#include "text/detokenizer.h"

#include <nlohmann/json.hpp>

#include "base/error.h"
#include "text/pretokenizer.h"
#include "text/tokenizer_json.h"
#include "text/unicode_regex.h"
#include "text/utf8.h"

namespace dspark {
namespace {

int hex_digit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

}  // namespace

std::optional<std::string> byte_level_token_bytes(std::string_view token) {
  std::string bytes;
  bytes.reserve(token.size());
  size_t pos = 0;
  while (pos < token.size()) {
    char32_t code_point;
    const size_t length = utf8_decode(token, pos, &code_point);
    const int byte = length == 0 ? -1 : byte_level_byte(code_point);
    if (byte < 0) return std::nullopt;
    bytes.push_back(static_cast<char>(byte));
    pos += length;
  }
  return bytes;
}

int byte_fallback_byte(std::string_view token) {
  if (token.size() != 6 || token.substr(0, 3) != "<0x" || token[5] != '>') return -1;
  const int high = hex_digit(token[3]);
  const int low = hex_digit(token[4]);
  return (high < 0 || low < 0) ? -1 : high * 16 + low;
}

namespace {

// Maps every token's stand-in characters back to bytes and joins them into one string; a token
// with any other character is taken as its raw bytes. Invalid UTF-8 becomes U+FFFD.
class ByteLevelDetokenizer final : public Detokenizer {
 public:
  void decode_chain(std::vector<std::string>& tokens) const override {
    std::string bytes;
    for (const std::string& token : tokens) {
      const std::optional<std::string> mapped = byte_level_token_bytes(token);
      bytes += mapped ? *mapped : token;
    }
    tokens.assign(1, utf8_is_valid(bytes) ? std::move(bytes) : utf8_repair(bytes));
  }
};

class MetaspaceDetokenizer final : public Detokenizer {
 public:
  MetaspaceDetokenizer(char32_t replacement, bool strip_first) : strip_first_(strip_first) {
    utf8_append(replacement_, replacement);
  }
  void decode_chain(std::vector<std::string>& tokens) const override {
    for (size_t i = 0; i < tokens.size(); ++i) {
      // The first token's markers stand for the space that encoding prepended: they are dropped.
      const std::string_view substitute = (i == 0 && strip_first_) ? "" : " ";
      std::string& token = tokens[i];
      std::string out;
      size_t pos = 0;
      while (pos < token.size()) {
        if (token.compare(pos, replacement_.size(), replacement_) == 0) {
          out += substitute;
          pos += replacement_.size();
        } else {
          out += token[pos++];
        }
      }
      token = std::move(out);
    }
  }

 private:
  std::string replacement_;
  bool strip_first_;
};

class ReplaceDetokenizer final : public Detokenizer {
 public:
  ReplaceDetokenizer(const std::string& pattern, std::string content)
      : regex_(pattern), content_(std::move(content)) {}
  void decode_chain(std::vector<std::string>& tokens) const override {
    for (std::string& token : tokens) {
      std::string out;
      size_t copied = 0;
      regex_.for_each_match(token, [&](size_t begin, size_t end) {
        out.append(token, copied, begin - copied);
        out += content_;
        copied = end;
      });
      out.append(token, copied);
      token = std::move(out);
    }
  }

 private:
  UnicodeRegex regex_;
  std::string content_;
};

// Runs of <0xNN> tokens become the text of their bytes, or one U+FFFD per byte when those bytes
// are not valid UTF-8.
class ByteFallbackDetokenizer final : public Detokenizer {
 public:
  void decode_chain(std::vector<std::string>& tokens) const override {
    std::vector<std::string> out;
    out.reserve(tokens.size());
    std::string pending;
    auto flush = [&] {
      if (pending.empty()) return;
      if (utf8_is_valid(pending)) {
        out.push_back(pending);
      } else {
        for (size_t i = 0; i < pending.size(); ++i) out.emplace_back("\xEF\xBF\xBD");
      }
      pending.clear();
    };
    for (std::string& token : tokens) {
      const int byte = byte_fallback_byte(token);
      if (byte >= 0) {
        pending.push_back(static_cast<char>(byte));
      } else {
        flush();
        out.push_back(std::move(token));
      }
    }
    flush();
    tokens = std::move(out);
  }
};

class FuseDetokenizer final : public Detokenizer {
 public:
  void decode_chain(std::vector<std::string>& tokens) const override {
    std::string joined;
    for (const std::string& token : tokens) joined += token;
    tokens.assign(1, std::move(joined));
  }
};

// Removes up to `start` leading and `stop` trailing copies of one character from every token.
class StripDetokenizer final : public Detokenizer {
 public:
  StripDetokenizer(char32_t content, size_t start, size_t stop) : start_(start), stop_(stop) {
    utf8_append(content_, content);
  }
  void decode_chain(std::vector<std::string>& tokens) const override {
    for (std::string& token : tokens) {
      size_t begin = 0;
      for (size_t i = 0; i < start_ && token.compare(begin, content_.size(), content_) == 0; ++i) {
        begin += content_.size();
      }
      size_t end = token.size();
      for (size_t i = 0; i < stop_ && end >= begin + content_.size() &&
                         token.compare(end - content_.size(), content_.size(), content_) == 0;
           ++i) {
        end -= content_.size();
      }
      token = token.substr(begin, end - begin);
    }
  }

 private:
  std::string content_;
  size_t start_;
  size_t stop_;
};

// Word-final suffixes (like "</w>") become spaces, except after the last token.
class BpeSuffixDetokenizer final : public Detokenizer {
 public:
  explicit BpeSuffixDetokenizer(std::string suffix) : suffix_(std::move(suffix)) {}
  void decode_chain(std::vector<std::string>& tokens) const override {
    for (size_t i = 0; i < tokens.size(); ++i) {
      const std::string_view replacement = i + 1 == tokens.size() ? "" : " ";
      std::string out;
      size_t pos = 0;
      std::string& token = tokens[i];
      while (pos < token.size()) {
        if (!suffix_.empty() && token.compare(pos, suffix_.size(), suffix_) == 0) {
          out += replacement;
          pos += suffix_.size();
        } else {
          out += token[pos++];
        }
      }
      token = std::move(out);
    }
  }

 private:
  std::string suffix_;
};

class SequenceDetokenizer final : public Detokenizer {
 public:
  explicit SequenceDetokenizer(std::vector<std::unique_ptr<Detokenizer>> steps)
      : steps_(std::move(steps)) {}
  void decode_chain(std::vector<std::string>& tokens) const override {
    for (const auto& step : steps_) step->decode_chain(tokens);
  }

 private:
  std::vector<std::unique_ptr<Detokenizer>> steps_;
};

}  // namespace

std::unique_ptr<Detokenizer> Detokenizer::from_json(const nlohmann::json& spec,
                                                    std::string_view source) {
  if (spec.is_null()) return nullptr;
  const std::string type = spec.at("type").get<std::string>();
  if (type == "ByteLevel") return std::make_unique<ByteLevelDetokenizer>();
  if (type == "Metaspace") {
    bool strip_first = spec.value("add_prefix_space", true);
    if (spec.contains("prepend_scheme")) {
      strip_first = spec.at("prepend_scheme").get<std::string>() != "never";
    }
    return std::make_unique<MetaspaceDetokenizer>(
        json_single_char(spec.value("replacement", nlohmann::json("\u2581")), "replacement",
                         source),
        strip_first);
  }
  if (type == "Replace") {
    return std::make_unique<ReplaceDetokenizer>(pattern_to_regex(spec.at("pattern"), source),
                                                spec.at("content").get<std::string>());
  }
  if (type == "ByteFallback") return std::make_unique<ByteFallbackDetokenizer>();
  if (type == "Fuse") return std::make_unique<FuseDetokenizer>();
  if (type == "Strip") {
    return std::make_unique<StripDetokenizer>(
        json_single_char(spec.at("content"), "content", source), spec.value("start", size_t{0}),
        spec.value("stop", size_t{0}));
  }
  if (type == "BPEDecoder") {
    return std::make_unique<BpeSuffixDetokenizer>(spec.value("suffix", std::string("</w>")));
  }
  if (type == "Sequence") {
    std::vector<std::unique_ptr<Detokenizer>> steps;
    for (const auto& step : spec.at("decoders")) {
      if (auto decoder = from_json(step, source)) steps.push_back(std::move(decoder));
    }
    return std::make_unique<SequenceDetokenizer>(std::move(steps));
  }
  fail("{}: unsupported decoder type '{}'", source, type);
}

}  // namespace dspark
