// Drives a DSpark or DFlash drafter against its target for the oracle tests.
//
//   dspark_tool_drafter SCRIPT.json OUT.json
//
// SCRIPT.json: {"target": DIR, "drafter": DIR, "kind": "dspark"|"dflash", "bits": 4,
//   "prompt": [ids], "rounds": N, "cap": C, "accept": [k0, k1, ...],
//   "generate": {"max_tokens": N, "cap": C, "temperature": T, "seed": S,
//                "confidence_threshold": X} (optional)}
// Prefill runs the prompt through the target and feeds its taps to the drafter; pending is the
// target's argmax. Each round proposes greedily, records the drafts and logits, then commits
// [pending, first accept[round % len] drafts] through the target (feeding their taps) and takes
// the target's argmax after them as the next pending token ("one_row_at_a_time": true feeds each
// forward's rows to the drafter in separate calls). OUT.json holds every fed row
// ("fed_taps", flat [rows, n_taps * hidden]) and per round the position, pending token, drafts,
// logits (flat [drafts, vocab]) and confidences. With "generate", OUT.json also holds
// "plain" and "speculative": the tokens of run_generation in baseline mode and with the drafter
// (fixed cap), and "rounds_run" / "accepted" of the speculative run. With "grouped": true,
// OUT.json also holds "alone_greedy" / "grouped_greedy" and "alone_sampled" / "grouped_sampled":
// per round a drafter fed that round's context proposing alone, and one fed and proposing with
// all the others (propose_together; the first, greedy, grouped call feeds each one's context from
// a different length on).
#include <fstream>
#include <nlohmann/json.hpp>

#include "base/error.h"
#include "model/model.h"
#include "speculative/decode.h"
#include "speculative/dflash.h"
#include "speculative/dspark.h"
#include "tool_main.h"

namespace {

int run(const std::string& script_path, const std::string& out_path) {
  using namespace dspark;
  const nlohmann::json script = read_json_file(script_path);
  auto target = load_model(script["target"].get<std::string>());
  DrafterLoadOptions options;
  options.bits = script.value("bits", 4);
  const std::string kind = script.value("kind", std::string("dspark"));
  std::unique_ptr<Drafter> drafter;
  std::shared_ptr<const DSparkHead> dspark_head;
  std::shared_ptr<const DFlashHead> dflash_head;
  if (kind == "dspark") {
    dspark_head =
        std::make_shared<DSparkHead>(script["drafter"].get<std::string>(), *target, options);
    drafter = std::make_unique<DSparkDrafter>(dspark_head, 0.0f);
  } else {
    dflash_head =
        std::make_shared<DFlashHead>(script["drafter"].get<std::string>(), *target, options);
    drafter = std::make_unique<DFlashDrafter>(dflash_head);
  }
  const std::vector<int> taps = drafter->tap_layers();
  std::vector<int32_t> committed = script["prompt"].get<std::vector<int32_t>>();
  const std::vector<int> accept = script["accept"].get<std::vector<int>>();
  ModelState state = target->new_state();
  ForwardOutput output;
  nlohmann::json result;
  std::vector<float> fed;
  const bool one_row_at_a_time = script.value("one_row_at_a_time", false);
  auto run_target = [&](const std::vector<int32_t>& rows) {
    const int64_t n = static_cast<int64_t>(rows.size());
    target->forward(rows.data(), n, state, {n - 1}, taps, output);
    if (one_row_at_a_time) {
      const int64_t width = static_cast<int64_t>(taps.size()) * target->hidden_size();
      for (int64_t i = 0; i < n; ++i) {
        drafter->on_target_rows(rows.data() + i, 1, output.taps.data() + i * width);
      }
    } else {
      drafter->on_target_rows(rows.data(), n, output.taps.data());
    }
    fed.insert(fed.end(), output.taps.begin(), output.taps.end());
    committed.push_back(argmax(output.logits.data(), target->vocab_size()));
  };
  run_target(committed);
  SamplingParams sampling;
  Rng rng(0);
  for (int round = 0; round < script["rounds"].get<int>(); ++round) {
    const DraftRequest request{committed, script["cap"].get<int>(), sampling, rng};
    const Draft draft = drafter->propose(request);
    nlohmann::json record;
    record["position"] = committed.size() - 1;
    record["pending"] = committed.back();
    record["drafts"] = draft.tokens;
    if (kind == "dspark") {
      auto* d = static_cast<DSparkDrafter*>(drafter.get());
      record["logits"] = d->last_logits();
      record["confidences"] = d->last_confidences();
      record["survival"] = draft.survival;
    } else {
      record["logits"] = static_cast<DFlashDrafter*>(drafter.get())->last_logits();
    }
    result["rounds"].push_back(record);
    const size_t keep = std::min<size_t>(accept[round % accept.size()], draft.tokens.size());
    std::vector<int32_t> rows{committed.back()};
    rows.insert(rows.end(), draft.tokens.begin(), draft.tokens.begin() + keep);
    committed.insert(committed.end(), draft.tokens.begin(), draft.tokens.begin() + keep);
    run_target(rows);
  }
  result["fed_taps"] = fed;
  if (script.value("grouped", false)) {
    // One drafter per round, fed the rows that round's drafter had; each proposes alone and then
    // all of them together (propose_together), greedy and sampled, with caps that differ.
    auto make_drafter = [&]() -> std::unique_ptr<Drafter> {
      if (kind == "dspark") return std::make_unique<DSparkDrafter>(dspark_head, 0.0f);
      return std::make_unique<DFlashDrafter>(dflash_head);
    };
    auto describe = [&](Drafter& drafter, const Draft& draft) {
      nlohmann::json out{{"drafts", draft.tokens}, {"survival", draft.survival}};
      if (kind == "dspark") {
        const auto& d = static_cast<DSparkDrafter&>(drafter);
        out["logits"] = d.last_logits();
        out["confidences"] = d.last_confidences();
      } else {
        out["logits"] = static_cast<DFlashDrafter&>(drafter).last_logits();
      }
      return out;
    };
    const int max_drafts = kind == "dspark" ? dspark_head->max_drafts() : dflash_head->max_drafts();
    // The lone drafters are fed by on_target_rows; grouped drafter k is fed k rows alone and the
    // rest by its first grouped call (DraftCall::unfed, Drafter::feed_group).
    const int64_t row_floats = static_cast<int64_t>(taps.size()) * target->hidden_size();
    std::vector<std::unique_ptr<Drafter>> alone_members, grouped_members;
    std::vector<std::vector<int32_t>> prefixes;
    for (const nlohmann::json& record : result["rounds"]) {
      const int64_t position = record["position"].get<int64_t>();
      alone_members.push_back(make_drafter());
      alone_members.back()->on_target_rows(committed.data(), position, fed.data());
      grouped_members.push_back(make_drafter());
      // Contexts of different lengths when the grouped call feeds the rest.
      const auto held = static_cast<int64_t>(grouped_members.size()) - 1;
      grouped_members.back()->on_target_rows(committed.data(), held, fed.data());
      prefixes.emplace_back(committed.begin(), committed.begin() + position + 1);
    }
    const size_t count = alone_members.size();
    auto cap_of = [&](size_t k) { return 1 + static_cast<int>(k * 3) % max_drafts; };
    for (const float temperature : {0.0f, 1.0f}) {
      SamplingParams params;
      params.temperature = temperature;
      nlohmann::json alone, grouped;
      std::vector<Rng> rngs;
      for (size_t k = 0; k < count; ++k) rngs.emplace_back(k);
      for (size_t k = 0; k < count; ++k) {
        const Draft draft =
            alone_members[k]->propose(DraftRequest{prefixes[k], cap_of(k), params, rngs[k]});
        alone.push_back(describe(*alone_members[k], draft));
      }
      rngs.clear();
      for (size_t k = 0; k < count; ++k) rngs.emplace_back(k);
      std::vector<DraftCall> calls;
      for (size_t k = 0; k < count; ++k) {
        const int64_t held = grouped_members[k]->context_rows();
        const int64_t unfed = static_cast<int64_t>(prefixes[k].size()) - 1 - held;
        calls.push_back(DraftCall{
            grouped_members[k].get(), DraftRequest{prefixes[k], cap_of(k), params, rngs[k]},
            DrafterRows{committed.data() + held, unfed, fed.data() + held * row_floats}});
      }
      const std::vector<DraftOutcome> outcomes = propose_together(calls);
      for (size_t k = 0; k < count; ++k) {
        if (outcomes[k].error) std::rethrow_exception(outcomes[k].error);
        grouped.push_back(describe(*grouped_members[k], outcomes[k].draft));
      }
      const std::string name = temperature > 0.0f ? "sampled" : "greedy";
      result["alone_" + name] = alone;
      result["grouped_" + name] = grouped;
    }
  }
  if (script.contains("generate")) {
    const nlohmann::json& g = script["generate"];
    GenerationConfig config;
    config.max_tokens = g["max_tokens"].get<int64_t>();
    config.sampling.temperature = g.value("temperature", 0.0f);
    config.sampling.seed = g.value("seed", uint64_t{0});
    const std::vector<int32_t> prompt = script["prompt"].get<std::vector<int32_t>>();
    auto generate = [&](const DecodeSetup& setup, DecodeStats* stats) {
      StatePool pool = target->new_pool(1);
      return run_generation(
                 *target, prompt, pool, pool.open(), config, setup,
                 [](const CommittedToken&) { return true; }, stats)
          .tokens;
    };
    DecodeSetup plain;
    DecodeSetup speculative;
    speculative.options.mode = kind == "dspark" ? DecodeMode::dspark : DecodeMode::dflash;
    speculative.options.max_draft = g["cap"].get<int>();
    const float threshold = g.value("confidence_threshold", 0.0f);
    speculative.drafter = kind == "dspark" ? dspark_drafter_factory(dspark_head, threshold)
                                           : dflash_drafter_factory(dflash_head);
    DecodeStats stats;
    result["plain"] = generate(plain, nullptr);
    result["speculative"] = generate(speculative, &stats);
    result["rounds_run"] = stats.speculative.rounds;
    result["accepted"] = stats.speculative.accepted;
  }
  result["committed"] = committed;
  std::ofstream(out_path) << result.dump();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return dspark::tools::run_with_two_paths(argc, argv, "dspark_tool_drafter SCRIPT.json OUT.json",
                                           run);
}
