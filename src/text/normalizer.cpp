#include "text/normalizer.h"

#include <nlohmann/json.hpp>
#include <vector>

#include "base/error.h"
#include "text/tokenizer_json.h"
#include "text/unicode_normalization.h"
#include "text/unicode_properties.h"
#include "text/unicode_regex.h"
#include "text/utf8.h"

namespace dspark {
namespace {

class UnicodeFormNormalizer final : public Normalizer {
 public:
  explicit UnicodeFormNormalizer(NormalizationForm form) : form_(form) {}
  std::string normalize(std::string_view text) const override {
    return unicode_normalize(text, form_);
  }

 private:
  NormalizationForm form_;
};

class LowercaseNormalizer final : public Normalizer {
 public:
  std::string normalize(std::string_view text) const override { return unicode_lowercase(text); }
};

class PrependNormalizer final : public Normalizer {
 public:
  explicit PrependNormalizer(std::string prefix) : prefix_(std::move(prefix)) {}
  std::string normalize(std::string_view text) const override {
    if (text.empty()) return {};
    std::string out = prefix_;
    out += text;
    return out;
  }

 private:
  std::string prefix_;
};

class ReplaceNormalizer final : public Normalizer {
 public:
  ReplaceNormalizer(const std::string& pattern, std::string content)
      : regex_(pattern), content_(std::move(content)) {}
  std::string normalize(std::string_view text) const override {
    std::string out;
    out.reserve(text.size());
    size_t copied = 0;
    regex_.for_each_match(text, [&](size_t begin, size_t end) {
      out.append(text.substr(copied, begin - copied));
      out += content_;
      copied = end;
    });
    out.append(text.substr(copied));
    return out;
  }

 private:
  UnicodeRegex regex_;
  std::string content_;
};

class StripNormalizer final : public Normalizer {
 public:
  StripNormalizer(bool left, bool right) : left_(left), right_(right) {}
  std::string normalize(std::string_view text) const override {
    size_t begin = 0;
    size_t end = text.size();
    char32_t cp;
    if (left_) {
      while (begin < end) {
        const size_t length = utf8_decode(text, begin, &cp);
        if (length == 0 || !unicode_is_white_space(cp)) break;
        begin += length;
      }
    }
    if (right_) {
      while (end > begin) {
        size_t start = end - 1;
        while (start > begin && (static_cast<uint8_t>(text[start]) & 0xC0) == 0x80) --start;
        if (utf8_decode(text, start, &cp) == 0 || !unicode_is_white_space(cp)) break;
        end = start;
      }
    }
    return std::string(text.substr(begin, end - begin));
  }

 private:
  bool left_;
  bool right_;
};

class SequenceNormalizer final : public Normalizer {
 public:
  explicit SequenceNormalizer(std::vector<std::unique_ptr<Normalizer>> steps)
      : steps_(std::move(steps)) {}
  std::string normalize(std::string_view text) const override {
    std::string current(text);
    for (const auto& step : steps_) current = step->normalize(current);
    return current;
  }

 private:
  std::vector<std::unique_ptr<Normalizer>> steps_;
};

}  // namespace

std::unique_ptr<Normalizer> Normalizer::from_json(const nlohmann::json& spec,
                                                  std::string_view source) {
  if (spec.is_null()) return nullptr;
  const std::string type = spec.at("type").get<std::string>();
  if (type == "NFC") return std::make_unique<UnicodeFormNormalizer>(NormalizationForm::kNfc);
  if (type == "NFD") return std::make_unique<UnicodeFormNormalizer>(NormalizationForm::kNfd);
  if (type == "NFKC") return std::make_unique<UnicodeFormNormalizer>(NormalizationForm::kNfkc);
  if (type == "NFKD") return std::make_unique<UnicodeFormNormalizer>(NormalizationForm::kNfkd);
  if (type == "Lowercase") return std::make_unique<LowercaseNormalizer>();
  if (type == "Prepend") {
    return std::make_unique<PrependNormalizer>(spec.at("prepend").get<std::string>());
  }
  if (type == "Replace") {
    return std::make_unique<ReplaceNormalizer>(pattern_to_regex(spec.at("pattern"), source),
                                               spec.at("content").get<std::string>());
  }
  if (type == "Strip") {
    return std::make_unique<StripNormalizer>(spec.value("strip_left", true),
                                             spec.value("strip_right", true));
  }
  if (type == "Sequence") {
    std::vector<std::unique_ptr<Normalizer>> steps;
    for (const auto& step : spec.at("normalizers")) {
      if (auto normalizer = from_json(step, source)) steps.push_back(std::move(normalizer));
    }
    return std::make_unique<SequenceNormalizer>(std::move(steps));
  }
  fail("{}: unsupported normalizer type '{}'", source, type);
}

}  // namespace dspark
