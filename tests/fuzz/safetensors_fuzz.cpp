// A safetensors file from untrusted bytes: the header length, the JSON header, every tensor's
// dtype, shape and offsets. Whatever the reader accepts must lie inside the file, so the harness
// reads every accepted tensor in full.
#include <cstdint>

#include "base/error.h"
#include "formats/safetensors.h"
#include "fuzz_input.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto path = dspark::fuzz::scratch_dir() / "model.safetensors";
  dspark::fuzz::write_file(path, dspark::fuzz::as_text(data, size));
  try {
    const dspark::SafetensorsFile file(path.string());
    for (const auto& [name, tensor] : file.tensors()) {
      if (static_cast<size_t>(tensor.numel()) * dspark::dtype_size(tensor.dtype) != tensor.nbytes) {
        __builtin_trap();  // the byte count must follow from the dtype and shape
      }
      if (tensor.numel() <= 4096) (void)tensor.to_floats();
    }
  } catch (const dspark::Error&) {
  }
  return 0;
}
