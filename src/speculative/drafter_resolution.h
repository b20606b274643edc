#pragma once
// --mode auto|dspark|dflash|lookup|baseline and which drafter a generation uses
// (docs/speculative.md §15): --drafter (a directory or a hub repo id), else a drafter directory
// named after the model beside it or in the models directory (<model>-DSpark*, <model>-DFlash*),
// else a cached hub companion of a repo-id model, else the built-in registry's row, else lookup
// (auto only). The choice comes back with the reason, for the CLI to print.
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "model/model.h"
#include "speculative/decode.h"

namespace dspark {

// A target -> drafter row. `target` is a lowercased model basename without its quantisation
// suffix; ids are hub repo ids ("" = none of that kind).
struct DrafterRegistryRow {
  std::string target;
  std::string dspark;
  std::string dflash;
  std::optional<DecodeMode> mode;  // stamped mode for auto; else dspark if present, else dflash
};

const std::vector<DrafterRegistryRow>& drafter_registry();

// The row whose target is a substring of lowercase(basename(model)) (or, dashes removed, of the
// dash-less key), longest target first; null when none matches. Quantisation-agnostic because
// targets carry no suffix.
const DrafterRegistryRow* find_registry_row(const std::string& model,
                                            const std::vector<DrafterRegistryRow>& registry);

// Hub access, injected so that this module stays free of the network (the CLI binds these to
// hub/resolve.h); an unset member means no hub lookups of that kind.
struct DrafterHub {
  // The local snapshot of a repo id (downloaded when needed), or nullopt when it does not exist
  // or cannot be had offline.
  std::function<std::optional<std::string>(const std::string& repo_id)> find_repo;
  // Cached repo ids named "<model repo name without quantisation>-<marker>[-...]".
  std::function<std::vector<std::string>(const std::string& model_repo_id,
                                         const std::string& marker)>
      cached_companions;
};

struct DrafterCliOptions {
  std::string mode = "auto";  // auto|dspark|dflash|lookup|baseline
  std::string drafter;        // --drafter: a directory or a hub repo id
  std::string model;          // --model as given (path, name or repo id; "" = default model)
  std::string model_dir;      // the directory --model resolved to
  std::string models_dir;     // the models directory
  int drafter_bits = 4;       // 0 = as stored
  float confidence_threshold = 0.0f;
  // The --lookup-drafts pre-step of dspark / dflash modes; unset: on for a dense target, off for
  // a MoE one (each extra verify row there loads fresh experts).
  std::optional<bool> lookup_drafts;
  DrafterHub hub;
};

struct DrafterChoice {
  DecodeMode mode = DecodeMode::baseline;
  std::string drafter_dir;  // set for dspark / dflash
  std::string reason;
};

// The family of a drafter directory, from its config.json; throws naming the directory.
DecodeMode drafter_family(const std::string& directory);

// Throws for an unknown mode, a --drafter that is neither a drafter directory nor an available
// repo, a drafter of the wrong family for an explicit mode, and an explicit dspark / dflash mode
// with no drafter to be found.
DrafterChoice resolve_drafter(const DrafterCliOptions& options);

// The chosen drafter loaded for `target` (quantised to options.drafter_bits): a factory that makes
// a fresh drafter per generation, and the most drafts a round it proposes. Empty for lookup and
// baseline. Throws for negative --drafter-bits or a --confidence-threshold outside [0, 1].
struct LoadedDrafter {
  DrafterFactory factory;
  int max_drafts = 0;
};
LoadedDrafter load_drafter(const Model& target, const DrafterChoice& choice,
                           const DrafterCliOptions& options);

// Resolves the mode and drafter, loads the drafter head for `target` (quantised to
// options.drafter_bits) and returns a setup whose factory makes a fresh drafter per generation.
// `decode` carries the cap options (--max-draft); its mode is replaced. `explanation` receives a
// one-line "mode ...: reason" for the user.
DecodeSetup decode_setup_from_options(const Model& target, DecodeOptions decode,
                                      const DrafterCliOptions& options, std::string& explanation);

}  // namespace dspark
