#pragma once
// Downloading a model snapshot from the hub into the shared cache: the file listing for the
// revision, only the files a model needs, a few files at a time, resumed from partial files,
// checked against the hub's sizes and hashes before being moved into place.
#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

#include "hub/progress.h"
#include "hub/repo_ref.h"
#include "hub/settings.h"

namespace dspark {

class HubHttp;

struct DownloadOptions {
  int parallel_files = 4;
  DownloadProgress::Style progress = DownloadProgress::style_for_stderr();
  // A caller's own cancel flag (a server cancelling a load); polled like Ctrl-C.
  const std::atomic<bool>* cancel = nullptr;
  // Catch Ctrl-C for the duration of the download (off where the caller handles SIGINT).
  bool catch_sigint = true;
  // Attempts per file in a row without any new byte before giving up.
  int max_attempts = 5;
  // First pause between attempts; doubled each time.
  double retry_pause_seconds = 0.5;
};

struct RemoteFile {
  std::string path;
  int64_t size = 0;
  // The blob name: the sha256 of an LFS file, else its git blob sha1; both are checked.
  std::string etag;
  bool lfs = false;
};

struct RepoListing {
  std::string commit;
  std::vector<RemoteFile> files;  // top level of the repo
};

// The revision's commit and top-level files (hub API: revision info, then the tree listing).
RepoListing list_repo(const HubHttp& http, const RepoRef& ref);

// Which of a repo's files a model needs besides its weights: config, generation config,
// tokenizer and chat template files.
bool is_model_metadata_file(const std::string& path);

// Downloads what the model needs into the cache (skipping files already there) and returns the
// snapshot directory. Throws HubError.
std::string download_snapshot(const RepoRef& ref, const HubSettings& settings,
                              const DownloadOptions& options);

}  // namespace dspark
