#pragma once
// Models by name: what --model (and a drafter) may be, resolved to a local model directory.
//   1. an existing directory holding config.json;
//   2. a GGUF file, converted once into the models directory (<models>/<file stem>);
//   3. a name in the models directory;
//   4. a hub repo id "org/name[@revision]": <models>/<name> or <models>/<org>_<name> if there,
//      else the Hugging Face cache (HF_HUB_CACHE / HF_HOME), else downloaded into that cache
//      (unless HF_HUB_OFFLINE=1). A model found locally is never downloaded again.
// An empty --model is the default model of the models directory.
#include <optional>
#include <string>

#include "hub/download.h"
#include "hub/repo_ref.h"
#include "hub/settings.h"

namespace dspark {

struct ResolveOptions {
  std::string models_dir;  // --models-dir ("" = $DSPARK_MODELS_DIR or ~/.cache/dspark/models)
  HubSettings hub = HubSettings::from_environment();
  DownloadOptions download;
};

// Throws (HubError for hub failures) saying every place it looked.
std::string resolve_model_or_download(const std::string& model, const ResolveOptions& options);

// The complete snapshot of a repo in the Hugging Face cache, never touching the network.
std::optional<std::string> find_cached_snapshot(const RepoRef& ref, const HubSettings& settings);

// For drafters, whose repos may simply not exist: the local snapshot of `repo_id` (cache first,
// else downloaded), or nullopt when the hub has no such repo, or when offline and it is not
// cached. Every other failure (network, token, checksum, disk) throws.
std::optional<std::string> find_or_download_repo(const std::string& repo_id,
                                                 const HubSettings& settings,
                                                 const DownloadOptions& options);

// Repo ids of complete cached snapshots that follow the companion naming convention for
// `target_repo_id`: same org, named "<target name without its quantisation suffix>-<marker>"
// optionally followed by "-<anything>" (e.g. mlx-community/X-4bit -> mlx-community/X-DSpark-bf16),
// compared case-insensitively; sorted.
std::vector<std::string> find_cached_companions(const std::string& target_repo_id,
                                                const std::string& marker,
                                                const HubSettings& settings);

}  // namespace dspark
