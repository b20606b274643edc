#pragma once
// The Hugging Face hub cache, laid out exactly as the huggingface_hub Python package lays it out
// so that either can use what the other downloaded:
//   <cache>/models--<org>--<name>/blobs/<etag>             file contents, named by their sha256
//                                                          (LFS files) or git blob sha1
//   <cache>/models--<org>--<name>/blobs/<etag>.incomplete  a partial download, resumed later
//   <cache>/models--<org>--<name>/refs/<revision>          the commit the revision pointed at
//   <cache>/models--<org>--<name>/snapshots/<commit>/<path> -> ../../blobs/<etag> (relative)
//   <cache>/.locks/models--<org>--<name>/<etag>.lock       flock'ed while a blob is written
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

namespace dspark {

// "models--org--name".
std::string repo_folder_name(const std::string& repo_id);

class HubCache {
 public:
  HubCache(const std::string& cache_dir, const std::string& repo_id);

  const std::filesystem::path& repo_dir() const { return repo_dir_; }
  std::filesystem::path blob_path(const std::string& etag) const;
  std::filesystem::path incomplete_path(const std::string& etag) const;
  std::filesystem::path lock_path(const std::string& etag) const;
  std::filesystem::path snapshot_dir(const std::string& commit) const;

  // The commit a revision names: the revision itself when it is a commit hash, else the content
  // of refs/<revision>; nullopt when the cache has no such ref.
  std::optional<std::string> commit_for(const std::string& revision) const;
  // Records revision -> commit atomically (no trailing newline, as huggingface_hub reads it
  // verbatim); does nothing for a commit hash or an unchanged ref.
  void write_ref(const std::string& revision, const std::string& commit) const;
  // Points snapshots/<commit>/<path> at blobs/<etag> with a relative symlink, replacing any
  // previous entry atomically.
  void link_snapshot_file(const std::string& commit, const std::string& path,
                          const std::string& etag) const;

 private:
  std::filesystem::path cache_dir_;
  std::filesystem::path repo_dir_;
  std::string folder_;
};

// What a snapshot (or any model directory) still lacks before dspark can load it: config.json,
// the shards the index lists, or any .safetensors at all. Empty when complete.
std::vector<std::string> missing_model_files(const std::filesystem::path& dir);

}  // namespace dspark
