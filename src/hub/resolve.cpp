#include "hub/resolve.h"

#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <filesystem>
#include <regex>

#include "base/error.h"
#include "convert/gguf_to_mlx.h"
#include "formats/model_store.h"
#include "hub/cache.h"
#include "hub/hub_error.h"

namespace dspark {
namespace fs = std::filesystem;
namespace {

bool is_model_dir(const fs::path& dir) {
  std::error_code error;
  return fs::is_directory(dir, error) && fs::is_regular_file(dir / "config.json", error);
}

std::string lowercase(std::string text) {
  std::transform(text.begin(), text.end(), text.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return text;
}

std::string join(const std::vector<std::string>& items, const std::string& separator) {
  std::string text;
  for (const auto& item : items) text += (text.empty() ? "" : separator) + item;
  return text;
}

// A GGUF given as --model becomes <models>/<stem> once; later runs reuse the conversion.
std::string converted_gguf_model(const fs::path& gguf, const std::string& dir) {
  const fs::path target = fs::path(dir) / gguf.stem();
  std::error_code error;
  if (fs::exists(target, error)) {
    const auto missing = missing_model_files(target);
    if (missing.empty()) return target.string();
    fail("{} exists but is not a complete model (missing {}); remove it to convert {} again",
         target.string(), join(missing, ", "), gguf.string());
  }
  fs::create_directories(dir);
  // Converted beside the target and renamed into place, so that an interrupted conversion never
  // leaves a half-written model under the model's name.
  const fs::path staging =
      fs::path(dir) / fmt::format(".{}.converting-{}", gguf.stem().string(), ::getpid());
  fs::remove_all(staging);
  std::fprintf(stderr, "converting %s into %s (once)\n", gguf.string().c_str(),
               target.string().c_str());
  try {
    convert_gguf_to_mlx(gguf.string(), staging.string());
  } catch (...) {
    fs::remove_all(staging, error);
    throw;
  }
  fs::rename(staging, target, error);
  if (error) {
    fs::remove_all(staging);
    if (!is_model_dir(target))
      fail("cannot move {} to {}: {}", staging.string(), target.string(), error.message());
  }
  return target.string();
}

std::string strip_quantization_suffix(std::string name) {
  static const std::regex kSuffix("-(\\d+bit|bf16|fp16|f16|fp8|mxfp4|nvfp4|mlx)$");
  std::string stripped = std::regex_replace(name, kSuffix, "");
  while (stripped != name) {
    name = stripped;
    stripped = std::regex_replace(name, kSuffix, "");
  }
  return name;
}

}  // namespace

std::optional<std::string> find_cached_snapshot(const RepoRef& ref, const HubSettings& settings) {
  const HubCache cache(settings.cache_dir, ref.repo_id);
  const auto commit = cache.commit_for(ref.revision);
  if (!commit) return std::nullopt;
  const fs::path snapshot = cache.snapshot_dir(*commit);
  std::error_code error;
  if (!fs::is_directory(snapshot, error) || !missing_model_files(snapshot).empty()) {
    return std::nullopt;
  }
  return snapshot.string();
}

std::string resolve_model_or_download(const std::string& model, const ResolveOptions& options) {
  const std::string dir = models_dir(options.models_dir);
  if (model.empty()) return resolve_model("", dir);
  std::vector<std::string> looked;
  const fs::path direct(model);
  if (is_model_dir(direct)) return direct.string();
  std::error_code error;
  if (fs::is_regular_file(direct, error) && lowercase(direct.extension().string()) == ".gguf") {
    return converted_gguf_model(direct, dir);
  }
  if (fs::exists(direct, error)) {
    fail("'{}' is neither a model directory (with config.json) nor a .gguf file", model);
  }
  looked.push_back(direct.string());
  if (model.find('/') == std::string::npos) {
    const fs::path in_store = fs::path(dir) / model;
    if (is_model_dir(in_store)) return in_store.string();
    looked.push_back(in_store.string());
  }
  const std::optional<RepoRef> ref = parse_repo_ref(model);
  if (!ref) {
    fail("model '{}' not found; looked in:\n  {}\n(a hub model is named org/name[@revision])",
         model, join(looked, "\n  "));
  }
  if (ref->revision == "main") {
    // Models converted or copied into the models directory under the repo's name.
    for (const std::string& name : {ref->name(), ref->org() + "_" + ref->name()}) {
      const fs::path in_store = fs::path(dir) / name;
      if (is_model_dir(in_store)) return in_store.string();
      looked.push_back(in_store.string());
    }
  }
  if (auto cached = find_cached_snapshot(*ref, options.hub)) return *cached;
  const HubCache cache(options.hub.cache_dir, ref->repo_id);
  looked.push_back(cache.repo_dir().string());
  if (options.hub.offline) {
    const auto commit = cache.commit_for(ref->revision);
    if (commit && fs::is_directory(cache.snapshot_dir(*commit), error)) {
      fail_hub(HubErrorKind::kOffline,
               "{} is only partly in the Hugging Face cache ({} lacks {}) and HF_HUB_OFFLINE=1 "
               "forbids downloading the rest",
               ref->display(), cache.snapshot_dir(*commit).string(),
               join(missing_model_files(cache.snapshot_dir(*commit)), ", "));
    }
    fail_hub(HubErrorKind::kOffline,
             "model '{}' not found; looked in:\n  {}\nand HF_HUB_OFFLINE=1 forbids downloading it",
             model, join(looked, "\n  "));
  }
  try {
    return download_snapshot(*ref, options.hub, options.download);
  } catch (const HubError& e) {
    if (e.kind() != HubErrorKind::kNotFound) throw;
    fail_hub(HubErrorKind::kNotFound, "model '{}' not found; looked in:\n  {}\nand on the hub: {}",
             model, join(looked, "\n  "), e.what());
  }
}

std::optional<std::string> find_or_download_repo(const std::string& repo_id,
                                                 const HubSettings& settings,
                                                 const DownloadOptions& options) {
  const std::optional<RepoRef> ref = parse_repo_ref(repo_id);
  if (!ref)
    fail_hub(HubErrorKind::kInvalid, "'{}' is not a hub repo id (org/name[@revision])", repo_id);
  if (auto cached = find_cached_snapshot(*ref, settings)) return cached;
  if (settings.offline) return std::nullopt;
  try {
    return download_snapshot(*ref, settings, options);
  } catch (const HubError& e) {
    if (e.kind() == HubErrorKind::kNotFound) return std::nullopt;
    throw;
  }
}

std::vector<std::string> find_cached_companions(const std::string& target_repo_id,
                                                const std::string& marker,
                                                const HubSettings& settings) {
  std::vector<std::string> found;
  const std::optional<RepoRef> target = parse_repo_ref(target_repo_id);
  std::error_code error;
  if (!target || !fs::is_directory(settings.cache_dir, error)) return found;
  const std::string org = lowercase(target->org());
  const std::string stem =
      strip_quantization_suffix(lowercase(target->name())) + "-" + lowercase(marker);
  for (const auto& entry : fs::directory_iterator(settings.cache_dir, error)) {
    const std::string folder = entry.path().filename().string();
    if (folder.rfind("models--", 0) != 0) continue;
    const std::string id_part = folder.substr(8);
    const size_t separator = id_part.find("--");
    if (separator == std::string::npos) continue;
    const std::string repo_id = id_part.substr(0, separator) + "/" + id_part.substr(separator + 2);
    const std::string name = lowercase(id_part.substr(separator + 2));
    if (lowercase(id_part.substr(0, separator)) != org || name.rfind(stem, 0) != 0) continue;
    if (name.size() != stem.size() && name[stem.size()] != '-') continue;
    try {
      const std::optional<RepoRef> candidate = parse_repo_ref(repo_id);
      if (candidate && find_cached_snapshot(*candidate, settings)) found.push_back(repo_id);
    } catch (const HubError&) {
      // A cache folder whose name is no valid repo id was not written by a hub client.
    }
  }
  std::sort(found.begin(), found.end());
  return found;
}

}  // namespace dspark
