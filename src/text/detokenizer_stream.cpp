#include "text/detokenizer_stream.h"

#include "text/utf8.h"

namespace dspark {
namespace {

constexpr std::string_view kReplacementUtf8 = "\xEF\xBF\xBD";

bool ends_with_replacement(const std::string& text) {
  return text.size() >= kReplacementUtf8.size() &&
         text.compare(text.size() - kReplacementUtf8.size(), kReplacementUtf8.size(),
                      kReplacementUtf8) == 0;
}

// Length of the longest common prefix of a and b that ends on a character boundary of both.
size_t common_prefix(const std::string& a, const std::string& b) {
  size_t length = 0;
  while (length < a.size() && length < b.size() && a[length] == b[length]) ++length;
  while (length > 0 && length < a.size() && (static_cast<uint8_t>(a[length]) & 0xC0) == 0x80) {
    --length;
  }
  return length;
}

}  // namespace

StreamingDetokenizer::StreamingDetokenizer(const Tokenizer& tokenizer, bool skip_special_tokens,
                                           const std::vector<std::string>& kept_special)
    : tokenizer_(tokenizer), skip_special_tokens_(skip_special_tokens) {
  for (const std::string& text : kept_special) {
    if (const auto id = tokenizer.token_to_id(text)) kept_special_.insert(*id);
  }
}

std::string StreamingDetokenizer::push(int32_t id) {
  // Leaving a skipped token out of the window decodes exactly as decode() skipping it would, so
  // the windows below decode with every token they hold.
  if (skips(id)) return {};
  pending_.push_back(id);
  std::vector<int32_t> window = context_;
  window.insert(window.end(), pending_.begin(), pending_.end());
  const std::string text = tokenizer_.decode(window, false);
  if (text.size() <= context_text_.size() || ends_with_replacement(text)) return {};
  // The context decodes to a prefix of the window for every supported decoder; if some decoder
  // ever rewrote it, only the part after the common prefix can still be emitted.
  const size_t emitted = text.compare(0, context_text_.size(), context_text_) == 0
                             ? context_text_.size()
                             : common_prefix(text, context_text_);
  std::string out = text.substr(emitted);
  context_ = std::move(pending_);
  pending_.clear();
  context_text_ = tokenizer_.decode(context_, false);
  return out;
}

bool StreamingDetokenizer::skips(int32_t id) const {
  return skip_special_tokens_ && tokenizer_.is_special(id) && !kept_special_.count(id);
}

std::string StreamingDetokenizer::flush() {
  std::string out;
  if (!pending_.empty()) {
    std::vector<int32_t> window = context_;
    window.insert(window.end(), pending_.begin(), pending_.end());
    const std::string text = tokenizer_.decode(window, false);
    const size_t emitted = text.compare(0, context_text_.size(), context_text_) == 0
                               ? context_text_.size()
                               : common_prefix(text, context_text_);
    if (text.size() > emitted) out = text.substr(emitted);
  }
  reset();
  return out;
}

void StreamingDetokenizer::reset() {
  context_.clear();
  context_text_.clear();
  pending_.clear();
}

}  // namespace dspark
