// dspark_tool_generate <model dir> <requests.json> <out.json>
// requests.json: {"max_tokens": N, "prompts": [[ids...], ...], "temperature": T (optional, 0 =
// greedy), "seed": S (optional)}. Decodes each prompt with dspark's plain decoding and writes
// {"outputs": [{"tokens": [...], "margins": [...], "logprobs": [...], "distinct_experts": [...]}]},
// where margins[i] is the gap between the best and second-best logit at step i (to tell near-ties
// from real disagreements when comparing against other engines), logprobs[i] the chosen token's
// log-probability, a log-softmax over every logit (null or infinite when any logit of the step is
// not finite), and distinct_experts the number of experts each routed layer chose over the prompt
// and the answer.
#include <algorithm>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>

#include "base/error.h"
#include "formats/checkpoint.h"
#include "speculative/verify.h"

int main(int argc, char** argv) {
  if (argc != 4) {
    std::fprintf(stderr, "usage: dspark_tool_generate <model dir> <requests.json> <out.json>\n");
    return 2;
  }
  try {
    auto model = dspark::load_model(argv[1]);
    const nlohmann::json requests = dspark::read_json_file(argv[2]);
    dspark::GenerationConfig config;
    config.max_tokens = requests.at("max_tokens").get<int64_t>();
    config.sampling.temperature = requests.value("temperature", 0.0f);
    config.sampling.seed = requests.value("seed", uint64_t{0});
    config.sampling.top_logprobs = 2;
    config.logprobs = true;
    nlohmann::json outputs = nlohmann::json::array();
    for (const auto& prompt : requests.at("prompts")) {
      const auto ids = prompt.get<std::vector<int32_t>>();
      dspark::StatePool pool = model->new_pool(1);
      dspark::RoutingCounts routing;
      model->set_routing_counts(&routing);
      nlohmann::json margins = nlohmann::json::array(), logprobs = nlohmann::json::array();
      auto result = dspark::generate_plain(
          *model, ids, pool, pool.open(), config, [&](const dspark::CommittedToken& t) {
            margins.push_back(t.alternatives.size() == 2
                                  ? t.alternatives[0].logprob - t.alternatives[1].logprob
                                  : 0.0f);
            logprobs.push_back(t.logprob);
            return true;
          });
      model->set_routing_counts(nullptr);
      outputs.push_back({{"tokens", result.tokens},
                         {"margins", margins},
                         {"logprobs", logprobs},
                         {"distinct_experts", routing.distinct_per_layer()}});
    }
    std::ofstream(argv[3]) << nlohmann::json{{"outputs", outputs}}.dump();
    return 0;
  } catch (const dspark::Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
