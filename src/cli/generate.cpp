// `dspark generate`: one answer, streamed to stdout, with a footer of speed and memory figures
// (in the spirit of mlx_lm.generate and mlx-dspark generate).
#include <fmt/format.h>
#include <unistd.h>

#include <iostream>
#include <iterator>
#include <nlohmann/json.hpp>

#include "base/error.h"
#include "base/file_io.h"
#include "base/system_info.h"
#include "base/thread_pool.h"
#include "cli/commands.h"
#include "cli/decode_flags.h"
#include "cli/memory_check.h"
#include "constrain/grammar.h"
#include "constrain/token_constraint.h"
#include "engine/generator.h"
#include "engine/model_bundle.h"
#include "engine/output_text.h"
#include "hub/resolve.h"
#include "speculative/decode.h"
#include "speculative/decode_report.h"
#include "text/tool_call_parser.h"

namespace dspark::cli {
namespace {

struct GenerateOptions {
  std::string model;
  std::string models_dir;
  std::string prompt;
  std::string system;
  int64_t max_tokens = 256;
  float temperature = 0.0f;
  float top_p = 1.0f;
  int top_k = 0;
  float min_p = 0.0f;
  float repetition_penalty = 1.0f;
  float presence_penalty = 0.0f;
  float frequency_penalty = 0.0f;
  uint64_t seed = 0;
  std::string chat_template_config;
  bool no_chat_template = false;
  std::vector<std::string> stop;
  int threads = 0;
  bool ignore_eos = false;
  int64_t reasoning_budget = 0;
  std::string reasoning_budget_message;
  bool json_object = false;
  std::string json_schema;  // a file path or inline JSON
  bool force = false;
  DecodeFlags decode;
};

// --json / --json-schema: the grammar the answer must follow, or none.
std::shared_ptr<const constrain::Grammar> answer_grammar(const GenerateOptions& options) {
  if (options.json_schema.empty()) {
    return options.json_object ? constrain::json_object_grammar() : nullptr;
  }
  const bool inline_json =
      options.json_schema.find_first_of("{[") == 0 || options.json_schema == "true";
  const std::string text = inline_json ? options.json_schema : read_file(options.json_schema);
  nlohmann::ordered_json schema;  // in order: properties come out as the schema lists them
  try {
    schema = nlohmann::ordered_json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    fail("--json-schema: {} is not valid JSON: {}",
         inline_json ? "the schema" : options.json_schema, e.what());
  }
  return constrain::json_schema_grammar(schema);
}

std::vector<int32_t> build_prompt(const ModelBundle& bundle, const GenerateOptions& options) {
  ChatPrompt prompt;
  prompt.system = options.system;
  prompt.user = options.prompt;
  prompt.no_chat_template = options.no_chat_template;
  prompt.special_tokens_in_content = options.decode.special_tokens_in_content;
  if (!options.chat_template_config.empty()) {
    try {
      prompt.template_kwargs = nlohmann::ordered_json::parse(options.chat_template_config);
    } catch (const nlohmann::json::exception& e) {
      fail("--chat-template-config is not valid JSON: {}", e.what());
    }
    if (!prompt.template_kwargs.is_object()) fail("--chat-template-config must be a JSON object");
  }
  return encode_chat_prompt(bundle, prompt);
}

// Distinct experts per routed layer and the busiest expert's share of its layer's choices: a
// trained router spreads a few hundred tokens over nearly every expert, with no expert far above
// the uniform share 1 / experts.
std::string format_routing(const RoutingCounts& routing) {
  std::vector<int64_t> distinct = routing.distinct_per_layer();
  if (distinct.empty()) return "Routing: the model has no routed layers";
  std::sort(distinct.begin(), distinct.end());
  int64_t rows = 0, experts = 0;
  double busiest = 0.0;
  for (size_t l = 0; l < routing.chosen.size(); ++l) {
    const std::vector<int64_t>& counts = routing.chosen[l];
    if (counts.empty()) continue;
    rows = routing.rows[l];
    experts = static_cast<int64_t>(counts.size());
    int64_t total = 0;
    for (int64_t c : counts) total += c;
    busiest =
        std::max(busiest, static_cast<double>(*std::max_element(counts.begin(), counts.end())) /
                              static_cast<double>(total));
  }
  return fmt::format(
      "Routing: {} routed layers, {} rows each: distinct experts per layer min {}, median {}, "
      "max {} of {}; busiest expert {:.1f}% of its layer's choices (uniform {:.1f}%)",
      distinct.size(), rows, distinct.front(), distinct[distinct.size() / 2], distinct.back(),
      experts, 100.0 * busiest, 100.0 / static_cast<double>(experts));
}

void run_generate(const GenerateOptions& options) {
  if (options.threads > 0) set_default_threads(options.threads);
  GenerateOptions resolved = options;
  if (resolved.prompt.empty() || resolved.prompt == "-") {
    if (isatty(STDIN_FILENO)) fail("no --prompt given and nothing on standard input");
    resolved.prompt.assign(std::istreambuf_iterator<char>(std::cin),
                           std::istreambuf_iterator<char>());
  }
  const double load_start = now_seconds();
  cap_options(options.decode);  // a bad --max-draft fails before the model loads
  ResolveOptions resolve;
  resolve.models_dir = options.models_dir;
  auto bundle = load_model_bundle(resolve_model_or_download(options.model, resolve));
  const std::vector<int32_t> prompt = build_prompt(*bundle, resolved);
  const int64_t max_context = bundle->model->max_context();
  if (static_cast<int64_t>(prompt.size()) >= max_context) {
    fail("prompt is too long: {} tokens >= the model's {}-token context", prompt.size(),
         max_context);
  }
  // Before the drafter loads and before any weight is read.
  check_memory_fit(*bundle->model, bundle->name,
                   std::min(max_context, static_cast<int64_t>(prompt.size()) + options.max_tokens),
                   options.force);
  std::string explanation;
  const DecodeSetup setup =
      resolve_decode_flags(options.decode, options.model, options.models_dir, *bundle, explanation);
  fmt::print(stderr, "{}\n", explanation);
  const double load_seconds = now_seconds() - load_start;
  GenerationConfig config;
  config.max_tokens = options.max_tokens;
  if (!options.ignore_eos) config.eos_ids = bundle->eos_ids;
  config.sampling.temperature = options.temperature;
  config.sampling.top_p = options.top_p;
  config.sampling.top_k = options.top_k;
  config.sampling.min_p = options.min_p;
  config.sampling.repetition_penalty = options.repetition_penalty;
  config.sampling.presence_penalty = options.presence_penalty;
  config.sampling.frequency_penalty = options.frequency_penalty;
  config.sampling.seed = options.seed;
  config.reasoning_budget = reasoning_budget_for_prompt(
      *bundle->tokenizer, bundle->chat_template, prompt, options.reasoning_budget,
      options.reasoning_budget_message, bundle->eos_ids);
  if (options.reasoning_budget > 0 && !config.reasoning_budget.enabled())
    fmt::print(stderr, "--reasoning-budget ignored: the chat template has no thinking markers\n");
  if (auto grammar = answer_grammar(options)) {
    config.answer_constraint = answer_constraint_for_prompt(
        constrain::TokenConstraint(std::move(grammar),
                                   constrain::TokenVocabulary::from_tokenizer(*bundle->tokenizer),
                                   config.eos_ids),
        *bundle->tokenizer, bundle->chat_template, prompt);
  }

  // The thinking markers stay in the printed text even where the tokenizer marks them special.
  OutputText text(*bundle->tokenizer, /*skip_special_tokens=*/true,
                  parser_markers(ChatOutputParser::configure(bundle->chat_template, "", {})),
                  options.stop);
  bool stopped_by_string = false;
  StatePool pool = bundle->model->new_pool(1);
  const SequenceId sequence = pool.open();
  // DSPARK_ROUTING_STATS=1: how widely the router spreads this run's tokens over the experts.
  RoutingCounts routing;
  const bool routing_stats = std::getenv("DSPARK_ROUTING_STATS") != nullptr;
  if (routing_stats) bundle->model->set_routing_counts(&routing);
  // A prompt longer than one prefill chunk reports each chunk (long prompts take minutes).
  const double prefill_start = now_seconds();
  const Model::PrefillProgress progress = [&](int64_t done, int64_t rows) {
    const double seconds = now_seconds() - prefill_start;
    const double rate = seconds > 0 ? static_cast<double>(done) / seconds : 0.0;
    fmt::print(stderr, "prefill: {}/{} tokens ({:.0f} %), {:.1f} tokens-per-sec, {:.0f} s left\n",
               done, rows, 100.0 * static_cast<double>(done) / static_cast<double>(rows), rate,
               rate > 0 ? static_cast<double>(rows - done) / rate : 0.0);
  };
  bundle->model->set_prefill_progress(&progress);
  DecodeStats decode_stats;
  auto result = run_generation(
      *bundle->model, prompt, pool, sequence, config, setup,
      [&](const CommittedToken& token) {
        if (std::find(config.eos_ids.begin(), config.eos_ids.end(), token.id) !=
            config.eos_ids.end()) {
          return true;
        }
        const StopStringMatcher::Result shown = text.push(token.id).shown;
        std::fwrite(shown.emit.data(), 1, shown.emit.size(), stdout);
        std::fflush(stdout);
        stopped_by_string = shown.stopped;
        return !shown.stopped;
      },
      &decode_stats);
  bundle->model->set_prefill_progress(nullptr);
  if (!stopped_by_string) {
    const std::string rest = text.finish();
    std::fwrite(rest.data(), 1, rest.size(), stdout);
  }
  std::fputs("\n", stdout);
  std::fflush(stdout);
  const GenerationStats& stats = result.stats;
  fmt::print(stderr, "==========\n");
  fmt::print(stderr, "Model: {} ({}), loaded in {:.2f} s, {} threads\n", bundle->name,
             bundle->model->architecture(), load_seconds, default_pool().num_threads());
  fmt::print(stderr, "{}\n", format_decode_stats(decode_stats, stats));
  if (result.budget_forced)
    fmt::print(stderr, "Reasoning budget of {}: forced the end of thinking\n",
               options.reasoning_budget);
  if (routing_stats) fmt::print(stderr, "{}\n", format_routing(routing));
}

}  // namespace

void add_generate_command(CLI::App& app) {
  auto* command =
      app.add_subcommand("generate", "Generate one answer, streamed, with speed figures");
  auto options = std::make_shared<GenerateOptions>();
  command->add_option(
      "--model,-m", options->model,
      "Model directory or name in the models directory (default: the default model)");
  command->add_option("--models-dir", options->models_dir, "Models directory");
  command->add_option("--prompt,-p", options->prompt,
                      "Prompt text ('-' or omitted: standard input)");
  command->add_option("--system", options->system, "System message");
  command->add_option("--max-tokens", options->max_tokens, "Maximum tokens to generate")
      ->check(CLI::PositiveNumber);
  command->add_option("--temp", options->temperature, "Sampling temperature (0 = greedy)")
      ->check(finite_range(0.0, 100.0));
  command->add_option("--top-p", options->top_p, "Nucleus sampling mass")
      ->check(finite_range(0.0, 1.0));
  command->add_option("--top-k", options->top_k, "Keep the k most likely tokens (0 = off)")
      ->check(CLI::NonNegativeNumber);
  command->add_option("--min-p", options->min_p, "Drop tokens below min_p x the top probability")
      ->check(finite_range(0.0, 1.0));
  command->add_option("--repetition-penalty", options->repetition_penalty, "Repetition penalty")
      ->check(finite_range(0.01, 100.0));
  command->add_option("--presence-penalty", options->presence_penalty, "Presence penalty")
      ->check(finite_range(-2.0, 2.0));
  command->add_option("--frequency-penalty", options->frequency_penalty, "Frequency penalty")
      ->check(finite_range(-2.0, 2.0));
  command->add_option("--seed", options->seed, "Random seed");
  command->add_option("--chat-template-config", options->chat_template_config,
                      "JSON of chat template variables, e.g. '{\"enable_thinking\": false}'");
  command->add_flag("--no-chat-template", options->no_chat_template, "Use the prompt as raw text");
  command->add_option("--stop", options->stop, "Stop string (repeatable)");
  command->add_option("--threads", options->threads, "Worker threads (default: all CPUs)")
      ->check(thread_count());
  command
      ->add_option("--reasoning-budget", options->reasoning_budget,
                   "Thinking tokens before the block is closed for the model (0 = off)")
      ->check(CLI::NonNegativeNumber);
  command->add_option("--reasoning-budget-message", options->reasoning_budget_message,
                      "Text injected before the forced </think> (default: none)");
  command->add_flag("--json", options->json_object,
                    "Constrain the answer to a JSON object (response_format json_object)");
  command->add_option("--json-schema", options->json_schema,
                      "Constrain the answer to JSON following this JSON Schema (a file or inline)");
  command->add_flag("--ignore-eos", options->ignore_eos,
                    "Keep generating past end-of-sequence tokens (for benchmarks)");
  add_force_flag(command, &options->force);
  add_decode_flags(*command, options->decode);
  command->callback([options] { run_generate(*options); });
}

}  // namespace dspark::cli
