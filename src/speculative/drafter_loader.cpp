#include "speculative/drafter_loader.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <set>

#include "base/error.h"
#include "kernels/quant.h"

namespace dspark {
namespace {

using nlohmann::json;

constexpr int kGroupSize = 64;
// Drafted blocks are a few to a few dozen tokens; the bound keeps block-sized buffers sane.
constexpr int64_t kMaxBlockSize = 1024;
// Markov heads are low rank (256 in the published drafters).
constexpr int64_t kMaxMarkovRank = 1 << 14;

// An integer JSON value in [min, max]; `name` is how the error names the field.
int64_t bounded_integer(const json& value, const std::string& name, int64_t min, int64_t max,
                        const std::string& source) {
  if (!value.is_number_integer()) fail("{}: field '{}' must be an integer", source, name);
  const bool too_large =
      value.is_number_unsigned() &&
      value.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max());
  const int64_t n = too_large ? std::numeric_limits<int64_t>::max() : value.get<int64_t>();
  if (n < min || n > max) {
    fail("{}: field '{}' is {}; it must be in [{}, {}]", source, name, value.dump(), min, max);
  }
  return n;
}

// A finite JSON number in [min, max].
double bounded_number(const json& value, const std::string& name, double min, double max,
                      const std::string& source) {
  if (!value.is_number() || !std::isfinite(value.get<double>()) || value.get<double>() < min ||
      value.get<double>() > max) {
    fail("{}: field '{}' is {}; it must be a number in [{}, {}]", source, name, value.dump(), min,
         max);
  }
  return value.get<double>();
}

const json* object_field(const json& config, const char* key) {
  auto it = config.find(key);
  return it != config.end() && it->is_object() ? &*it : nullptr;
}

std::string architectures(const json& config) {
  std::string joined;
  auto it = config.find("architectures");
  if (it == config.end() || !it->is_array()) return joined;
  for (const auto& name : *it) {
    if (name.is_string()) joined += name.get<std::string>() + " ";
  }
  return joined;
}

// vLLM speculators: the backbone lives in transformer_layer_config, the taps in
// aux_hidden_state_layer_ids; rewritten into the DeepSpec schema (§13.2).
json translate_speculators(const json& c, const std::string& source) {
  const json* spec = object_field(c, "speculators_config");
  std::string algorithm;
  if (c.contains("speculators_model_type") && c["speculators_model_type"].is_string()) {
    algorithm = c["speculators_model_type"].get<std::string>();
  } else if (spec != nullptr && spec->contains("algorithm") && (*spec)["algorithm"].is_string()) {
    algorithm = (*spec)["algorithm"].get<std::string>();
  }
  if (algorithm != "dspark") {
    fail(
        "{}: a vLLM speculators checkpoint for algorithm '{}': only 'dspark' heads load here "
        "(z-lab DFlash drafters load with --mode dflash)",
        source, algorithm);
  }
  const json* layer = object_field(c, "transformer_layer_config");
  if (layer == nullptr) fail("{}: speculators config has no transformer_layer_config", source);
  if (!c.contains("aux_hidden_state_layer_ids")) {
    fail("{}: speculators config has no aux_hidden_state_layer_ids (the drafter's taps)", source);
  }
  for (const char* key : {"hidden_size", "vocab_size", "num_hidden_layers", "intermediate_size",
                          "num_attention_heads"}) {
    if (!layer->contains(key)) fail("{}: transformer_layer_config.{} is missing", source, key);
  }
  json out = *layer;
  out.erase("layer_types");
  out.erase("sliding_window");
  out.erase("logits_start");
  if (!out.contains("model_type")) out["model_type"] = "qwen3";
  out["target_layer_ids"] = c["aux_hidden_state_layer_ids"];
  for (const char* key :
       {"block_size", "mask_token_id", "markov_rank", "markov_head_type", "enable_confidence_head",
        "confidence_head_with_markov", "final_logit_softcapping", "draft_vocab_size"}) {
    if (c.contains(key)) out[key] = c[key];
  }
  const json types = layer->value("layer_types", json::array());
  bool sliding = false;
  for (const auto& type : types) sliding |= type == "sliding_attention";
  if (sliding && layer->value("use_sliding_window", false) && layer->contains("sliding_window") &&
      !(*layer)["sliding_window"].is_null()) {
    out["sliding_window"] = (*layer)["sliding_window"];
    out["dflash_query_causal"] = !c.value("sliding_window_non_causal", false);
  }
  if (c.value("attention_sink_bias", false)) out["attention_sink_bias"] = true;
  std::optional<int64_t> start;
  const int64_t block = out.value("block_size", int64_t{0});
  if (spec != nullptr && spec->contains("proposal_methods") &&
      (*spec)["proposal_methods"].is_array() && !(*spec)["proposal_methods"].empty()) {
    const json& method = (*spec)["proposal_methods"][0];
    const int64_t tokens = method.value("speculative_tokens", int64_t{0});
    if (tokens > 0 && block > 0 && block - tokens >= 0 && block - tokens < block) {
      start = block - tokens;
    }
  }
  if (!start && c.contains("sample_from_anchor") && c["sample_from_anchor"].is_boolean()) {
    start = c["sample_from_anchor"].get<bool>() ? 0 : 1;
  }
  out["logits_start"] = start.value_or(1);
  return out;
}

int64_t required_integer(const ConfigReader& reader, const char* key, int64_t min, int64_t max) {
  if (!reader.has(key)) {
    fail("{}: drafter config field '{}' is missing (not a DeepSpec-schema drafter)",
         reader.source(), key);
  }
  return reader.integer_in(key, min, max);
}

std::vector<int> read_taps(const json& value, const std::string& source) {
  if (!value.is_array() || value.empty()) fail("{}: target_layer_ids must be a list", source);
  std::vector<int> taps;
  for (const auto& id : value) {
    if (!id.is_number_integer()) fail("{}: target_layer_ids holds {}", source, id.dump());
    taps.push_back(
        static_cast<int>(bounded_integer(id, "target_layer_ids", -1, kMaxConfigLayers, source)));
  }
  if (!std::is_sorted(taps.begin(), taps.end()) ||
      std::adjacent_find(taps.begin(), taps.end()) != taps.end()) {
    fail("{}: target_layer_ids {} must be strictly ascending", source, value.dump());
  }
  return taps;
}

// The fields both drafters read the same way.
void read_backbone_dims(const ConfigReader& r, BackboneConfig& b) {
  b.hidden = required_integer(r, "hidden_size", 1, kMaxConfigHidden);
  b.vocab = required_integer(r, "vocab_size", 1, kMaxConfigVocab);
  b.layers = required_integer(r, "num_hidden_layers", 1, kMaxConfigLayers);
  b.intermediate = required_integer(r, "intermediate_size", 1, kMaxConfigIntermediate);
  b.heads = required_integer(r, "num_attention_heads", 1, kMaxConfigHeads);
  b.kv_heads = r.integer_in("num_key_value_heads", std::min<int64_t>(8, b.heads), 1, b.heads);
  if (!r.has("head_dim") && b.hidden % b.heads != 0) {
    fail(
        "{}: hidden_size {} is not a multiple of num_attention_heads {} (and there is no head_dim)",
        r.source(), b.hidden, b.heads);
  }
  b.head_dim = r.integer_in("head_dim", b.hidden / b.heads, 2, kMaxConfigHeadDim);
  b.eps = static_cast<float>(r.number_above("rms_norm_eps", 1e-6, 0.0, 1.0));
  b.attention_bias = r.flag("attention_bias", false);
  if (b.heads % b.kv_heads != 0) {
    fail("{}: num_attention_heads {} is not a multiple of num_key_value_heads {}", r.source(),
         b.heads, b.kv_heads);
  }
  if (b.head_dim % 2 != 0) fail("{}: head_dim {} must be even", r.source(), b.head_dim);
  double theta = 1e6;
  if (r.has("rope_theta")) {
    theta = r.number_above("rope_theta", theta, 1.0, 1e12);
  } else if (r.has("rope_parameters") && r.raw("rope_parameters").is_object() &&
             r.raw("rope_parameters").contains("rope_theta")) {
    theta = bounded_number(r.raw("rope_parameters")["rope_theta"], "rope_parameters.rope_theta",
                           1.0, 1e12, r.source());
    if (theta == 1.0) fail("{}: rope_parameters.rope_theta must exceed 1", r.source());
  }
  b.rope_theta = theta;
  b.rope_dims = b.head_dim;
  b.causal.assign(b.layers, false);
  b.window.assign(b.layers, 0);
}

// A rope scaling we do not implement must not load silently: it mis-ropes every position.
void refuse_rope_scaling(const ConfigReader& r, const char* key) {
  if (!r.has(key)) return;
  const json& scaling = r.raw(key);
  if (!scaling.is_object()) return;
  const std::string type =
      scaling.value("rope_type", scaling.value("type", std::string("default")));
  if (type != "default") {
    fail("{}: drafter {} type '{}' is not supported (only default RoPE)", r.source(), key, type);
  }
}

// A wrong-typed field read with json::value() throws nlohmann's type_error; at the loader's entry
// points it becomes an error naming the drafter's config (found by fuzz_model_config).
template <class Read>
auto naming_json_errors(const std::string& source, Read&& read) {
  try {
    return read();
  } catch (const json::exception& e) {
    fail("{}: drafter config: {}", source, e.what());
  }
}

}  // namespace

const char* drafter_packaging_name(DrafterPackaging packaging) {
  switch (packaging) {
    case DrafterPackaging::deepspec:
      return "DeepSpec";
    case DrafterPackaging::speculators:
      return "vLLM speculators";
    case DrafterPackaging::specforge:
      return "SpecForge";
    case DrafterPackaging::lfm2:
      return "LiquidAI LFM2";
    case DrafterPackaging::dflash:
      return "z-lab DFlash";
  }
  return "?";
}

static DrafterPackaging detect_drafter_packaging_unchecked(const json& c,
                                                           const std::string& source) {
  if (c.contains("speculators_config") || c.contains("speculators_model_type")) {
    return DrafterPackaging::speculators;
  }
  const json* dflash = object_field(c, "dflash_config");
  // Compared as JSON: a projector_type of another type is simply not SpecForge's (value() would
  // throw on it; found by fuzz_model_config).
  if (dflash != nullptr && dflash->contains("projector_type") &&
      dflash->at("projector_type") == "dspark") {
    return DrafterPackaging::specforge;
  }
  if (!c.contains("block_size")) {
    for (const auto& item : c.items()) {
      if (item.key().rfind("dspark_", 0) == 0) {
        fail(
            "{}: a full target model with an embedded DSpark drafter ({}), not a standalone "
            "drafter checkpoint",
            source, item.key());
      }
    }
  }
  const std::string arch = architectures(c);
  if (arch.find("DSpark") != std::string::npos && !c.contains("target_layer_ids") &&
      dflash != nullptr && dflash->contains("target_layer_ids")) {
    return DrafterPackaging::lfm2;
  }
  if (arch.find("DFlash") != std::string::npos) {
    if (c.contains("markov_rank") && !c["markov_rank"].is_null() && c["markov_rank"] != 0) {
      fail(
          "{}: a DFlash checkpoint with a Markov head (markov_rank {}): DFlash+DSpark hybrids "
          "are not supported",
          source, c["markov_rank"].dump());
    }
    return DrafterPackaging::dflash;
  }
  if (c.contains("target_layer_ids") && c.contains("block_size")) return DrafterPackaging::deepspec;
  fail(
      "{}: not a drafter config: no DeepSpec target_layer_ids/block_size, no speculators_config, "
      "no dflash_config (architectures '{}')",
      source, arch);
}

DrafterPackaging detect_drafter_packaging(const json& c, const std::string& source) {
  return naming_json_errors(source, [&] { return detect_drafter_packaging_unchecked(c, source); });
}

static DSparkConfig read_dspark_config_unchecked(const json& raw, const std::string& source) {
  DSparkConfig d;
  d.packaging = detect_drafter_packaging(raw, source);
  json c = raw;
  switch (d.packaging) {
    case DrafterPackaging::dflash:
      fail("{}: a z-lab DFlash drafter, not a DSpark one (use --mode dflash)", source);
    case DrafterPackaging::speculators:
      c = translate_speculators(raw, source);
      break;
    case DrafterPackaging::specforge:
    case DrafterPackaging::lfm2: {
      const json& nested = raw["dflash_config"];
      for (const char* key : {"target_layer_ids", "mask_token_id", "num_target_layers"}) {
        if (!c.contains(key) && nested.contains(key)) c[key] = nested[key];
      }
      if (d.packaging == DrafterPackaging::specforge) {
        for (const char* key : {"markov_rank", "markov_head_type", "enable_confidence_head",
                                "confidence_head_with_markov"}) {
          if (!c.contains(key) && nested.contains(key)) c[key] = nested[key];
        }
      }
      if (!c.contains("logits_start")) c["logits_start"] = 0;
      break;
    }
    case DrafterPackaging::deepspec:
      break;
  }
  const ConfigReader r(c, source);
  const std::string model_type = r.string("model_type", "");
  if (model_type.find("gemma4") != std::string::npos) {
    fail("{}: gemma4 drafter backbones are not supported (this engine runs no gemma4 target)",
         source);
  }
  if (model_type.find("qwen3") == std::string::npos) {
    fail("{}: unsupported drafter backbone model_type '{}' (supported: qwen3, qwen3_5)", source,
         model_type);
  }
  BackboneConfig& b = d.backbone;
  read_backbone_dims(r, b);
  b.block_size = required_integer(r, "block_size", 1, kMaxBlockSize);
  b.mask_token_id = static_cast<int32_t>(required_integer(r, "mask_token_id", 0, b.vocab - 1));
  if (!r.has("target_layer_ids"))
    fail("{}: drafter config field 'target_layer_ids' is missing", source);
  b.target_layer_ids = read_taps(r.raw("target_layer_ids"), source);
  b.gated_q = r.flag("enable_qwen35_gated_q_proj", false);
  b.offset_norms = model_type == "qwen3_5";
  if (b.gated_q || b.offset_norms) {
    double factor = 1.0;
    if (r.has("rope_parameters") && r.raw("rope_parameters").is_object()) {
      const json& parameters = r.raw("rope_parameters");
      if (parameters.contains("partial_rotary_factor")) {
        factor = bounded_number(parameters["partial_rotary_factor"],
                                "rope_parameters.partial_rotary_factor", 0.0, 1.0, source);
      }
    }
    b.rope_dims = static_cast<int64_t>(static_cast<double>(b.head_dim) * factor);
    if (b.rope_dims < 2 || b.rope_dims % 2 != 0) {
      fail(
          "{}: partial_rotary_factor {} of head_dim {} gives {} rotary dims; need an even number "
          ">= 2",
          source, factor, b.head_dim, b.rope_dims);
    }
  }
  if (d.packaging == DrafterPackaging::specforge) {
    refuse_rope_scaling(r, "rope_parameters");
    refuse_rope_scaling(r, "rope_scaling");
  }
  if (r.has("rope_is_neox_style")) b.rope_traditional = !r.flag("rope_is_neox_style", true);
  const json* dflash = object_field(c, "dflash_config");
  bool causal = r.flag("dflash_query_causal", false);
  if (dflash != nullptr) causal = causal || dflash->value("causal", false);
  b.attention_sinks = r.flag("attention_sink_bias", false);
  int64_t window = 0;
  if (causal || b.attention_sinks || dflash != nullptr) {
    if (r.has("sliding_window") && r.raw("sliding_window").is_number_integer()) {
      window = r.integer_in("sliding_window", 0, kMaxConfigContext);
    } else if (dflash != nullptr && dflash->value("use_swa", false) &&
               dflash->contains("swa_window_size")) {
      window = bounded_integer((*dflash)["swa_window_size"], "dflash_config.swa_window_size", 0,
                               kMaxConfigContext, source);
    }
  }
  b.causal.assign(b.layers, causal);
  b.window.assign(b.layers, window);
  if (r.has("logits_start")) {
    b.logits_start = static_cast<int>(r.integer_in("logits_start", 0, kMaxBlockSize));
  } else if (r.has("sample_from_anchor")) {
    b.logits_start = r.flag("sample_from_anchor", true) ? 0 : 1;
  } else {
    b.logits_start = 0;
  }
  if (b.block_size < 1 || b.logits_start < 0 || b.logits_start >= b.block_size) {
    fail("{}: the slot convention cannot be determined: logits_start {} with block_size {}", source,
         b.logits_start, b.block_size);
  }
  d.draft_vocab = b.vocab;
  if (r.has("draft_vocab_size")) d.draft_vocab = r.integer_in("draft_vocab_size", 1, b.vocab);
  d.markov_rank = r.integer_in("markov_rank", 256, 0, kMaxMarkovRank);
  const std::string markov_type = r.string("markov_head_type", "vanilla");
  if (d.markov_rank > 0 && markov_type != "vanilla") {
    fail("{}: markov_head_type '{}' is not supported (only vanilla)", source, markov_type);
  }
  d.confidence_head = r.flag("enable_confidence_head", true);
  d.confidence_with_markov = r.flag("confidence_head_with_markov", true) && d.markov_rank > 0;
  if (r.has("final_logit_softcapping")) {
    d.logit_softcap = static_cast<float>(bounded_number(
        r.raw("final_logit_softcapping"), "final_logit_softcapping", 0.0, 1e6, source));
  }
  if (r.flag("log_snr_conditioning", false)) {
    fail("{}: log-SNR conditioned (Bonsai GGUF) drafters are not supported", source);
  }
  return d;
}

DSparkConfig read_dspark_config(const json& raw, const std::string& source) {
  return naming_json_errors(source, [&] { return read_dspark_config_unchecked(raw, source); });
}

static DFlashConfig read_dflash_config_unchecked(const json& c, const std::string& source) {
  if (detect_drafter_packaging(c, source) != DrafterPackaging::dflash) {
    fail("{}: not a z-lab DFlash drafter (architectures '{}')", source, architectures(c));
  }
  const ConfigReader r(c, source);
  DFlashConfig d;
  BackboneConfig& b = d.backbone;
  read_backbone_dims(r, b);
  refuse_rope_scaling(r, "rope_scaling");
  const json* nested = object_field(c, "dflash_config");
  auto pick = [&](const char* key) -> const json* {
    if (nested != nullptr && nested->contains(key) && !(*nested)[key].is_null()) {
      return &(*nested)[key];
    }
    if (c.contains(key) && !c[key].is_null()) return &c[key];
    return nullptr;
  };
  for (const char* key : {"selector_rank", "conv_kernel_size"}) {
    if (const json* value = pick(key); value != nullptr && *value != 0) {
      fail("{}: DFlash 2 drafters ({} = {}) are not supported yet", source, key, value->dump());
    }
  }
  const json* block = pick("block_size");
  if (block == nullptr) fail("{}: DFlash config has no block_size", source);
  b.block_size = bounded_integer(*block, "block_size", 2, kMaxBlockSize, source);
  const json* taps = pick("target_layer_ids");
  if (taps == nullptr) fail("{}: DFlash config has no target_layer_ids", source);
  b.target_layer_ids = read_taps(*taps, source);
  const json* mask = pick("mask_token_id");
  b.mask_token_id =
      mask != nullptr
          ? static_cast<int32_t>(bounded_integer(*mask, "mask_token_id", 0, b.vocab - 1, source))
          : 0;
  b.logits_start = 1;
  if (r.has("layer_types")) {
    const json& types = r.raw("layer_types");
    if (!types.is_array() || static_cast<int64_t>(types.size()) != b.layers) {
      fail("{}: layer_types must list {} layers", source, b.layers);
    }
    for (int64_t l = 0; l < b.layers; ++l) {
      if (!types[l].is_string()) fail("{}: layer_types entry {} is not a string", source, l);
      const std::string type = types[l].get<std::string>();
      if (type == "sliding_attention") {
        if (!r.has("sliding_window")) fail("{}: sliding layers without sliding_window", source);
        b.causal[l] = true;
        b.window[l] = r.integer_in("sliding_window", 0, kMaxConfigContext);
      } else if (type != "full_attention") {
        fail("{}: layer_types entry '{}' is not supported", source, type);
      }
    }
  }
  if (const json* cap = pick("final_logit_softcapping"); cap != nullptr) {
    d.logit_softcap =
        static_cast<float>(bounded_number(*cap, "final_logit_softcapping", 0.0, 1e6, source));
  }
  return d;
}

DFlashConfig read_dflash_config(const json& c, const std::string& source) {
  return naming_json_errors(source, [&] { return read_dflash_config_unchecked(c, source); });
}

void check_taps_in_target(const BackboneConfig& config, const Model& target,
                          const std::string& source) {
  for (int id : config.target_layer_ids) {
    if (id < -1 || id >= target.num_layers() - 1) {
      fail(
          "{}: tap layer {} does not exist in the target '{}' ({} layers; the last layer cannot "
          "be a tap)",
          source, id, target.checkpoint().path(), target.num_layers());
    }
  }
  if (config.hidden != target.hidden_size()) {
    fail("{}: drafter hidden_size {} differs from the target's {}", source, config.hidden,
         target.hidden_size());
  }
  if (config.vocab != target.vocab_size()) {
    fail("{}: drafter vocab_size {} differs from the target's {}", source, config.vocab,
         target.vocab_size());
  }
}

DrafterTensors::DrafterTensors(const Checkpoint& checkpoint, int bits)
    : checkpoint_(checkpoint), loader_(checkpoint), bits_(bits <= 0 ? 0 : std::max(bits, 2)) {}

void DrafterTensors::require(const std::string& name, const std::string& what) const {
  if (!loader_.has(name) && !loader_.has(name + ".weight")) {
    fail(
        "{}: the drafter's {} tensor '{}' is missing (a renamed or absent {} gives 0% "
        "acceptance, so the drafter is refused)",
        checkpoint_.path(), what, name, what);
  }
}

std::unique_ptr<DrafterLinear> DrafterTensors::linear(const std::string& path, int64_t out,
                                                      int64_t in, bool quantize,
                                                      bool lookups_only) {
  auto result = std::make_unique<DrafterLinear>();
  result->weights = loader_.linear(path, out, in);
  LinearWeights& w = result->weights;
  if (w.quantized || bits_ == 0 || !quantize || in % kGroupSize != 0) return result;
  const kernels::QuantFormat format{bits_, kGroupSize};
  kernels::check_quant_format(format, path.c_str());
  const DType scale_dtype = w.dense.dtype;
  std::vector<float> dense(static_cast<size_t>(out * in));
  for (int64_t row = 0; row < out; ++row) w.row(row, dense.data() + row * in);
  const int64_t groups = out * (in / kGroupSize);
  result->packed.resize(static_cast<size_t>(out * in * bits_ / 32));
  result->scales.resize(static_cast<size_t>(groups * dtype_size(scale_dtype)));
  result->biases.resize(result->scales.size());
  kernels::quantize(dense.data(), out, in, format, scale_dtype, result->packed.data(),
                    result->scales.data(), result->biases.data());
  w.quantized = true;
  w.quant.packed = reinterpret_cast<const uint8_t*>(result->packed.data());
  w.quant.scales = result->scales.data();
  w.quant.biases = result->biases.data();
  w.quant.scale_dtype = scale_dtype;
  w.quant.experts = 1;
  w.quant.rows = out;
  w.quant.cols = in;
  w.quant.format = format;
  w.dense = {};
  // The originals stay: the products of other ISAs, a tile's mid-tile start and row lookups
  // without tile codes read them. A drafter's matrices are a few MB, so this second copy is
  // small next to the target's.
  pack_tile_layouts(w, !lookups_only);
  return result;
}

std::vector<float> DrafterTensors::floats(const std::string& name,
                                          const std::vector<int64_t>& shape) {
  return loader_.floats(name, shape);
}

void DrafterTensors::check_all_used(const std::vector<std::string>& ignored) const {
  loader_.check_all_used([&](const std::string& name) {
    return std::find(ignored.begin(), ignored.end(), name) != ignored.end();
  });
}

}  // namespace dspark
