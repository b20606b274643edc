#pragma once
// Drafter checkpoints (docs/speculative.md §11.1, §12.1, §13, §14): every DSpark packaging
// (DeepSpec standalone, vLLM speculators, SpecForge, LiquidAI LFM2, NVIDIA's Nemotron head) is
// normalised to one DeepSpec-schema config; z-lab DFlash configs to their own. Weights are bound
// strictly (a missing or unexpected tensor is refused by name) and quantized at load to MLX affine
// `bits`-bit, group 64, bit-identical to mlx.core.quantize.
#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "formats/checkpoint.h"
#include "model/loader.h"
#include "model/model.h"

namespace dspark {

enum class DrafterFamily { dspark, dflash };

// Which packaging a drafter config.json is, or throws saying why it is no drafter we load.
enum class DrafterPackaging { deepspec, speculators, specforge, lfm2, dflash };
const char* drafter_packaging_name(DrafterPackaging packaging);
DrafterPackaging detect_drafter_packaging(const nlohmann::json& config, const std::string& source);

// The qwen3-flavour backbone both drafters share: ctx K/V injection into every layer.
struct BackboneConfig {
  int64_t hidden = 0;
  int64_t layers = 0;
  int64_t heads = 0;
  int64_t kv_heads = 0;
  int64_t head_dim = 0;
  int64_t intermediate = 0;
  int64_t vocab = 0;  // target vocabulary
  float eps = 1e-6f;
  double rope_theta = 1e6;
  int64_t rope_dims = 0;  // rotated dims per head (partial rotary on qwen3_5-native heads)
  bool rope_traditional = false;
  bool attention_bias = false;
  bool gated_q = false;       // q_proj emits [q | gate] per head
  bool offset_norms = false;  // qwen3_5: every RMSNorm weight is stored as w - 1
  bool attention_sinks = false;
  // Per layer: causal inside the block, and the sliding window (0 = none) over absolute
  // positions: a query at q sees keys k with k > q - window.
  std::vector<bool> causal;
  std::vector<int64_t> window;
  std::vector<int> target_layer_ids;
  int64_t block_size = 0;
  int32_t mask_token_id = 0;
  int logits_start = 0;  // first block slot whose hidden state predicts a draft (§11.6)
};

struct DSparkConfig {
  DrafterPackaging packaging = DrafterPackaging::deepspec;
  BackboneConfig backbone;
  int64_t draft_vocab = 0;  // = backbone.vocab unless reduced (then d2t maps draft -> target)
  int64_t markov_rank = 0;
  bool confidence_head = false;
  bool confidence_with_markov = true;
  float logit_softcap = 0.0f;  // 0 = none
};

struct DFlashConfig {
  BackboneConfig backbone;
  float logit_softcap = 0.0f;
};

DSparkConfig read_dspark_config(const nlohmann::json& config, const std::string& source);
DFlashConfig read_dflash_config(const nlohmann::json& config, const std::string& source);

// Throws unless every tap id exists in the target and is not its last layer (§9).
void check_taps_in_target(const BackboneConfig& config, const Model& target,
                          const std::string& source);

// A Linear or Embedding of a drafter, quantized at load when asked; owns what it quantized.
struct DrafterLinear {
  LinearWeights weights;
  std::vector<uint32_t> packed;
  std::vector<uint8_t> scales, biases;
};

// Binds drafter tensors, remembering what was bound so the key set can be checked strictly.
class DrafterTensors {
 public:
  // bits 0 keeps the stored weights; otherwise stored-dense modules whose input width is a
  // multiple of 64 are quantized to `bits` (clamped to >= 2), group 64.
  DrafterTensors(const Checkpoint& checkpoint, int bits);

  bool has(const std::string& name) const { return loader_.has(name); }
  // Throws "<checkpoint>: <what> tensor '<name>' is missing" before any other check, so a
  // renamed fc / hidden_norm / norm / Markov weight is named as such.
  void require(const std::string& name, const std::string& what) const;
  // A module quantized here gets tile values and, unless it is only ever read a row at a time
  // (`lookups_only`: an embedding, Markov W1), tile codes, as load_linear's do.
  std::unique_ptr<DrafterLinear> linear(const std::string& path, int64_t out, int64_t in,
                                        bool quantize = true, bool lookups_only = false);
  std::vector<float> floats(const std::string& name, const std::vector<int64_t>& shape);
  const TensorView& tensor(const std::string& name) { return loader_.tensor(name); }
  // Throws naming the first checkpoint tensor never bound and not in `ignored`.
  void check_all_used(const std::vector<std::string>& ignored) const;
  const std::string& source() const { return checkpoint_.path(); }

 private:
  const Checkpoint& checkpoint_;
  WeightLoader loader_;
  int bits_;
};

}  // namespace dspark
