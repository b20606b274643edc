#include "speculative/drafter_resolution.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <random>

#include "../model/tiny_checkpoint.h"
#include "base/error.h"
#include "model/model.h"

namespace dspark {
namespace {

namespace fs = std::filesystem;

// A temporary folder tree removed at the end of the test.
class TempTree {
 public:
  TempTree() {
    static int counter = 0;
    root_ = fs::temp_directory_path() / ("dspark_drafter_resolution_" + std::to_string(getpid()) +
                                         "_" + std::to_string(counter++));
    fs::remove_all(root_);
    fs::create_directories(root_);
  }
  ~TempTree() { fs::remove_all(root_); }
  // A directory holding config.json with `config`.
  std::string dir(const std::string& relative, const nlohmann::json& config) const {
    const fs::path path = root_ / relative;
    fs::create_directories(path);
    std::ofstream(path / "config.json") << config.dump(2);
    return path.string();
  }
  fs::path path(const std::string& relative) const { return root_ / relative; }

 private:
  fs::path root_;
};

const nlohmann::json kTargetConfig = {{"model_type", "llama"}};
const nlohmann::json kDSparkConfig = {{"architectures", {"Qwen3DSparkModel"}},
                                      {"model_type", "qwen3"},
                                      {"block_size", 4},
                                      {"target_layer_ids", {0}}};
const nlohmann::json kDFlashConfig = {
    {"architectures", {"DFlashDraftModel"}}, {"model_type", "qwen3"}, {"block_size", 16}};

std::string expect_failure(const std::function<void()>& body) {
  try {
    body();
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "no error thrown";
  return "";
}

TEST(DrafterRegistry, MatchesQuantisationAgnosticallyAndCaseInsensitively) {
  const auto& registry = drafter_registry();
  for (const char* model : {"mlx-community/Qwen3-4B-8bit", "mlx-community/Qwen3-4B-4bit",
                            "/models/qwen3-4b-bf16", "Qwen3-4B", "/models/Qwen34B-MLX/"}) {
    const DrafterRegistryRow* row = find_registry_row(model, registry);
    ASSERT_NE(row, nullptr) << model;
    EXPECT_EQ(row->dspark, "deepseek-ai/dspark_qwen3_4b_block7") << model;
    EXPECT_EQ(row->dflash, "z-lab/Qwen3-4B-DFlash-b16") << model;
  }
  const DrafterRegistryRow* nemotron =
      find_registry_row("mlx-community/NVIDIA-Nemotron-3.5-Lightning-30B-A3B-4bit", registry);
  ASSERT_NE(nemotron, nullptr);
  EXPECT_EQ(nemotron->dspark, "mlx-community/NVIDIA-Nemotron-3.5-Lightning-30B-A3B-DSpark-bf16");
  ASSERT_NE(find_registry_row("mlx-community/Qwen3-14B-8bit", registry), nullptr);
  EXPECT_EQ(find_registry_row("mlx-community/Qwen3-14B-8bit", registry)->target, "qwen3-14b");
  EXPECT_EQ(find_registry_row("SmolLM2-135M-Instruct", registry), nullptr);
  // The basename only: an org or folder named like a target does not match.
  EXPECT_EQ(find_registry_row("/data/qwen3-4b/SmolLM2-135M-Instruct", registry), nullptr);
}

TEST(DrafterRegistry, LongestIdWins) {
  const std::vector<DrafterRegistryRow> registry = {{"qwen3", "org/short", "", {}},
                                                    {"qwen3-4b-instruct", "org/long", "", {}},
                                                    {"qwen3-4b", "org/mid", "", {}}};
  EXPECT_EQ(find_registry_row("Qwen3-4B-Instruct-2507-4bit", registry)->dspark, "org/long");
  EXPECT_EQ(find_registry_row("Qwen3-4B-8bit", registry)->dspark, "org/mid");
  EXPECT_EQ(find_registry_row("Qwen3-1.7B-8bit", registry)->dspark, "org/short");
}

TEST(DrafterResolution, ExplicitModesWithoutDrafters) {
  TempTree tree;
  DrafterCliOptions options;
  options.model_dir = tree.dir("models/Target-4bit", kTargetConfig);
  options.models_dir = tree.path("models").string();
  for (const char* mode : {"baseline", "lookup"}) {
    options.mode = mode;
    const DrafterChoice choice = resolve_drafter(options);
    EXPECT_EQ(decode_mode_name(choice.mode), std::string(mode));
    EXPECT_TRUE(choice.drafter_dir.empty());
  }
  options.mode = "auto";
  const DrafterChoice automatic = resolve_drafter(options);
  EXPECT_EQ(automatic.mode, DecodeMode::lookup);
  EXPECT_NE(automatic.reason.find("lookup"), std::string::npos) << automatic.reason;

  options.mode = "dspark";
  const std::string message = expect_failure([&] { resolve_drafter(options); });
  EXPECT_NE(message.find("no built-in dspark drafter is registered for Target-4bit"),
            std::string::npos)
      << message;
  EXPECT_NE(message.find("pass --drafter"), std::string::npos) << message;
  EXPECT_NE(message.find("--mode auto/lookup"), std::string::npos) << message;
  options.mode = "turbo";
  EXPECT_NE(expect_failure([&] { resolve_drafter(options); }).find("'turbo'"), std::string::npos);
  options.mode = "lookup";
  options.drafter = tree.dir("Target-DSpark", kDSparkConfig);
  EXPECT_NE(expect_failure([&] { resolve_drafter(options); }).find("--drafter needs"),
            std::string::npos);
}

TEST(DrafterResolution, GivenDrafterDirectoriesAndTheirFamily) {
  TempTree tree;
  DrafterCliOptions options;
  options.model_dir = tree.dir("Target-4bit", kTargetConfig);
  options.drafter = tree.dir("some/dflash-head", kDFlashConfig);
  const DrafterChoice automatic = resolve_drafter(options);
  EXPECT_EQ(automatic.mode, DecodeMode::dflash);
  EXPECT_EQ(automatic.drafter_dir, options.drafter);
  options.mode = "dspark";
  EXPECT_NE(expect_failure([&] { resolve_drafter(options); }).find("is a dflash drafter"),
            std::string::npos);
  options.mode = "auto";
  options.drafter = tree.path("nowhere").string();
  EXPECT_NE(expect_failure([&] { resolve_drafter(options); }).find("neither a drafter directory"),
            std::string::npos);
  fs::create_directories(tree.path("empty"));
  options.drafter = tree.path("empty").string();
  EXPECT_NE(expect_failure([&] { resolve_drafter(options); }).find("no config.json"),
            std::string::npos);
  // A repo id goes through the hub.
  options.drafter = "org/Head-DSpark";
  const std::string snapshot = tree.dir("cache/snapshot", kDSparkConfig);
  options.hub.find_repo = [&](const std::string& id) -> std::optional<std::string> {
    EXPECT_EQ(id.find(tree.path("").string()), std::string::npos) << "a path went to the hub";
    if (id == "org/Head-DSpark") return snapshot;
    return std::nullopt;
  };
  const DrafterChoice from_hub = resolve_drafter(options);
  EXPECT_EQ(from_hub.mode, DecodeMode::dspark);
  EXPECT_EQ(from_hub.drafter_dir, snapshot);
  // Paths are never taken for repo ids.
  options.drafter = tree.path("missing/head").string();
  EXPECT_NE(expect_failure([&] { resolve_drafter(options); }).find("neither a drafter directory"),
            std::string::npos);
  options.drafter = "org/Missing";
  EXPECT_NE(expect_failure([&] { resolve_drafter(options); }).find("org/Missing"),
            std::string::npos);
}

TEST(DrafterResolution, DiscoversDraftersByNameBesideTheModelAndInTheModelsDir) {
  TempTree tree;
  DrafterCliOptions options;
  options.model_dir = tree.dir("elsewhere/Target-4bit", kTargetConfig);
  options.models_dir = tree.path("models").string();
  tree.dir("models/Target-DSparkling", kDSparkConfig);  // not "<stem>-DSpark" nor "-DSpark-..."
  tree.dir("models/Other-DSpark", kDSparkConfig);
  EXPECT_EQ(resolve_drafter(options).mode, DecodeMode::lookup);

  const std::string dflash = tree.dir("models/target-dflash-b16", kDFlashConfig);
  DrafterChoice choice = resolve_drafter(options);
  EXPECT_EQ(choice.mode, DecodeMode::dflash);
  EXPECT_EQ(choice.drafter_dir, dflash);

  // DSpark comes before DFlash in auto, and beside the model before the models directory.
  tree.dir("models/Target-DSpark-bf16", kDSparkConfig);
  const std::string beside = tree.dir("elsewhere/Target-DSpark", kDSparkConfig);
  choice = resolve_drafter(options);
  EXPECT_EQ(choice.mode, DecodeMode::dspark);
  EXPECT_EQ(choice.drafter_dir, beside);
  EXPECT_NE(choice.reason.find(beside), std::string::npos) << choice.reason;
  options.mode = "dflash";
  EXPECT_EQ(resolve_drafter(options).drafter_dir, dflash);

  // A head named after the quantised directory itself comes first.
  const std::string quantised = tree.dir("elsewhere/Target-4bit-DSpark", kDSparkConfig);
  options.mode = "auto";
  EXPECT_EQ(resolve_drafter(options).drafter_dir, quantised);
}

TEST(DrafterResolution, HubCompanionsThenTheRegistry) {
  TempTree tree;
  DrafterCliOptions options;
  options.model = "mlx-community/Qwen3-4B-8bit";
  options.model_dir = tree.dir("hub/snapshots/0123abc", kTargetConfig);
  std::vector<std::string> asked;
  std::map<std::string, std::string> available;
  options.hub.find_repo = [&](const std::string& id) -> std::optional<std::string> {
    asked.push_back(id);
    auto it = available.find(id);
    if (it == available.end()) return std::nullopt;
    return it->second;
  };
  // Nothing obtainable: auto falls back to lookup and says which registered drafters it missed.
  DrafterChoice choice = resolve_drafter(options);
  EXPECT_EQ(choice.mode, DecodeMode::lookup);
  EXPECT_EQ(asked, (std::vector<std::string>{"deepseek-ai/dspark_qwen3_4b_block7",
                                             "z-lab/Qwen3-4B-DFlash-b16"}));
  EXPECT_NE(choice.reason.find("deepseek-ai/dspark_qwen3_4b_block7"), std::string::npos)
      << choice.reason;
  options.mode = "dflash";
  EXPECT_NE(expect_failure([&] { resolve_drafter(options); }).find("z-lab/Qwen3-4B-DFlash-b16"),
            std::string::npos);

  available["z-lab/Qwen3-4B-DFlash-b16"] = tree.dir("hub/dflash", kDFlashConfig);
  options.mode = "auto";
  choice = resolve_drafter(options);
  EXPECT_EQ(choice.mode, DecodeMode::dflash);
  EXPECT_EQ(choice.drafter_dir, available["z-lab/Qwen3-4B-DFlash-b16"]);

  available["deepseek-ai/dspark_qwen3_4b_block7"] = tree.dir("hub/dspark", kDSparkConfig);
  EXPECT_EQ(resolve_drafter(options).mode, DecodeMode::dspark);

  // A cached companion ("<name>-DSpark...") comes before the registry.
  available["mlx-community/Qwen3-4B-DSpark-bf16"] = tree.dir("hub/companion", kDSparkConfig);
  options.hub.cached_companions = [](const std::string& model, const std::string& marker) {
    if (model == "mlx-community/Qwen3-4B-8bit" && marker == "DSpark") {
      return std::vector<std::string>{"mlx-community/Qwen3-4B-DSpark-bf16"};
    }
    return std::vector<std::string>{};
  };
  EXPECT_EQ(resolve_drafter(options).drafter_dir, available["mlx-community/Qwen3-4B-DSpark-bf16"]);
}

// A DeepSpec DSpark drafter for the tiny nemotron_h target whose Markov head encodes the
// target's greedy bigrams in `sequence` (W2 · W1[prev] puts a large logit on the token that last
// followed `prev`), so its drafts are right where the target's continuation repeats a bigram and
// wrong elsewhere: both the accept and the reject paths run through a real DSpark drafter.
void write_bigram_drafter(testing::TinyCheckpoint& ck, const std::vector<int32_t>& sequence) {
  const int64_t H = 64, V = 96, I = 128, rank = 96;
  ck.config = {{"architectures", {"Qwen3DSparkModel"}},
               {"model_type", "qwen3"},
               {"hidden_size", H},
               {"vocab_size", V},
               {"num_hidden_layers", 1},
               {"intermediate_size", I},
               {"num_attention_heads", 4},
               {"num_key_value_heads", 2},
               {"head_dim", 16},
               {"rms_norm_eps", 1e-6},
               {"rope_theta", 1000000.0},
               {"attention_bias", false},
               {"block_size", 4},
               {"mask_token_id", V - 1},
               {"markov_rank", rank},
               {"markov_head_type", "vanilla"},
               {"enable_confidence_head", false},
               {"confidence_head_with_markov", false},
               {"target_layer_ids", {0, 3}},
               {"num_target_layers", 7}};
  ck.linear("fc", H, 2 * H);
  ck.add("hidden_norm.weight", {H}, 0.1f, 1.0f);
  ck.add("norm.weight", {H}, 0.1f, 1.0f);
  ck.add("layers.0.input_layernorm.weight", {H}, 0.1f, 1.0f);
  ck.add("layers.0.post_attention_layernorm.weight", {H}, 0.1f, 1.0f);
  ck.linear("layers.0.self_attn.q_proj", 64, H);
  ck.linear("layers.0.self_attn.k_proj", 32, H);
  ck.linear("layers.0.self_attn.v_proj", 32, H);
  ck.linear("layers.0.self_attn.o_proj", H, 64);
  ck.add("layers.0.self_attn.q_norm.weight", {16}, 0.1f, 1.0f);
  ck.add("layers.0.self_attn.k_norm.weight", {16}, 0.1f, 1.0f);
  ck.linear("layers.0.mlp.gate_proj", I, H);
  ck.linear("layers.0.mlp.up_proj", I, H);
  ck.linear("layers.0.mlp.down_proj", H, I);
  ck.add("embed_tokens.weight", {V, H}, 1.0f);
  ck.add("lm_head.weight", {V, H}, 0.01f);
  testing::TinyTensor w1{{V, rank}, std::vector<float>(V * rank, 0.0f)};
  testing::TinyTensor w2{{V, rank}, std::vector<float>(V * rank, 0.0f)};
  std::map<int32_t, int32_t> next;
  for (size_t i = 0; i + 1 < sequence.size(); ++i) next[sequence[i]] = sequence[i + 1];
  for (const auto& [prev, follower] : next) {
    w1.data[prev * rank + prev] = 1.0f;
    w2.data[follower * rank + prev] = 50.0f;
  }
  ck.tensors["markov_head.markov_w1.weight"] = std::move(w1);
  ck.tensors["markov_head.markov_w2.weight"] = std::move(w2);
}

TEST(DrafterDecode, GreedyDSparkEqualsPlainAcceptingAndRejectingDrafts) {
  testing::TinyCheckpoint target_checkpoint(41);
  testing::fill_nemotron(target_checkpoint, "M*EMEM-");
  const std::string target_dir = target_checkpoint.write();
  auto target = load_model(target_dir);
  const std::vector<int32_t> prompt = {3, 17, 42, 8, 64, 23, 5, 77};
  GenerationConfig config;
  config.max_tokens = 40;
  auto keep_going = [](const CommittedToken&) { return true; };

  DecodeSetup plain_setup;
  StatePool pool = target->new_pool(1);
  const GenerationResult plain = run_generation(*target, prompt, pool, OwnedSequence(pool).id(),
                                                config, plain_setup, keep_going);
  ASSERT_EQ(plain.tokens.size(), 40u);

  std::vector<int32_t> sequence = prompt;
  sequence.insert(sequence.end(), plain.tokens.begin(), plain.tokens.end());
  testing::TinyCheckpoint drafter_checkpoint(42);
  write_bigram_drafter(drafter_checkpoint, sequence);
  const std::string drafter_dir = drafter_checkpoint.write();
  for (int bits : {0, 4}) {
    for (int cap : {1, 3}) {
      SCOPED_TRACE("bits " + std::to_string(bits) + " cap " + std::to_string(cap));
      DrafterCliOptions options;
      options.drafter = drafter_dir;
      options.model_dir = target_dir;
      options.drafter_bits = bits;
      DecodeOptions decode;
      decode.max_draft = cap;
      std::string explanation;
      const DecodeSetup setup = decode_setup_from_options(*target, decode, options, explanation);
      EXPECT_EQ(setup.options.mode, DecodeMode::dspark);
      // A MoE target leaves the lookup pre-step off unless asked (a dense one has it on: the
      // qwen3 targets of tests/oracle/test_server_drafter.py).
      EXPECT_FALSE(setup.options.lookup_drafts);
      EXPECT_NE(explanation.find("mode dspark: --drafter directory"), std::string::npos)
          << explanation;
      DecodeStats stats;
      const GenerationResult result = run_generation(
          *target, prompt, pool, OwnedSequence(pool).id(), config, setup, keep_going, &stats);
      EXPECT_EQ(result.tokens, plain.tokens);
      EXPECT_GT(stats.speculative.accepted, 0);
      EXPECT_LT(stats.speculative.accepted, stats.speculative.drafted);
      RecordProperty(
          "accepted_of_drafted_bits" + std::to_string(bits) + "_cap" + std::to_string(cap),
          std::to_string(stats.speculative.accepted) + "/" +
              std::to_string(stats.speculative.drafted));
    }
  }
  DrafterCliOptions asked;
  asked.drafter = drafter_dir;
  asked.model_dir = target_dir;
  asked.lookup_drafts = true;
  std::string explanation;
  EXPECT_TRUE(decode_setup_from_options(*target, DecodeOptions{}, asked, explanation)
                  .options.lookup_drafts);
  EXPECT_NE(explanation.find("prompt-lookup drafts tried before the drafter's"), std::string::npos);
  asked.drafter.clear();
  asked.mode = "baseline";
  EXPECT_FALSE(decode_setup_from_options(*target, DecodeOptions{}, asked, explanation)
                   .options.lookup_drafts);
}

}  // namespace
}  // namespace dspark
