// Self-distillation data for training a DSpark head (docs/training.md): the target answers each
// prompt with dspark's plain decoding, then one forward over prompt + answer records, for every
// position, the target's taps and its next-token distribution.
//
//   dspark_tool_taps SCRIPT.json OUT_STEM
//
// SCRIPT.json: {"model": DIR, "taps": [layer ids], "top_k": K, "max_tokens": N,
//   "prompts": [{"id": str, "text": str | "ids": [...], "temperature": T, "seed": S}],
//   "concurrency": C (optional, default 1)}
// "text" is rendered as one user turn with the model's chat template (as `dspark benchmark`
// does); "ids" are used as they are. Generation stops at the model's end-of-turn ids or after N
// tokens. C prompts at a time are answered together, their decode steps batched into one target
// forward (decode_together, speculative/verify.h); every answer is the one the prompt gets alone
// (the kernels are row invariant and each generation samples from its own seed), only sooner.
// OUT_STEM.json: {"hidden": H, "taps": [...], "top_k": K, "sequences": [{"id", "prompt_tokens",
//   "tokens": prompt + answer ids, "finish": "eos"|"length"}]}
// OUT_STEM.bin, per sequence in order, for its n = len(tokens) rows:
//   taps  float16 [n, len(taps), H]  the residual stream after each tap layer (docs/speculative.md
//                                    §9), the rows a drafter context receives
//   ids   int32   [n, K]             the K most probable next tokens of row i, most probable first
//   probs float32 [n, K]             their probabilities under softmax(logits) at temperature 1
// Both files are written under a temporary name and renamed, so a stem that exists is complete.
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <numeric>

#include "base/error.h"
#include "engine/model_bundle.h"
#include "speculative/verify.h"
#include "tensor/dtype.h"
#include "tool_main.h"

namespace {

using namespace dspark;

std::vector<int32_t> prompt_ids(const ModelBundle& bundle, const nlohmann::json& prompt) {
  if (prompt.contains("ids")) return prompt["ids"].get<std::vector<int32_t>>();
  ChatPrompt chat;
  chat.user = prompt.at("text").get<std::string>();
  return encode_chat_prompt(bundle, chat);
}

// The k most probable tokens of one row and their softmax probabilities.
void top_k_distribution(const float* logits, int64_t vocab, int64_t k, int32_t* ids, float* probs) {
  const float max_logit = *std::max_element(logits, logits + vocab);
  double total = 0.0;
  for (int64_t v = 0; v < vocab; ++v) total += std::exp(static_cast<double>(logits[v] - max_logit));
  std::vector<int32_t> order(static_cast<size_t>(vocab));
  std::iota(order.begin(), order.end(), 0);
  // Ties go to the lower id, as the greedy sampler's argmax does, so ids[0] is the greedy token.
  std::partial_sort(order.begin(), order.begin() + k, order.end(), [&](int32_t a, int32_t b) {
    return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
  });
  for (int64_t i = 0; i < k; ++i) {
    ids[i] = order[i];
    probs[i] =
        static_cast<float>(std::exp(static_cast<double>(logits[order[i]] - max_logit)) / total);
  }
}

int run(const std::string& script_path, const std::string& out_stem) {
  const nlohmann::json script = read_json_file(script_path);
  const auto bundle = load_model_bundle(script.at("model").get<std::string>());
  const Model& model = *bundle->model;
  const std::vector<int> taps = script.at("taps").get<std::vector<int>>();
  const int64_t top_k = script.at("top_k").get<int64_t>();
  const int64_t H = model.hidden_size(), V = model.vocab_size();
  if (taps.empty()) fail("{}: taps must name at least one layer", script_path);
  for (int layer : taps) {
    if (layer < -1 || layer >= model.num_layers()) {
      fail("{}: tap layer {} is outside the target's {} layers", script_path, layer,
           model.num_layers());
    }
  }
  if (top_k < 1 || top_k > V) fail("{}: top_k must be in 1..{}", script_path, V);
  const nlohmann::json& prompts = script.at("prompts");
  const int64_t concurrency = script.value("concurrency", int64_t{1});
  if (concurrency < 1 || concurrency > 64) fail("{}: concurrency must be in 1..64", script_path);
  GenerationConfig base_config;
  base_config.max_tokens = script.at("max_tokens").get<int64_t>();
  base_config.eos_ids = bundle->eos_ids;

  // The answers first, C prompts at a time stepped together.
  std::vector<std::vector<int32_t>> prompt_tokens(prompts.size());
  std::vector<GenerationResult> answers(prompts.size());
  for (size_t i = 0; i < prompts.size(); ++i) prompt_tokens[i] = prompt_ids(*bundle, prompts[i]);
  const TokenCallback keep_going = [](const CommittedToken&) { return true; };
  NoDrafts none;
  FixedCap no_drafts(0);
  const SpeculativeOptions options;
  for (size_t first = 0; first < prompts.size(); first += static_cast<size_t>(concurrency)) {
    const size_t end = std::min(prompts.size(), first + static_cast<size_t>(concurrency));
    std::vector<GenerationConfig> configs(end - first, base_config);
    StatePool pool = model.new_pool(static_cast<int>(end - first));
    std::vector<std::unique_ptr<SequenceDecoder>> decoders;
    std::vector<SequenceDecoder*> together;
    for (size_t i = first; i < end; ++i) {
      GenerationConfig& config = configs[i - first];
      config.sampling.temperature = prompts[i].value("temperature", 0.0f);
      config.sampling.seed = prompts[i].value("seed", uint64_t{0});
      decoders.push_back(std::make_unique<SequenceDecoder>(model, none, no_drafts, options,
                                                           prompt_tokens[i], pool, pool.open(),
                                                           config, keep_going));
      together.push_back(decoders.back().get());
    }
    decode_together(model, pool, together);
    for (size_t i = first; i < end; ++i) answers[i] = decoders[i - first]->result();
  }

  const std::string partial = ".partial-" + std::to_string(::getpid());
  std::ofstream bin(out_stem + ".bin" + partial, std::ios::binary);
  if (!bin) fail("cannot write {}.bin", out_stem);
  nlohmann::json index{{"hidden", H}, {"taps", taps}, {"top_k", top_k}};
  index["sequences"] = nlohmann::json::array();
  for (size_t i = 0; i < prompts.size(); ++i) {
    const nlohmann::json& prompt = prompts[i];
    const std::vector<int32_t>& ids = prompt_tokens[i];
    const GenerationResult& answer = answers[i];
    std::vector<int32_t> tokens = ids;
    tokens.insert(tokens.end(), answer.tokens.begin(), answer.tokens.end());
    const int64_t n = static_cast<int64_t>(tokens.size());

    // One forward over the whole sequence: every row computes in the same order whatever the
    // batch (docs/architecture.md), so these taps and logits are the ones decoding saw.
    ModelState replay = model.new_state();
    std::vector<int64_t> rows(static_cast<size_t>(n));
    std::iota(rows.begin(), rows.end(), 0);
    ForwardOutput output;
    model.forward(tokens.data(), n, replay, rows, taps, output);

    std::vector<uint16_t> half(output.taps.size());
    for (size_t i = 0; i < half.size(); ++i) {
      if (!(std::abs(output.taps[i]) <= 65504.0f)) {
        fail("prompt {}: tap value {} does not fit float16", prompt.value("id", ""),
             output.taps[i]);
      }
      half[i] = f32_to_f16(output.taps[i]);
    }
    std::vector<int32_t> top_ids(static_cast<size_t>(n * top_k));
    std::vector<float> top_probs(top_ids.size());
    for (int64_t r = 0; r < n; ++r) {
      top_k_distribution(output.logits.data() + r * V, V, top_k, top_ids.data() + r * top_k,
                         top_probs.data() + r * top_k);
    }
    bin.write(reinterpret_cast<const char*>(half.data()),
              static_cast<std::streamsize>(half.size() * sizeof(uint16_t)));
    bin.write(reinterpret_cast<const char*>(top_ids.data()),
              static_cast<std::streamsize>(top_ids.size() * sizeof(int32_t)));
    bin.write(reinterpret_cast<const char*>(top_probs.data()),
              static_cast<std::streamsize>(top_probs.size() * sizeof(float)));
    index["sequences"].push_back(
        {{"id", prompt.value("id", "")},
         {"prompt_tokens", ids.size()},
         {"tokens", tokens},
         {"finish", answer.finish_reason == FinishReason::eos ? "eos" : "length"}});
  }
  bin.close();
  if (!bin) fail("writing {}.bin failed", out_stem);
  std::ofstream(out_stem + ".json" + partial) << index.dump();
  std::filesystem::rename(out_stem + ".bin" + partial, out_stem + ".bin");
  std::filesystem::rename(out_stem + ".json" + partial, out_stem + ".json");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return dspark::tools::run_with_two_paths(argc, argv, "dspark_tool_taps SCRIPT.json OUT_STEM",
                                           run);
}
