#include "hub/cache.h"

#include <unistd.h>

#include <fstream>
#include <set>
#include <sstream>
#include <thread>

#include "base/file_io.h"
#include "formats/checkpoint.h"
#include "hub/hub_error.h"
#include "hub/repo_ref.h"

namespace dspark {
namespace fs = std::filesystem;
namespace {

// A name unique to this process and thread, for files renamed into place.
std::string temporary_suffix() {
  std::ostringstream text;
  text << ".tmp-" << ::getpid() << "-" << std::this_thread::get_id();
  return text.str();
}

}  // namespace

std::string repo_folder_name(const std::string& repo_id) {
  std::string folder = "models--" + repo_id;
  for (size_t at = folder.find('/'); at != std::string::npos; at = folder.find('/', at)) {
    folder.replace(at, 1, "--");
  }
  return folder;
}

HubCache::HubCache(const std::string& cache_dir, const std::string& repo_id)
    : cache_dir_(cache_dir),
      repo_dir_(fs::path(cache_dir) / repo_folder_name(repo_id)),
      folder_(repo_folder_name(repo_id)) {}

fs::path HubCache::blob_path(const std::string& etag) const {
  return repo_dir_ / "blobs" / etag;
}

fs::path HubCache::incomplete_path(const std::string& etag) const {
  return repo_dir_ / "blobs" / (etag + ".incomplete");
}

fs::path HubCache::lock_path(const std::string& etag) const {
  return cache_dir_ / ".locks" / folder_ / (etag + ".lock");
}

fs::path HubCache::snapshot_dir(const std::string& commit) const {
  return repo_dir_ / "snapshots" / commit;
}

std::optional<std::string> HubCache::commit_for(const std::string& revision) const {
  if (is_commit_hash(revision)) return revision;
  const fs::path ref = repo_dir_ / "refs" / revision;
  std::error_code error;
  if (!fs::is_regular_file(ref, error)) return std::nullopt;
  std::string commit = read_file(ref.string());
  // Other tools may have written the ref by hand with a newline.
  while (!commit.empty() && (commit.back() == '\n' || commit.back() == '\r')) commit.pop_back();
  if (!is_commit_hash(commit)) return std::nullopt;
  return commit;
}

void HubCache::write_ref(const std::string& revision, const std::string& commit) const {
  if (is_commit_hash(revision) || commit_for(revision) == commit) return;
  const fs::path ref = repo_dir_ / "refs" / revision;
  fs::create_directories(ref.parent_path());
  const fs::path temporary = ref.string() + temporary_suffix();
  {
    std::ofstream out(temporary, std::ios::binary | std::ios::trunc);
    out << commit;
    if (!out.flush()) fail_hub(HubErrorKind::kDiskFull, "{}: cannot write the ref", ref.string());
  }
  fs::rename(temporary, ref);
}

void HubCache::link_snapshot_file(const std::string& commit, const std::string& path,
                                  const std::string& etag) const {
  const fs::path link = snapshot_dir(commit) / path;
  fs::create_directories(link.parent_path());
  // Relative, so that the cache still works after being moved or mounted elsewhere.
  const fs::path target = blob_path(etag).lexically_relative(link.parent_path());
  const fs::path temporary = link.string() + temporary_suffix();
  std::error_code ignored;
  fs::remove(temporary, ignored);
  fs::create_symlink(target, temporary);
  fs::rename(temporary, link);
}

std::vector<std::string> missing_model_files(const fs::path& dir) {
  std::vector<std::string> missing;
  std::error_code error;
  if (!fs::is_regular_file(dir / "config.json", error)) missing.push_back("config.json");
  const fs::path index = dir / "model.safetensors.index.json";
  if (fs::is_regular_file(index, error)) {
    const nlohmann::json parsed = read_json_file(index.string());
    std::set<std::string> shards;
    if (parsed.contains("weight_map") && parsed["weight_map"].is_object()) {
      for (const auto& [tensor, shard] : parsed["weight_map"].items()) {
        if (shard.is_string()) shards.insert(shard.get<std::string>());
      }
    }
    for (const auto& shard : shards) {
      if (!fs::is_regular_file(dir / shard, error)) missing.push_back(shard);
    }
    return missing;
  }
  bool any_weights = false;
  if (fs::is_directory(dir, error)) {
    for (const auto& entry : fs::directory_iterator(dir, error)) {
      any_weights |=
          entry.path().extension() == ".safetensors" && fs::is_regular_file(entry.path(), error);
    }
  }
  if (!any_weights) missing.push_back("*.safetensors");
  return missing;
}

}  // namespace dspark
