#pragma once
// Writes tokenizer.json and tokenizer_config.json for a GGUF file's embedded tokenizer, so that
// the converted directory loads like any Hugging Face model: by dspark's tokenizer and by HF
// tokenizers / mlx-lm alike. The tokenizer itself is built by text/tokenizer's GGUF path.
#include <nlohmann/json.hpp>
#include <string>

#include "formats/gguf.h"
#include "text/tokenizer.h"

namespace dspark {

// The tokenizer fields of the GGUF metadata; errors name the key at fault.
GgufTokenizerData gguf_tokenizer_data(const GgufFile& gguf);
// The tokenizer_config.json object: chat template, special token strings, add_bos_token.
nlohmann::ordered_json gguf_tokenizer_config(const GgufFile& gguf);
void write_gguf_tokenizer_files(const GgufFile& gguf, const std::string& output_dir);

}  // namespace dspark
