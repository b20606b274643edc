#pragma once
// Incremental decoding for generation: feed token ids one at a time and get back only text that
// is final. Text is held back while it ends in an unfinished UTF-8 character (which the decoder
// shows as U+FFFD), so no chunk ever carries half a character. Each step decodes the new tokens
// together with the tokens of the previous step, so decoders that look at neighbours (Metaspace's
// leading space, byte fallback runs, byte-level characters split over tokens) give the same text
// as decoding everything at once.
#include <cstdint>
#include <string>
#include <unordered_set>
#include <vector>

#include "text/tokenizer.h"

namespace dspark {

class StreamingDetokenizer {
 public:
  // With skip_special_tokens, special added tokens are left out of the text (HF's decode with
  // skip_special_tokens), except those spelling one of `kept_special`: markers an output parser
  // reads, such as a <think> a tokenizer marks special.
  StreamingDetokenizer(const Tokenizer& tokenizer, bool skip_special_tokens,
                       const std::vector<std::string>& kept_special = {});

  // Returns the text that `id` completes (possibly empty).
  std::string push(int32_t id);
  // Whether `id` is a special token this detokenizer leaves out.
  bool skips(int32_t id) const;
  // Returns whatever is still held back, even an unfinished character (as U+FFFD), and resets.
  std::string flush();
  void reset();

 private:
  const Tokenizer& tokenizer_;
  bool skip_special_tokens_;
  std::unordered_set<int32_t> kept_special_;
  std::vector<int32_t> context_;  // tokens of the last step that produced text
  std::string context_text_;      // their decoding, already emitted
  std::vector<int32_t> pending_;  // tokens whose text is not out yet
};

}  // namespace dspark
