#pragma once
// Internal to the model module: one factory per architecture file, used by load_model.
#include <memory>

#include "formats/checkpoint.h"
#include "model/model.h"

namespace dspark {

// nemotron_h.cpp: Mamba-2 + attention + MoE hybrids (MLX and Hugging Face checkpoints).
std::unique_ptr<Model> make_nemotron_h(std::unique_ptr<Checkpoint> checkpoint);
// dense.cpp: llama, qwen2 and qwen3 decoder-only transformers.
std::unique_ptr<Model> make_dense(std::unique_ptr<Checkpoint> checkpoint);

}  // namespace dspark
