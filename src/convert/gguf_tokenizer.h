#pragma once
// Writes tokenizer.json and tokenizer_config.json for a GGUF file's embedded tokenizer
// ("gpt2"-model byte-level BPE), so that the converted directory loads like any Hugging Face
// model: by dspark's tokenizer and by HF tokenizers / mlx-lm alike.
#include <nlohmann/json.hpp>
#include <string>

#include "formats/gguf.h"

namespace dspark {

// The tokenizer.json object for the GGUF metadata; errors name the key at fault.
nlohmann::ordered_json gguf_tokenizer_json(const GgufFile& gguf);
// The tokenizer_config.json object: chat template, special token strings, add_bos_token.
nlohmann::ordered_json gguf_tokenizer_config(const GgufFile& gguf);
void write_gguf_tokenizer_files(const GgufFile& gguf, const std::string& output_dir);

}  // namespace dspark
