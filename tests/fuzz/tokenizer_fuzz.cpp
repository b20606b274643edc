// tokenizer.json from untrusted bytes (model, normalizer, pre-tokenizer with its regexes, added
// tokens, post-processor, decoder), then a text from untrusted bytes through every path a prompt
// and an answer take: encode with and without special tokens, the marked-content guard, decode,
// the streaming detokenizer and the per-token bytes the grammar vocabulary reads.
// Input: tokenizer.json, a NUL byte, the text.
#include <cstdint>
#include <vector>

#include "base/error.h"
#include "fuzz_input.h"
#include "text/detokenizer_stream.h"
#include "text/tokenizer.h"

namespace {

void check_ids(const dspark::Tokenizer& tokenizer, const std::vector<int32_t>& ids) {
  for (int32_t id : ids) {
    if (id < 0 || id >= tokenizer.vocab_size()) __builtin_trap();  // encode made up an id
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto [json_text, text] = dspark::fuzz::split_at_nul(dspark::fuzz::as_text(data, size));
  try {
    const dspark::Tokenizer tokenizer = dspark::Tokenizer::from_json(json_text, "tokenizer.json");
    const std::vector<int32_t> ids = tokenizer.encode(text, true);
    check_ids(tokenizer, ids);
    check_ids(tokenizer, tokenizer.encode(text, false));
    const std::vector<int32_t> marked =
        tokenizer.encode_marked(tokenizer.mark_special_tokens(text), false);
    check_ids(tokenizer, marked);
    (void)tokenizer.decode(ids, false);
    (void)tokenizer.decode(ids, true);
    dspark::StreamingDetokenizer stream(tokenizer, false);
    for (int32_t id : marked) (void)stream.push(id);
    (void)stream.flush();
    // Ids past the vocabulary and negative ones, as a client's logit_bias or /detokenize sends.
    (void)tokenizer.decode({-1, tokenizer.vocab_size(), 0}, false);
    const int32_t vocab = tokenizer.vocab_size();
    for (int32_t id = 0; id < vocab && id < 4096; ++id) (void)tokenizer.token_bytes(id);
  } catch (const dspark::Error&) {
  }
  return 0;
}
