#include "cli/decode_flags.h"

#include <fmt/format.h>

#include <cmath>

#include "base/error.h"
#include "base/thread_pool.h"
#include "formats/model_store.h"
#include "hub/resolve.h"
#include "kernels/ops.h"
#include "kernels/quant.h"
#include "speculative/drafter_resolution.h"

namespace dspark::cli {

CLI::Validator finite_range(double min, double max) {
  return CLI::Validator(
      [min, max](std::string& input) -> std::string {
        double value = 0.0;
        size_t used = 0;
        try {
          value = std::stod(input, &used);
        } catch (const std::exception&) {
          return fmt::format("'{}' is not a number", input);
        }
        if (used != input.size()) return fmt::format("'{}' is not a number", input);
        if (!std::isfinite(value) || value < min || value > max) {
          return fmt::format("{} is not a finite number in [{}, {}]", input, min, max);
        }
        return "";
      },
      fmt::format("FINITE in [{} - {}]", min, max));
}

CLI::Validator drafter_bits() {
  return CLI::Validator(
      [](std::string& input) -> std::string {
        int value = -1;
        size_t used = 0;
        try {
          value = std::stoi(input, &used);
        } catch (const std::exception&) {
          used = 0;
        }
        if (used == 0 || used != input.size() || value < 0 || value == 7 || value > 8) {
          return fmt::format("{} is not 0 (as stored) or a quantization width (2-6 or 8 bits)",
                             input);
        }
        return "";
      },
      "0 or 2-6, 8");
}

CLI::Validator thread_count() {
  return CLI::Validator(
      [](std::string& input) -> std::string {
        int64_t value = 0;
        try {
          size_t used = 0;
          value = std::stoll(input, &used);
          if (used != input.size()) return fmt::format("'{}' is not a whole number", input);
        } catch (const std::exception&) {
          return fmt::format("'{}' is not a whole number", input);
        }
        if (value < 0 || value > max_threads()) {
          return fmt::format(
              "{} threads is outside [0, {}] (4 x the {} CPUs this process may use; 0 = all)",
              input, max_threads(), available_cpus());
        }
        return "";
      },
      "THREADS");
}

void add_numerics_flags(CLI::App& command) {
  command
      .add_option_function<std::string>(
          "--numerics",
          [](const std::string& name) {
            kernels::set_numerics(kernels::parse_numerics(name, "--numerics"));
          },
          "Quantized products: int8 (activations rounded to 8 bits, the default) or fp32 (the "
          "oracle path); DSPARK_NUMERICS sets the same")
      ->check(CLI::IsMember({"int8", "fp32"}));
  command
      .add_option_function<std::string>(
          "--kv-cache",
          [](const std::string& name) {
            kernels::set_kv_cache_type(kernels::parse_kv_type(name, "--kv-cache"));
          },
          "KV cache type: f16 (the default under int8 numerics) or f32 (the default under fp32 "
          "numerics); DSPARK_KV_CACHE sets the same")
      ->check(CLI::IsMember({"f16", "f32"}));
}

void add_decode_flags(CLI::App& command, DecodeFlags& flags) {
  add_numerics_flags(command);
  command
      .add_option("--mode", flags.mode,
                  "Decoding: auto (a drafter if one is found, else lookup), dspark, dflash, "
                  "lookup or baseline")
      ->capture_default_str();
  command.add_option("--max-draft", flags.max_draft,
                     "Drafts per round: a number or 'auto' (default: measured for the model)");
  command.add_option("--drafter", flags.drafter,
                     "DSpark or DFlash drafter: a directory or a hub repo id");
  command
      .add_option("--drafter-bits", flags.drafter_bits,
                  "Quantise the drafter to this many bits at load (0 = as stored)")
      ->check(drafter_bits())
      ->capture_default_str();
  command
      .add_option("--confidence-threshold", flags.confidence_threshold,
                  "DSpark: keep drafts while their confidence product stays at or above this")
      ->check(finite_range(0.0, 1.0))
      ->capture_default_str();
  command
      .add_option("--confidence-schedule", flags.confidence_schedule,
                  "DSpark with a derived cap: verify only the drafts whose confidence-head "
                  "survival pays for their verify rows (on), or every draft of the cap (off)")
      ->check(CLI::IsMember({"on", "off"}))
      ->capture_default_str();
  CLI::Option* lookup_on =
      command.add_flag("--lookup-drafts", flags.lookup_drafts,
                       "Try prompt-lookup drafts before the model drafter each round (the default "
                       "for dense targets; MoE targets leave it off)");
  command
      .add_flag("--no-lookup-drafts", flags.no_lookup_drafts,
                "Run the model drafter every round, without the prompt-lookup pre-step")
      ->excludes(lookup_on);
  command.add_flag("--special-tokens-in-content", flags.special_tokens_in_content,
                   "Tokenize control-token text inside messages and tools as control tokens "
                   "(default: plain text; only the chat template's markup gives control tokens)");
}

DecodeOptions cap_options(const DecodeFlags& flags) {
  DecodeOptions decode;
  decode.confidence_schedule = flags.confidence_schedule == "on";
  if (flags.max_draft == "auto") {
    decode.auto_cap = true;
  } else if (!flags.max_draft.empty()) {
    try {
      decode.max_draft = std::stoi(flags.max_draft);
    } catch (const std::exception&) {
      fail("--max-draft must be a number or 'auto', not '{}'", flags.max_draft);
    }
    if (*decode.max_draft < 0) fail("--max-draft must not be negative");
  }
  return decode;
}

DecodeSetup resolve_decode_flags(const DecodeFlags& flags, const std::string& model,
                                 const std::string& models_dir_flag, const ModelBundle& bundle,
                                 std::string& explanation) {
  ResolveOptions resolve;
  resolve.models_dir = models_dir_flag;
  DrafterCliOptions drafter;
  drafter.mode = flags.mode;
  drafter.drafter = flags.drafter;
  drafter.model = model;
  drafter.model_dir = bundle.path;
  drafter.models_dir = models_dir(models_dir_flag);
  drafter.drafter_bits = flags.drafter_bits;
  drafter.confidence_threshold = flags.confidence_threshold;
  if (flags.lookup_drafts) drafter.lookup_drafts = true;
  if (flags.no_lookup_drafts) drafter.lookup_drafts = false;
  drafter.hub.find_repo = [&resolve](const std::string& repo_id) {
    return find_or_download_repo(repo_id, resolve.hub, resolve.download);
  };
  drafter.hub.cached_companions = [&resolve](const std::string& model_repo,
                                             const std::string& marker) {
    return find_cached_companions(model_repo, marker, resolve.hub);
  };
  return decode_setup_from_options(*bundle.model, cap_options(flags), drafter, explanation);
}

}  // namespace dspark::cli
