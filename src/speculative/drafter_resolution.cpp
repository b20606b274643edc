#include "speculative/drafter_resolution.h"

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <regex>

#include "base/error.h"
#include "formats/checkpoint.h"
#include "speculative/calibration.h"
#include "speculative/dflash.h"
#include "speculative/drafter_loader.h"
#include "speculative/dspark.h"

namespace dspark {
namespace fs = std::filesystem;
namespace {

std::string lowercase(std::string text) {
  std::transform(text.begin(), text.end(), text.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return text;
}

std::string without_dashes(std::string text) {
  text.erase(std::remove(text.begin(), text.end(), '-'), text.end());
  return text;
}

// The last path or repo-id component, ignoring trailing separators and a "@revision".
std::string basename_of(std::string model) {
  const size_t at = model.find('@');
  if (at != std::string::npos && model.find('/', at) == std::string::npos) model.resize(at);
  while (!model.empty() && model.back() == '/') model.pop_back();
  const size_t slash = model.rfind('/');
  return slash == std::string::npos ? model : model.substr(slash + 1);
}

std::string without_quantization_suffix(std::string name) {
  static const std::regex kSuffix("-(\\d+bit|bf16|fp16|f16|fp8|mxfp4|nvfp4|mlx)$",
                                  std::regex::icase);
  for (std::string stripped = std::regex_replace(name, kSuffix, ""); stripped != name;
       stripped = std::regex_replace(name, kSuffix, "")) {
    name = stripped;
  }
  return name;
}

// "org/name[@revision]": one inner '/', not a path such as /abs/dir or ./dir.
bool looks_like_repo_id(const std::string& text) {
  const size_t slash = text.find('/');
  return slash != std::string::npos && slash > 0 && slash + 1 < text.size() &&
         text.find('/', slash + 1) == std::string::npos && text[0] != '.' && text[0] != '~';
}

bool is_model_dir(const fs::path& dir) {
  std::error_code error;
  return fs::is_directory(dir, error) && fs::is_regular_file(dir / "config.json", error);
}

const char* marker_of(DecodeMode mode) {
  return mode == DecodeMode::dflash ? "DFlash" : "DSpark";
}

// Directories in `parent` named "<stem>-<marker>" or "<stem>-<marker>-...", case-insensitively.
std::vector<std::string> named_drafters(const fs::path& parent, const std::string& stem,
                                        const std::string& marker) {
  std::vector<std::string> found;
  std::error_code error;
  if (stem.empty() || !fs::is_directory(parent, error)) return found;
  const std::string prefix = lowercase(stem) + "-" + lowercase(marker);
  for (const auto& entry : fs::directory_iterator(parent, error)) {
    const std::string name = lowercase(entry.path().filename().string());
    if (name.rfind(prefix, 0) != 0) continue;
    if (name.size() != prefix.size() && name[prefix.size()] != '-') continue;
    if (is_model_dir(entry.path())) found.push_back(entry.path().string());
  }
  std::sort(found.begin(), found.end());
  return found;
}

std::string model_display(const DrafterCliOptions& options) {
  return options.model.empty() ? basename_of(options.model_dir) : options.model;
}

// The names the model goes by: its --model basename and its directory's, each as it is (a head
// made for this quantisation: "X-4bit-DSpark") and without the quantisation ("X-DSpark").
std::vector<std::string> model_stems(const DrafterCliOptions& options) {
  std::vector<std::string> stems;
  for (const std::string& name : {basename_of(options.model), basename_of(options.model_dir)}) {
    for (const std::string& stem : {name, without_quantization_suffix(name)}) {
      if (!stem.empty() && std::find(stems.begin(), stems.end(), stem) == stems.end()) {
        stems.push_back(stem);
      }
    }
  }
  return stems;
}

// A drafter directory named after the model, beside it or in the models directory.
std::optional<std::string> discover_by_name(const DrafterCliOptions& options, DecodeMode mode) {
  std::vector<fs::path> parents;
  if (!options.model_dir.empty()) {
    parents.push_back(fs::path(options.model_dir).lexically_normal().parent_path());
  }
  if (!options.models_dir.empty()) parents.push_back(options.models_dir);
  for (const fs::path& parent : parents) {
    for (const std::string& stem : model_stems(options)) {
      auto found = named_drafters(parent, stem, marker_of(mode));
      if (!found.empty()) return found.front();
    }
  }
  return std::nullopt;
}

std::optional<std::string> cached_companion(const DrafterCliOptions& options, DecodeMode mode) {
  if (!options.hub.cached_companions || !options.hub.find_repo || options.model.empty()) {
    return std::nullopt;
  }
  for (const std::string& repo_id : options.hub.cached_companions(options.model, marker_of(mode))) {
    if (auto dir = options.hub.find_repo(repo_id)) return dir;
  }
  return std::nullopt;
}

DrafterChoice from_given_drafter(const DrafterCliOptions& options,
                                 std::optional<DecodeMode> asked) {
  std::string dir;
  std::string where;
  if (is_model_dir(options.drafter)) {
    dir = options.drafter;
    where = "directory " + dir;
  } else {
    std::error_code error;
    if (fs::exists(options.drafter, error)) {
      fail("--drafter {} is not a drafter directory (it has no config.json)", options.drafter);
    }
    std::optional<std::string> snapshot;
    if (options.hub.find_repo && looks_like_repo_id(options.drafter)) {
      snapshot = options.hub.find_repo(options.drafter);
    }
    if (!snapshot) {
      fail("--drafter {} is neither a drafter directory nor a hub repo that can be had{}",
           options.drafter, options.hub.find_repo ? "" : " (no hub access)");
    }
    dir = *snapshot;
    where = "hub repo " + options.drafter;
  }
  const DecodeMode family = drafter_family(dir);
  if (asked && *asked != family) {
    fail("--mode {} needs a {} drafter, but --drafter {} is a {} drafter", decode_mode_name(*asked),
         decode_mode_name(*asked), options.drafter, decode_mode_name(family));
  }
  return {family, dir, "--drafter " + where};
}

// A drafter of `mode` found locally, in the hub cache, or through the registry row.
std::optional<DrafterChoice> find_drafter(const DrafterCliOptions& options, DecodeMode mode,
                                          const DrafterRegistryRow* row,
                                          std::vector<std::string>& unavailable) {
  if (auto dir = discover_by_name(options, mode)) {
    return DrafterChoice{
        mode, *dir,
        fmt::format("{} drafter {} found beside the model", decode_mode_name(mode), *dir)};
  }
  if (auto dir = cached_companion(options, mode)) {
    return DrafterChoice{
        mode, *dir,
        fmt::format("{} drafter {} found in the hub cache", decode_mode_name(mode), *dir)};
  }
  if (row == nullptr) return std::nullopt;
  const std::string& id = mode == DecodeMode::dflash ? row->dflash : row->dspark;
  if (id.empty()) return std::nullopt;
  std::optional<std::string> dir;
  if (options.hub.find_repo) dir = options.hub.find_repo(id);
  if (!dir) {
    unavailable.push_back(id);
    return std::nullopt;
  }
  return DrafterChoice{mode, *dir, fmt::format("registry drafter {} for '{}'", id, row->target)};
}

std::string unavailable_note(const std::vector<std::string>& unavailable) {
  std::string note;
  for (const std::string& id : unavailable) {
    note += fmt::format("{}registered drafter {} is neither cached nor downloadable",
                        note.empty() ? " (" : "; ", id);
  }
  return note.empty() ? note : note + ")";
}

}  // namespace

const std::vector<DrafterRegistryRow>& drafter_registry() {
  // Targets our engine runs (qwen3, nemotron_h, llama) with published drafters.
  static const std::vector<DrafterRegistryRow> rows = {
      {"qwen3-4b", "deepseek-ai/dspark_qwen3_4b_block7", "z-lab/Qwen3-4B-DFlash-b16", {}},
      {"qwen3-8b", "deepseek-ai/dspark_qwen3_8b_block7", "z-lab/Qwen3-8B-DFlash-b16", {}},
      {"qwen3-14b", "deepseek-ai/dspark_qwen3_14b_block7", "", {}},
      {"nvidia-nemotron-3.5-lightning-30b-a3b",
       "mlx-community/NVIDIA-Nemotron-3.5-Lightning-30B-A3B-DSpark-bf16",
       "",
       {}},
      {"llama-3.1-8b-instruct", "", "z-lab/LLaMA3.1-8B-Instruct-DFlash-UltraChat", {}},
  };
  return rows;
}

const DrafterRegistryRow* find_registry_row(const std::string& model,
                                            const std::vector<DrafterRegistryRow>& registry) {
  const std::string key = lowercase(basename_of(model));
  const std::string dashless_key = without_dashes(key);
  const DrafterRegistryRow* best = nullptr;
  for (const DrafterRegistryRow& row : registry) {
    const std::string id = lowercase(row.target);
    const bool matches = key.find(id) != std::string::npos ||
                         dashless_key.find(without_dashes(id)) != std::string::npos;
    if (matches && (best == nullptr || id.size() > best->target.size())) best = &row;
  }
  return best;
}

DecodeMode drafter_family(const std::string& directory) {
  const nlohmann::json config = read_json_file((fs::path(directory) / "config.json").string());
  return detect_drafter_packaging(config, directory) == DrafterPackaging::dflash
             ? DecodeMode::dflash
             : DecodeMode::dspark;
}

DrafterChoice resolve_drafter(const DrafterCliOptions& options) {
  const std::string mode = lowercase(options.mode);
  if (mode == "baseline" || mode == "lookup") {
    if (!options.drafter.empty())
      fail("--drafter needs --mode auto, dspark or dflash, not {}", mode);
    return {parse_decode_mode(mode), "", "--mode " + mode};
  }
  const std::string model = model_display(options);
  const DrafterRegistryRow* row = nullptr;
  for (const std::string& name : {options.model, options.model_dir}) {
    if (row == nullptr && !name.empty()) row = find_registry_row(name, drafter_registry());
  }
  std::vector<std::string> unavailable;
  if (mode == "dspark" || mode == "dflash") {
    const DecodeMode asked = parse_decode_mode(mode);
    if (!options.drafter.empty()) return from_given_drafter(options, asked);
    if (auto found = find_drafter(options, asked, row, unavailable)) return *found;
    fail(
        "no built-in {} drafter is registered for {}{}; pass --drafter <directory or hub repo id> "
        "or use --mode auto/lookup",
        mode, model, unavailable_note(unavailable));
  }
  if (mode != "auto") {
    fail("--mode must be auto, dspark, dflash, lookup or baseline, not '{}'", options.mode);
  }
  if (!options.drafter.empty()) return from_given_drafter(options, std::nullopt);
  std::vector<DecodeMode> order = {DecodeMode::dspark, DecodeMode::dflash};
  if (row != nullptr && row->mode) order = {*row->mode};
  if (row != nullptr && !row->mode && row->dspark.empty()) order = {DecodeMode::dflash};
  for (DecodeMode candidate : order) {
    if (auto found = find_drafter(options, candidate, row, unavailable)) return *found;
  }
  return {DecodeMode::lookup, "",
          fmt::format("no DSpark or DFlash drafter for {}{}, so drafter-free lookup", model,
                      unavailable_note(unavailable))};
}

LoadedDrafter load_drafter(const Model& target, const DrafterChoice& choice,
                           const DrafterCliOptions& options) {
  if (options.drafter_bits < 0) fail("--drafter-bits must not be negative");
  if (options.confidence_threshold < 0.0f || options.confidence_threshold > 1.0f) {
    fail("--confidence-threshold must be in [0, 1], not {}", options.confidence_threshold);
  }
  const DrafterLoadOptions load{options.drafter_bits};
  LoadedDrafter loaded;
  if (choice.mode == DecodeMode::dspark) {
    auto head = std::make_shared<const DSparkHead>(choice.drafter_dir, target, load);
    loaded.factory = dspark_drafter_factory(head, options.confidence_threshold);
    loaded.max_drafts = head->max_drafts();
  } else if (choice.mode == DecodeMode::dflash) {
    auto head = std::make_shared<const DFlashHead>(choice.drafter_dir, target, load);
    loaded.factory = dflash_drafter_factory(head);
    loaded.max_drafts = head->max_drafts();
  }
  return loaded;
}

DecodeSetup decode_setup_from_options(const Model& target, DecodeOptions decode,
                                      const DrafterCliOptions& options, std::string& explanation) {
  const DrafterChoice choice = resolve_drafter(options);
  decode.mode = choice.mode;
  const bool moe = target.config().layer_kinds.find('E') != std::string::npos;
  decode.lookup_drafts = choice.mode != DecodeMode::lookup && choice.mode != DecodeMode::baseline &&
                         options.lookup_drafts.value_or(!moe);
  LoadedDrafter loaded = load_drafter(target, choice, options);
  const int max_cap = loaded.max_drafts;
  DecodeSetup setup;
  setup.options = decode;
  setup.drafter = std::move(loaded.factory);
  explanation = fmt::format("mode {}: {}", decode_mode_name(choice.mode), choice.reason);
  if (setup.drafter && !decode.max_draft) {
    // The cap comes from this machine's measured cost curves (cached per model, drafter and
    // kernels), or the controller when --max-draft auto.
    CalibrationOptions calibration;
    calibration.mode = decode_mode_name(choice.mode);
    calibration.target_name = std::filesystem::path(options.model_dir).filename().string();
    calibration.drafter_name = drafter_calibration_name(choice.drafter_dir);
    calibration.drafter_bits = options.drafter_bits;
    calibration.max_width = max_cap + 1;
    CalibratedCaps caps = calibrated_cap_policy(target, setup.drafter, calibration, max_cap,
                                                choice.mode == DecodeMode::dspark);
    setup.cap_policy = std::move(caps.policy);
    setup.lookup_cap_policy = std::move(caps.lookup_policy);
    if (!caps.error.empty()) {
      explanation += "; calibration failed (" + caps.error + "), cap 2";
    } else if (decode.auto_cap) {
      explanation += "; cap chosen per round from this machine's measured costs";
    } else if (caps.derived_cap == 0) {
      explanation += fmt::format(
          "; cap 0, plain steps: on this machine's measured costs no cap pays at the assumed "
          "{:.0f} % acceptance (override with --max-draft N or auto)",
          100 * kDerivedCapPrior);
    } else {
      explanation += fmt::format(
          "; cap {} measured for this model+quant, then following the acceptance the rounds show "
          "(override with --max-draft)",
          caps.derived_cap);
    }
  }
  if (setup.options.lookup_drafts) {
    explanation += "; prompt-lookup drafts tried before the drafter's";
  }
  const bool standalone_lookup =
      choice.mode == DecodeMode::lookup && !decode.max_draft && decode.confidence_schedule;
  // Lookup drafts are verified as far as their measured acceptance pays on this machine's verify
  // costs (cached per model and kernels), alone and under load (docs/speculative.md §16.5); the
  // pre-step of a drafter whose cap is pinned takes the target's own curves.
  if (standalone_lookup || (setup.options.lookup_drafts && !setup.lookup_cap_policy)) {
    CalibrationOptions calibration;
    calibration.mode = "lookup";
    calibration.target_name = std::filesystem::path(options.model_dir).filename().string();
    calibration.max_width = kLookupCalibrationWidth;
    CalibratedCaps caps = calibrated_lookup_cap_policy(target, calibration);
    if (standalone_lookup) {
      setup.cap_policy = std::move(caps.policy);
      explanation +=
          caps.error.empty()
              ? "; lookup drafts verified as far as their acceptance pays on the measured costs"
              : fmt::format("; calibration failed ({}), every lookup draft verified", caps.error);
    } else {
      setup.lookup_cap_policy = std::move(caps.lookup_policy);
    }
  }
  return setup;
}

}  // namespace dspark
