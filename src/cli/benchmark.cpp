// `dspark benchmark`: plain decoding against each speculative mode and cap, side by side per
// prompt (the arms of one trial run back to back, so a busy machine slows them alike), over the
// chat, code and math suites of bench/prompts. Reports medians over trials of end-to-end and
// decode tok/s, speed-ups as medians of per-trial ratios, tokens per round, per-slot acceptance,
// peak RSS per generation, the calibrated verify costs and derived cap, and the roofline measured
// in the same run; optionally as JSON and as an SVG chart (PNG too when rsvg-convert exists).
#include <fmt/format.h>
#include <sys/utsname.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <sstream>

#include "base/error.h"
#include "base/system_info.h"
#include "base/thread_pool.h"
#include "cli/benchmark_report.h"
#include "cli/commands.h"
#include "cli/decode_flags.h"
#include "cli/memory_check.h"
#include "engine/model_bundle.h"
#include "engine/sampler.h"
#include "formats/model_store.h"
#include "hub/resolve.h"
#include "kernels/bandwidth.h"
#include "kernels/ops.h"
#include "kernels/quant.h"
#include "speculative/cap.h"
#include "speculative/decode_report.h"
#include "speculative/drafter_resolution.h"
#include "speculative/verify.h"

namespace dspark::cli {
namespace {

constexpr const char* kVersion = "0.1.0";
// The largest draft cap calibrated and derived: a DSpark block of 7.
constexpr int kMaxCap = 7;

struct BenchmarkOptions {
  std::string model;
  std::string models_dir;
  std::string drafter;
  int drafter_bits = 4;  // 0 = as stored
  std::string modes = "dspark,lookup";
  std::string caps = "derived,derived+lookup";
  std::string suites = "chat,code,math";
  std::string prompts_dir;
  int prompts_per_suite = 0;  // 0 = all
  int trials = 3;
  int64_t max_new_tokens = 200;
  float temperature = 0.0f;  // 0 = greedy
  uint64_t seed = 0;
  std::string json_path;
  std::string plot_path;
  int threads = 0;
  bool recalibrate = false;
  bool force = false;
  std::string concurrency;  // e.g. "1,2,4,8": every arm again at each load
};

struct Prompt {
  std::string suite;
  std::string id;
  std::vector<int32_t> tokens;
};

struct Arm {
  std::string label;
  DecodeSetup setup;
  std::string cap_choice;
};

std::vector<std::string> split_list(const std::string& text) {
  std::vector<std::string> items;
  std::stringstream stream(text);
  std::string item;
  while (std::getline(stream, item, ',')) {
    if (!item.empty()) items.push_back(item);
  }
  return items;
}

// bench/prompts beside the build directory of this executable, else under the working directory.
std::filesystem::path find_prompts_dir(const std::string& requested) {
  if (!requested.empty()) return requested;
  std::vector<std::filesystem::path> candidates;
  std::error_code error;
  const auto exe = std::filesystem::read_symlink("/proc/self/exe", error);
  if (!error) {
    candidates.push_back(exe.parent_path().parent_path() / "bench" / "prompts");
    candidates.push_back(exe.parent_path() / "bench" / "prompts");
  }
  candidates.push_back(std::filesystem::current_path() / "bench" / "prompts");
  for (const auto& candidate : candidates) {
    if (std::filesystem::exists(candidate / "chat.jsonl")) return candidate;
  }
  fail(
      "cannot find the benchmark prompts (bench/prompts/chat.jsonl) beside {} or in the working "
      "directory; "
      "pass --prompts DIR",
      error ? std::string("the executable") : exe.string());
}

std::vector<int32_t> render_prompt(const ModelBundle& bundle, const std::string& text) {
  ChatPrompt prompt;
  prompt.user = text;
  return encode_chat_prompt(bundle, prompt);
}

std::vector<Prompt> load_prompts(const ModelBundle& bundle, const std::filesystem::path& dir,
                                 const std::vector<std::string>& suites, int per_suite) {
  std::vector<Prompt> prompts;
  for (const std::string& suite : suites) {
    const std::filesystem::path path = dir / (suite + ".jsonl");
    std::ifstream in(path);
    if (!in) fail("cannot read the {} prompts: {}", suite, path.string());
    std::string line;
    int count = 0;
    for (int line_number = 1; std::getline(in, line); ++line_number) {
      if (line.empty()) continue;
      const nlohmann::json record =
          nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
      if (!record.is_object() || !record.contains("prompt") || !record["prompt"].is_string()) {
        fail("{} line {}: expected an object with a string 'prompt'", path.string(), line_number);
      }
      const std::string id = record.value("id", fmt::format("{}-{}", suite, line_number));
      prompts.push_back({suite, id, render_prompt(bundle, record["prompt"].get<std::string>())});
      if (per_suite > 0 && ++count == per_suite) break;
    }
  }
  return prompts;
}

// Starts a fresh peak-RSS window (Linux: writing 5 to clear_refs resets VmHWM to the current RSS).
void reset_peak_rss() {
  std::ofstream("/proc/self/clear_refs") << "5";
}

std::string os_description() {
  utsname name{};
  if (uname(&name) != 0) return "linux";
  return fmt::format("{} {} {}", name.sysname, name.release, name.machine);
}

// The dspark / dflash rows' drafter: found and loaded the way generate does (--drafter, a
// companion directory, the registry), or the reason there is none.
struct ModelDrafter {
  DecodeMode mode = DecodeMode::dspark;
  DrafterFactory factory;
  std::string directory;
  std::string missing;  // why there is no drafter, when factory is empty
};

ModelDrafter load_model_drafter(const Model& model, const std::string& mode,
                                const BenchmarkOptions& options, const ResolveOptions& resolve,
                                const std::string& model_dir) {
  DrafterCliOptions cli;
  cli.mode = mode;
  cli.drafter = options.drafter;
  cli.drafter_bits = options.drafter_bits;
  cli.model = options.model;
  cli.model_dir = model_dir;
  cli.models_dir = models_dir(options.models_dir);
  cli.hub.find_repo = [&resolve](const std::string& repo_id) {
    return find_or_download_repo(repo_id, resolve.hub, resolve.download);
  };
  cli.hub.cached_companions = [&resolve](const std::string& model_repo, const std::string& marker) {
    return find_cached_companions(model_repo, marker, resolve.hub);
  };
  ModelDrafter drafter;
  drafter.mode = parse_decode_mode(mode);
  try {
    // Only the drafter: the benchmark calibrates it itself (and again under --recalibrate).
    const DrafterChoice choice = resolve_drafter(cli);
    drafter.directory = choice.drafter_dir;
    drafter.factory = load_drafter(model, choice, cli).factory;
  } catch (const Error& e) {
    drafter.missing = e.what();
  }
  return drafter;
}

std::vector<Arm> drafter_arms(const std::string& mode_name, const ModelDrafter& drafter,
                              const std::vector<std::string>& caps, const CostCurves& curves) {
  std::vector<Arm> arms;
  for (const std::string& choice : caps) {
    // "<cap>+lookup": the same cap with the --lookup-drafts pre-step, priced as generate and serve
    // price it (the verify curve with free drafting).
    constexpr std::string_view kLookupSuffix = "+lookup";
    const bool with_lookup = choice.ends_with(kLookupSuffix);
    const std::string cap =
        with_lookup ? choice.substr(0, choice.size() - kLookupSuffix.size()) : choice;
    Arm arm{fmt::format("{} cap={}", mode_name, choice), DecodeSetup{}, choice};
    arm.setup.options.mode = drafter.mode;
    arm.setup.drafter = drafter.factory;
    arm.setup.cap_policy =
        make_cap_policy_factory(curves, kMaxCap, drafter.mode == DecodeMode::dspark);
    if (with_lookup) {
      arm.setup.options.lookup_drafts = true;
      arm.setup.lookup_cap_policy = make_lookup_cap_policy_factory(curves);
    }
    if (cap == "auto") {
      arm.setup.options.auto_cap = true;
    } else if (cap == "derived-all") {
      // The derived cap without the confidence schedule: every drafted token is verified.
      arm.setup.options.confidence_schedule = false;
    } else if (cap != "derived") {
      try {
        arm.setup.options.max_draft = std::stoi(cap);
      } catch (const std::exception&) {
        fail(
            "--caps takes numbers, 'auto', 'derived' or 'derived-all' (each optionally with "
            "'+lookup'), not '{}'",
            choice);
      }
      if (*arm.setup.options.max_draft < 1) {
        fail("--caps values must be at least 1, not {}", choice);
      }
    }
    arms.push_back(std::move(arm));
  }
  return arms;
}

void print_calibration(const std::string& what, const Calibration& calibration, int derived_cap) {
  std::string widths;
  for (size_t w = 0; w < calibration.curves.verify_ms.size(); ++w) {
    widths += fmt::format(" {}:{:.3g}", w + 1, calibration.curves.verify_ms[w]);
  }
  std::string drafts;
  for (size_t c = 0; c < calibration.curves.drafter_ms.size(); ++c) {
    drafts += fmt::format(" {}:{:.3g}", c + 1, calibration.curves.drafter_ms[c]);
  }
  std::string source =
      calibration.from_cache
          ? "measured earlier on this machine and cached; --recalibrate measures again"
          : fmt::format("measured in {:.1f} s", calibration.seconds);
  if (calibration.stale) {
    source += fmt::format(", the cached width-1 verify ({:.3g} ms) took {:.3g} ms now",
                          calibration.stale->cached_ms, calibration.stale->now_ms);
  }
  fmt::print(stderr, "{}: verify ms by width{}{}; overhead {:.3g} ms ({}; derived cap {}{})\n",
             what, widths, drafts.empty() ? "" : "; drafter ms by cap" + drafts,
             calibration.curves.overhead_ms, source, derived_cap,
             derived_cap == 0 ? ": plain steps pay best" : "");
}

void write_file(const std::string& path, const std::string& contents) {
  std::ofstream out(path);
  if (!out) fail("cannot write {}", path);
  out << contents;
  if (!out) fail("cannot write {}", path);
}

// rsvg-convert (librsvg2-bin) renders the chart as PNG beside the SVG when it is installed.
void convert_to_png(const std::string& svg_path) {
  std::string png_path = svg_path;
  if (png_path.size() > 4 && png_path.compare(png_path.size() - 4, 4, ".svg") == 0)
    png_path.resize(png_path.size() - 4);
  png_path += ".png";
  const pid_t child = fork();
  if (child == 0) {
    execlp("rsvg-convert", "rsvg-convert", "-o", png_path.c_str(), svg_path.c_str(),
           static_cast<char*>(nullptr));
    _exit(127);
  }
  int status = 0;
  if (child < 0 || waitpid(child, &status, 0) < 0) return;
  if (WIFEXITED(status) && WEXITSTATUS(status) == 0) {
    fmt::print(stderr, "chart: {}\n", png_path);
  } else if (WIFEXITED(status) && WEXITSTATUS(status) == 127) {
    fmt::print(stderr, "no PNG: rsvg-convert (librsvg2-bin) is not installed\n");
  } else {
    fmt::print(stderr, "no PNG: rsvg-convert failed on {}\n", svg_path);
  }
}

std::vector<int> parse_levels(const std::string& text) {
  std::vector<int> levels;
  for (const std::string& item : split_list(text)) {
    int level = 0;
    try {
      level = std::stoi(item);
    } catch (const std::exception&) {
      fail("--concurrency takes numbers, not '{}'", item);
    }
    if (level < 1 || level > 64) fail("--concurrency values must be in [1, 64], not {}", level);
    if (!levels.empty() && level <= levels.back()) fail("--concurrency values must rise");
    levels.push_back(level);
  }
  return levels;
}

// A rate over plain decoding's rate in the same trial; 0 where plain decoding produced none.
double speedup_over(double rate, double plain_rate) {
  return plain_rate > 0 ? rate / plain_rate : 0.0;
}

// The order in which a trial runs its arms (arm 0 is plain decoding): odd trials run them in
// reverse, so that a machine whose speed drifts within a trial does not favour the arm that
// always runs first; each ratio still divides by plain decoding of the same trial. Trial 0 runs
// plain first, since its tokens are what the other arms are compared with.
std::vector<size_t> arm_order(size_t arms, int trial) {
  std::vector<size_t> order(arms);
  std::iota(order.begin(), order.end(), size_t{0});
  if (trial % 2 == 1) std::reverse(order.begin(), order.end());
  return order;
}

// One arm at one load, as a closed loop of `sequences` clients: every prompt is generated (at
// least `sequences` generations, generation i on prompt i mod |prompts|), at most `sequences` at
// once, stepped together (step_together: one batched target forward a step, as `serve
// --parallel` runs them), and a generation that ends hands its slot to the next. Every load thus
// runs the same generations, so its rates compare with another load's. Returns the aggregate
// tok/s and the steady tok/s while `sequences` generations decode, and fills the step figures
// and whether every generation equals plain decoding of its prompt.
struct LoadRates {
  double all = 0.0;
  double full = 0.0;
};
LoadRates run_load(const Model& model, const std::vector<Prompt>& prompts,
                   const std::vector<std::vector<int32_t>>& plain_tokens, const Arm& arm,
                   const GenerationConfig& config, bool compare_tokens, LoadRun& load) {
  const TokenCallback keep_going = [](const CommittedToken&) { return true; };
  const auto slots = static_cast<size_t>(std::max(load.sequences, 1));
  const size_t total = std::max(slots, prompts.size());
  StatePool pool = model.new_pool(static_cast<int>(slots));
  struct Generation {
    std::unique_ptr<Decoding> decoding;
    SequenceId sequence;
    size_t prompt;
  };
  std::vector<Generation> live;
  std::vector<SequenceDecoder*> decoders;
  size_t admitted = 0;
  int64_t generated = 0, drafted = 0, rounds = 0;
  StepCounters counters;
  const double start = now_seconds();
  try {
    for (;;) {
      for (auto it = live.begin(); it != live.end();) {
        const SequenceDecoder& decoder = it->decoding->decoder();
        if (!decoder.finished()) {
          ++it;
          continue;
        }
        const DecodeStats stats = it->decoding->stats();
        generated += decoder.result().stats.generated_tokens;
        drafted += stats.speculative.drafted;
        rounds += stats.speculative.rounds;
        if (compare_tokens) {
          load.matches_plain =
              load.matches_plain && decoder.result().tokens == plain_tokens[it->prompt];
        }
        const SequenceId sequence = it->sequence;
        it = live.erase(it);
        pool.close(sequence);
      }
      while (live.size() < slots && admitted < total) {
        const size_t prompt = admitted++ % prompts.size();
        const SequenceId sequence = pool.open();
        live.push_back({std::make_unique<Decoding>(model, prompts[prompt].tokens, pool, sequence,
                                                   config, arm.setup, keep_going),
                        sequence, prompt});
      }
      if (live.empty()) break;
      decoders.clear();
      for (const Generation& generation : live) decoders.push_back(&generation.decoding->decoder());
      step_together(model, pool, decoders, &counters, slots);
    }
  } catch (const std::exception& e) {
    fail("{} at {} sequences: {}", arm.label, load.sequences, e.what());
  }
  const double wall = now_seconds() - start;
  load.generations = static_cast<int>(total);
  load.generated_tokens = generated;
  if (counters.steps > 0) {
    load.step_ms = 1000.0 * counters.busy_seconds / static_cast<double>(counters.steps);
    load.sequences_per_step = double(counters.sequence_forwards) / double(counters.steps);
    load.rows_per_step = double(counters.rows) / double(counters.steps);
  }
  load.drafts_per_round = rounds > 0 ? double(drafted) / double(rounds) : 0.0;
  LoadRates rates;
  if (wall > 0) rates.all = static_cast<double>(generated) / wall;
  if (counters.full_seconds > 0) {
    rates.full = static_cast<double>(counters.full_tokens) / counters.full_seconds;
  }
  return rates;
}

void run_benchmark(const BenchmarkOptions& options) {
  if (options.threads > 0) set_default_threads(options.threads);
  if (options.trials < 1) fail("--trials must be at least 1");
  const std::vector<int> levels = parse_levels(options.concurrency);
  BenchmarkReport report;
  report.version = kVersion;
  report.threads = default_pool().num_threads();
  report.device = fmt::format("CPU {} ({}, {} numerics, {} KV cache)", cpu_features().model_name,
                              kernels::isa_name(kernels::best_isa()),
                              kernels::numerics_name(kernels::numerics()),
                              kernels::kv_type_name(kernels::kv_cache_type()));
  report.os = os_description();
  report.trials = options.trials;
  report.max_new_tokens = options.max_new_tokens;
  report.temperature = options.temperature;
  report.seed = options.seed;
  report.suites = split_list(options.suites);
  fmt::print(stderr, "dspark benchmark · {} · {} threads · dspark {} · {} · {}\n", report.device,
             report.threads, kVersion, report.os, report.decoding());

  ResolveOptions resolve;
  resolve.models_dir = options.models_dir;
  const std::string model_dir = resolve_model_or_download(options.model, resolve);
  fmt::print(stderr, "target: {}\nloading + warming up…\n", model_dir);
  auto bundle = load_model_bundle(model_dir);
  const Model& model = *bundle->model;
  report.target = bundle->name;
  const std::vector<Prompt> prompts = load_prompts(*bundle, find_prompts_dir(options.prompts_dir),
                                                   report.suites, options.prompts_per_suite);

  int64_t longest_prompt = 0;
  for (const Prompt& prompt : prompts) {
    longest_prompt = std::max<int64_t>(longest_prompt, static_cast<int64_t>(prompt.tokens.size()));
  }
  check_memory_fit(model, bundle->name,
                   std::min(model.max_context(), longest_prompt + options.max_new_tokens),
                   options.force);

  report.roofline.bytes_per_token = model.decode_weight_bytes();
  report.roofline.bandwidth_1t_gbs = kernels::measure_read_bandwidth_gbs(1);
  report.roofline.bandwidth_all_gbs = kernels::measure_read_bandwidth_gbs(report.threads);
  fmt::print(
      stderr,
      "roofline: {:.1f} MB per token / {:.1f} GB/s read ({:.1f} GB/s one thread) = {:.0f} tok/s\n",
      report.roofline.bytes_per_token / 1e6, report.roofline.bandwidth_all_gbs,
      report.roofline.bandwidth_1t_gbs, report.roofline.ceiling_tok_s());

  CalibrationOptions calibration;
  calibration.mode = "lookup";
  calibration.target_name = bundle->name;
  calibration.use_cache = !options.recalibrate;
  calibration.max_width = kLookupCalibrationWidth;
  report.calibration = calibrate(model, DrafterFactory{}, calibration);
  report.calibration_max_cap = kMaxCap;
  report.derived_cap = derive_cap(report.calibration.curves, kMaxCap);
  print_calibration("target", report.calibration, report.derived_cap);

  // Plain decoding first, then each mode in the order given: lookup with its defaults, model
  // drafters once per cap, priced by their own calibration.
  std::vector<Arm> arms;
  arms.push_back({"baseline", DecodeSetup{}, ""});
  for (const std::string& name : split_list(options.modes)) {
    const DecodeMode mode = parse_decode_mode(name);
    if (mode == DecodeMode::baseline) continue;
    if (mode == DecodeMode::lookup) {
      Arm arm{"lookup", DecodeSetup{}, ""};
      arm.setup.options.mode = mode;
      // Its own ceiling alone; capped under load (--concurrency) as serve caps it.
      arm.setup.cap_policy = make_lookup_cap_policy_factory(report.calibration.curves);
      arms.push_back(std::move(arm));
      continue;
    }
    const ModelDrafter drafter = load_model_drafter(model, name, options, resolve, model_dir);
    if (!drafter.factory) {
      fmt::print(stderr, "{}: skipped ({})\n", name, drafter.missing);
      report.skipped.push_back({name, drafter.missing});
      continue;
    }
    CalibrationOptions with_drafter = calibration;
    with_drafter.max_width = kMaxCap + 1;
    with_drafter.mode = name;
    with_drafter.drafter_name = drafter_calibration_name(drafter.directory);
    with_drafter.drafter_bits = options.drafter_bits;
    if (report.drafter.empty()) report.drafter = drafter.directory;
    report.drafter_bits = options.drafter_bits;
    Calibration measured = calibrate(model, drafter.factory, with_drafter);
    const int derived = derive_cap(measured.curves, kMaxCap);
    print_calibration(
        name + " drafter " + std::filesystem::path(drafter.directory).filename().string(), measured,
        derived);
    for (Arm& arm : drafter_arms(name, drafter, split_list(options.caps), measured.curves)) {
      arms.push_back(std::move(arm));
    }
    report.drafter_calibrations.push_back({name, std::move(measured), derived});
  }

  GenerationConfig config;
  config.eos_ids = bundle->eos_ids;
  config.sampling.temperature = options.temperature;
  config.sampling.seed = options.seed;
  check_sampling_params(config.sampling);
  {
    GenerationConfig warmup = config;
    warmup.max_tokens = std::min<int64_t>(100, options.max_new_tokens);
    StatePool pool = model.new_pool(1);
    run_generation(model, render_prompt(*bundle, "Tell me about the sea."), pool, pool.open(),
                   warmup, DecodeSetup{}, [](const CommittedToken&) { return true; });
  }
  config.max_tokens = options.max_new_tokens;

  report.arms.resize(arms.size());
  for (size_t a = 0; a < arms.size(); ++a) {
    report.arms[a].label = arms[a].label;
    report.arms[a].mode = arms[a].setup.options.mode;
    report.arms[a].cap_choice = arms[a].cap_choice;
  }
  std::vector<std::vector<int32_t>> plain_by_prompt(prompts.size());
  for (size_t p = 0; p < prompts.size(); ++p) {
    const Prompt& prompt = prompts[p];
    for (ArmResult& arm : report.arms) arm.prompts.push_back({prompt.suite, prompt.id, {}});
    std::vector<int32_t>& plain_tokens = plain_by_prompt[p];
    for (int trial = 0; trial < options.trials; ++trial) {
      for (const size_t a : arm_order(arms.size(), trial)) {
        StatePool pool = model.new_pool(1);
        DecodeStats decode;
        reset_peak_rss();
        const GenerationResult result = run_generation(
            model, prompt.tokens, pool, pool.open(), config, arms[a].setup,
            [](const CommittedToken&) { return true; }, &decode);
        const nlohmann::json figures = decode_stats_json(decode, result.stats);
        TrialRun run;
        run.tok_s = figures["tok_s"].get<double>();
        run.decode_tok_s = figures["decode_tok_s"].get<double>();
        run.accept = figures["accept"].get<double>();
        run.generated = result.stats.generated_tokens;
        run.peak_rss_bytes = result.stats.peak_rss_bytes;
        if (a == 0 && trial == 0) plain_tokens = result.tokens;
        run.matches_plain =
            !report.compares_tokens(report.arms[a].mode) || result.tokens == plain_tokens;
        ArmResult& arm = report.arms[a];
        arm.cap = decode.cap;
        arm.prompts.back().trials.push_back(run);
        SpeculativeStats& totals = arm.totals;
        const SpeculativeStats& spec = decode.speculative;
        totals.rounds += spec.rounds;
        totals.plain_steps += spec.plain_steps;
        totals.drafted += spec.drafted;
        totals.accepted += spec.accepted;
        totals.unverified += spec.unverified;
        totals.lookup_rounds += spec.lookup_rounds;
        if (totals.position_verified.size() < spec.position_verified.size()) {
          totals.position_verified.resize(spec.position_verified.size(), 0);
          totals.position_accepted.resize(spec.position_verified.size(), 0);
        }
        for (size_t i = 0; i < spec.position_verified.size(); ++i) {
          totals.position_verified[i] += spec.position_verified[i];
          totals.position_accepted[i] += spec.position_accepted[i];
        }
      }
      const double plain_tok_s = report.arms[0].prompts.back().trials.back().tok_s;
      for (ArmResult& arm : report.arms) {
        TrialRun& run = arm.prompts.back().trials.back();
        run.speedup = speedup_over(run.tok_s, plain_tok_s);
      }
    }
    fmt::print(stderr, "  [{}/{}] {}: plain {:.1f} tok/s", p + 1, prompts.size(), prompt.id,
               report.arms[0].prompts.back().tok_s());
    for (size_t a = 1; a < report.arms.size(); ++a) {
      const PromptResult& result = report.arms[a].prompts.back();
      fmt::print(stderr, " · {} {:.2f}x{}", report.arms[a].label, result.speedup(),
                 result.matches_plain() ? "" : " (OUTPUT DIFFERS)");
    }
    fmt::print(stderr, "\n");
  }

  for (int sequences : levels) {
    fmt::print(stderr, "  {} concurrent generation{}…\n", sequences, sequences == 1 ? "" : "s");
    const size_t first = report.loads.size();
    for (const Arm& arm : arms) {
      LoadRun load;
      load.arm = arm.label;
      load.mode = arm.setup.options.mode;
      load.sequences = sequences;
      if (arm.cap_choice.starts_with("derived")) {
        load.derived_cap = derive_cap(report.calibration_for(arm.setup.options.mode).curves,
                                      kMaxCap, kDerivedCapPrior, 512, sequences);
      }
      report.loads.push_back(std::move(load));
    }
    for (int trial = 0; trial < options.trials; ++trial) {
      std::vector<LoadRates> rates(arms.size());
      for (const size_t a : arm_order(arms.size(), trial)) {
        LoadRun& load = report.loads[first + a];
        rates[a] = run_load(model, prompts, plain_by_prompt, arms[a], config,
                            report.compares_tokens(load.mode), load);
      }
      const LoadRates& plain = rates[0];
      for (size_t a = 0; a < arms.size(); ++a) {
        LoadRun& load = report.loads[first + a];
        load.tok_s.push_back(rates[a].all);
        load.speedup.push_back(speedup_over(rates[a].all, plain.all));
        load.full_tok_s.push_back(rates[a].full);
        load.full_speedup.push_back(speedup_over(rates[a].full, plain.full));
      }
    }
  }

  fmt::print("\n");
  for (const ArmResult& arm : report.arms) fmt::print("{}\n", format_arm(report, arm));
  for (const LoadRun& load : report.loads) fmt::print("{}\n", format_load(load));
  if (!options.json_path.empty()) {
    write_file(options.json_path, report_json(report).dump(2) + "\n");
    fmt::print(stderr, "json: {}\n", options.json_path);
  }
  if (!options.plot_path.empty()) {
    // The charts are SVG files: a name without the suffix gets it, so that the files open as such.
    std::filesystem::path plot = options.plot_path;
    if (plot.extension() != ".svg") plot += ".svg";
    write_file(plot.string(), report_svg(report));
    fmt::print(stderr, "chart: {}\n", plot.string());
    convert_to_png(plot.string());
    if (!report.loads.empty()) {
      std::filesystem::path load_plot = plot;
      load_plot.replace_filename(plot.stem().string() + "-concurrency.svg");
      write_file(load_plot.string(), concurrency_svg(report));
      fmt::print(stderr, "chart: {}\n", load_plot.string());
      convert_to_png(load_plot.string());
    }
  }
}

}  // namespace

void add_benchmark_command(CLI::App& app) {
  auto* command =
      app.add_subcommand("benchmark", "Plain vs speculative decoding, side by side, per suite");
  auto options = std::make_shared<BenchmarkOptions>();
  command->add_option("--model,-m", options->model, "Model (default: the default model)");
  command->add_option("--models-dir", options->models_dir, "Models directory");
  command->add_option("--drafter", options->drafter, "Drafter for the dspark / dflash modes");
  command
      ->add_option("--drafter-bits", options->drafter_bits,
                   "Quantise the drafter to this many bits at load (0 = as stored)")
      ->check(drafter_bits())
      ->capture_default_str();
  command
      ->add_option("--modes", options->modes,
                   "Comma list of lookup, dspark, dflash (plain always runs first)")
      ->capture_default_str();
  command
      ->add_option("--caps", options->caps,
                   "Comma list of caps and/or 'auto', 'derived' (with the confidence schedule), "
                   "'derived-all' (without) for dspark / dflash rows; '+lookup' after one adds "
                   "the --lookup-drafts pre-step (e.g. derived+lookup)")
      ->capture_default_str();
  command->add_option("--suites", options->suites, "Comma list of prompt suites")
      ->capture_default_str();
  command->add_option("--prompts", options->prompts_dir, "Directory of <suite>.jsonl prompt files");
  command
      ->add_option("--prompts-per-suite", options->prompts_per_suite,
                   "Use the first N prompts (0 = all)")
      ->check(CLI::NonNegativeNumber);
  command->add_option("--trials", options->trials, "Runs per prompt and arm (medians reported)")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  command->add_option("--max-new-tokens", options->max_new_tokens, "Tokens per generation")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  command
      ->add_option("--temp", options->temperature,
                   "Sampling temperature of every arm (0 = greedy); speculative arms stay lossless "
                   "in distribution, so their tokens differ from plain decoding's")
      ->check(CLI::NonNegativeNumber);
  command->add_option("--seed", options->seed, "Random seed of the sampled generations");
  command->add_option("--json", options->json_path, "Also write the results as JSON");
  command->add_option("--plot", options->plot_path,
                      "Write an SVG chart to this path (.svg added when missing; a PNG beside it "
                      "when rsvg-convert exists)");
  command->add_option("--threads", options->threads, "Worker threads (default: all CPUs)");
  add_numerics_flags(*command);
  command->add_flag("--recalibrate", options->recalibrate, "Measure verify costs even when cached");
  command->add_option("--concurrency", options->concurrency,
                      "Also run every arm with N generations at once, their forwards batched "
                      "(e.g. 1,2,4,8,16)");
  add_force_flag(command, &options->force);
  command->callback([options] { run_benchmark(*options); });
}

}  // namespace dspark::cli
