// A GGUF file from untrusted bytes: the header, every metadata key/value (strings, arrays,
// nested arrays), the tensor infos and their offsets; then the tokenizer the converter would
// build from that metadata, encoding and decoding a short text.
#include <cstdint>

#include "base/error.h"
#include "convert/gguf_tokenizer.h"
#include "formats/gguf.h"
#include "fuzz_input.h"
#include "text/tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto path = dspark::fuzz::scratch_dir() / "model.gguf";
  dspark::fuzz::write_file(path, dspark::fuzz::as_text(data, size));
  try {
    const dspark::GgufFile gguf(path.string());
    for (const auto& tensor : gguf.tensors()) {
      // Accepted tensor data must lie inside the file: touch its first and last byte.
      if (tensor.nbytes > 0) {
        volatile uint8_t edge = tensor.data[0] ^ tensor.data[tensor.nbytes - 1];
        (void)edge;
      }
      (void)tensor.numel();
    }
    const dspark::Tokenizer tokenizer =
        dspark::Tokenizer::from_gguf_metadata(dspark::gguf_tokenizer_data(gguf));
    const std::vector<int32_t> ids =
        tokenizer.encode("Hello world, <|im_start|>caf\xc3\xa9!", true);
    (void)tokenizer.decode(ids, false);
  } catch (const dspark::Error&) {
  }
  return 0;
}
