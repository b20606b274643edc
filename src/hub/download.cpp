#include "hub/download.h"

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <mutex>
#include <optional>
#include <set>
#include <thread>

#include "formats/checkpoint.h"
#include "hub/blob_file.h"
#include "hub/cache.h"
#include "hub/checksum.h"
#include "hub/http.h"
#include "hub/hub_error.h"
#include "hub/interrupt.h"

namespace dspark {
namespace fs = std::filesystem;
namespace {

constexpr const char* kIndexFile = "model.safetensors.index.json";
constexpr int kMaxListingPages = 10000;

bool is_hex(const std::string& text, size_t length) {
  return text.size() == length && std::all_of(text.begin(), text.end(), [](char c) {
           return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f');
         });
}

bool ends_with(const std::string& text, const std::string& suffix) {
  return text.size() >= suffix.size() &&
         text.compare(text.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// A tree entry becomes a blob name and a snapshot path: both must be harmless as file names.
std::optional<RemoteFile> parse_tree_entry(const nlohmann::json& entry, const std::string& what) {
  if (!entry.is_object() || entry.value("type", "") != "file") return std::nullopt;
  RemoteFile file;
  try {
    file.path = entry.at("path").get<std::string>();
    file.size = entry.at("size").get<int64_t>();
    file.etag = entry.at("oid").get<std::string>();
    if (entry.contains("lfs") && entry["lfs"].is_object()) {
      file.lfs = true;
      file.etag = entry["lfs"].at("oid").get<std::string>();
      file.size = entry["lfs"].at("size").get<int64_t>();
    }
  } catch (const nlohmann::json::exception& e) {
    fail_hub(HubErrorKind::kInvalid, "{}: malformed entry in the hub's file listing: {} ({})", what,
             entry.dump(), e.what());
  }
  // Only the top level matters for a model; deeper entries are not listed without recursion.
  if (file.path.empty() || file.path.find('/') != std::string::npos || file.path == "." ||
      file.path == "..") {
    return std::nullopt;
  }
  if (!is_hex(file.etag, file.lfs ? 64 : 40) || file.size < 0) {
    fail_hub(HubErrorKind::kInvalid, "{}: the hub's listing gives {} an invalid {} '{}'", what,
             file.path, file.lfs ? "sha256" : "git oid", file.etag);
  }
  return file;
}

class SnapshotDownload {
 public:
  SnapshotDownload(const HubHttp& http, const RepoRef& ref, std::string commit,
                   const DownloadOptions& options)
      : http_(http),
        ref_(ref),
        commit_(std::move(commit)),
        options_(options),
        cache_(http.settings().cache_dir, ref.repo_id) {}

  const HubCache& cache() const { return cache_; }

  bool present(const RemoteFile& file) const {
    std::error_code error;
    const fs::path link = cache_.snapshot_dir(commit_) / file.path;
    return fs::is_regular_file(link, error) &&
           static_cast<int64_t>(fs::file_size(link, error)) == file.size;
  }

  // A small file's content, checked against the listing, without touching the cache.
  std::string read_small_file(const RemoteFile& file) const {
    std::string content;
    Digest digest(file.lfs ? Digest::Kind::kSha256 : Digest::Kind::kGitBlobSha1, file.size);
    HubHttp::StreamHandler handler;
    handler.begin = [&](int64_t) { content.clear(); };
    handler.data = [&](const char* data, size_t size) {
      if (static_cast<int64_t>(content.size() + size) > file.size) return false;
      content.append(data, size);
      return true;
    };
    handler.stop = [this] { return stopping(); };
    const auto result = http_.stream(file_url(file), 0, ref_.display(), handler);
    if (result.outcome == HubHttp::StreamOutcome::kStopped && stopping()) fail_interrupted();
    if (result.outcome == HubHttp::StreamOutcome::kDropped) {
      fail_hub(HubErrorKind::kNetwork, "{}: downloading {} failed ({})", ref_.display(), file.path,
               result.detail);
    }
    digest.update(content.data(), content.size());
    if (static_cast<int64_t>(content.size()) != file.size || digest.hex() != file.etag) {
      fail_hub(HubErrorKind::kCorrupt, "{}: {} does not match the hub's listing ({} of {} bytes)",
               ref_.display(), file.path, content.size(), file.size);
    }
    return content;
  }

  // Downloads `files` a few at a time; rethrows the first real failure.
  void fetch(std::vector<RemoteFile> files, DownloadProgress& progress) {
    std::sort(files.begin(), files.end(),
              [](const RemoteFile& a, const RemoteFile& b) { return a.size > b.size; });
    std::atomic<size_t> next{0};
    std::mutex mutex;
    std::exception_ptr first_error;
    bool first_error_is_interrupt = false;
    auto record = [&](std::exception_ptr error, bool interrupt) {
      std::lock_guard<std::mutex> lock(mutex);
      if (!first_error || (first_error_is_interrupt && !interrupt)) {
        first_error = error;
        first_error_is_interrupt = interrupt;
      }
      if (!interrupt) failed_.store(true);
    };
    auto worker = [&] {
      for (size_t i = next++; i < files.size() && !stopping(); i = next++) {
        try {
          fetch_one(files[i], progress);
        } catch (const HubError& e) {
          record(std::current_exception(), e.kind() == HubErrorKind::kInterrupted);
        } catch (const fs::filesystem_error& e) {
          if (e.code() == std::errc::no_space_on_device) {
            record(std::make_exception_ptr(
                       HubError(HubErrorKind::kDiskFull, fmt::format("disk full: {}", e.what()))),
                   false);
          } else {
            record(std::current_exception(), false);
          }
        } catch (...) {
          record(std::current_exception(), false);
        }
      }
    };
    const int threads =
        static_cast<int>(std::min<size_t>(std::max(1, options_.parallel_files), files.size()));
    std::vector<std::thread> pool;
    for (int t = 1; t < threads; ++t) pool.emplace_back(worker);
    worker();
    for (auto& thread : pool) thread.join();
    if (first_error) {
      if (first_error_is_interrupt) fail_interrupted();
      std::rethrow_exception(first_error);
    }
    if (stopping()) fail_interrupted();
  }

 private:
  std::string file_url(const RemoteFile& file) const {
    return http_.settings().endpoint + "/" + ref_.repo_id + "/resolve/" + commit_ + "/" +
           percent_encode(file.path, true);
  }

  bool stopping() const {
    return failed_.load() || (options_.catch_sigint && sigint_received()) ||
           (options_.cancel != nullptr && options_.cancel->load());
  }

  [[noreturn]] void fail_interrupted() const {
    fail_hub(HubErrorKind::kInterrupted,
             "{}: download interrupted; partial files stay in {} and the next run resumes them",
             ref_.display(), (cache_.repo_dir() / "blobs").string());
  }

  void fetch_one(const RemoteFile& file, DownloadProgress& progress) {
    const fs::path blob = cache_.blob_path(file.etag);
    auto have_blob = [&] {
      std::error_code error;
      return fs::is_regular_file(blob, error) &&
             static_cast<int64_t>(fs::file_size(blob, error)) == file.size;
    };
    if (!have_blob()) {
      // Another dspark, or huggingface_hub, may be writing the same blob: wait for it.
      BlobLock lock(cache_.lock_path(file.etag).string(), [this] { return stopping(); });
      if (!lock.held()) fail_interrupted();
      if (have_blob()) {
        progress.add_resumed_bytes(file.size);
      } else {
        download_blob(file, progress);
      }
    } else {
      progress.add_resumed_bytes(file.size);
    }
    cache_.link_snapshot_file(commit_, file.path, file.etag);
    progress.file_done(file.path, file.size);
  }

  void download_blob(const RemoteFile& file, DownloadProgress& progress) {
    const std::string what = ref_.display();
    const fs::path incomplete = cache_.incomplete_path(file.etag);
    PartialBlob partial(incomplete.string());
    if (partial.size() > file.size) partial.truncate(0);
    Digest digest(file.lfs ? Digest::Kind::kSha256 : Digest::Kind::kGitBlobSha1, file.size);
    if (partial.size() > 0) {
      partial.hash_contents(digest);
      progress.add_resumed_bytes(partial.size());
      progress.note(fmt::format("resuming {} at {} of {}", file.path, human_bytes(partial.size()),
                                human_bytes(file.size)));
    }
    const std::string url = file_url(file);

    HubHttp::StreamHandler handler;
    handler.begin = [&](int64_t start) {
      if (start < partial.size()) {  // the server ignored the Range: take the whole file again
        progress.remove_bytes(partial.size() - start);
        partial.truncate(start);
        digest.reset();
        partial.hash_contents(digest);
      }
    };
    handler.data = [&](const char* data, size_t size) {
      if (partial.size() + static_cast<int64_t>(size) > file.size) {
        fail_hub(HubErrorKind::kCorrupt, "{}: {} is longer than the {} bytes the hub lists", what,
                 file.path, file.size);
      }
      partial.append(data, size);
      digest.update(data, size);
      progress.add_bytes(static_cast<int64_t>(size));
      return true;
    };
    handler.stop = [this] { return stopping(); };

    int failures = 0;
    double pause = options_.retry_pause_seconds;
    try {
      while (partial.size() < file.size) {
        if (stopping()) fail_interrupted();
        const int64_t before = partial.size();
        const HubHttp::StreamResult result = http_.stream(url, before, what, handler);
        if (result.outcome == HubHttp::StreamOutcome::kStopped) fail_interrupted();
        if (partial.size() == file.size) break;
        const std::string detail =
            result.outcome == HubHttp::StreamOutcome::kDropped
                ? result.detail
                : fmt::format("the body ended early, at {} of {} bytes", partial.size(), file.size);
        if (partial.size() > before) {
          failures = 0;
          pause = options_.retry_pause_seconds;
        }
        if (++failures >= options_.max_attempts) {
          fail_hub(HubErrorKind::kNetwork,
                   "{}: downloading {} failed {} times in a row at {} of {} bytes ({}); the "
                   "partial file {} is kept and the next run resumes it (with no network, "
                   "HF_HUB_OFFLINE=1 uses only cached models)",
                   what, file.path, failures, partial.size(), file.size, detail,
                   incomplete.string());
        }
        progress.note(fmt::format("{}: {} at {} of {}; resuming", file.path, detail,
                                  human_bytes(partial.size()), human_bytes(file.size)));
        sleep_unless_stopping(pause);
        pause *= 2;
      }
    } catch (const HubError& e) {
      // A body that disagrees with the listing cannot be resumed: start over next time.
      if (e.kind() == HubErrorKind::kCorrupt) fs::remove(incomplete);
      throw;
    }
    partial.sync_and_close();
    const std::string actual = digest.hex();
    if (actual != file.etag) {
      fs::remove(incomplete);
      fail_hub(HubErrorKind::kCorrupt,
               "{}: {} is corrupt: the hub lists {} {} but the download hashes to {}; the bad "
               "download was discarded, run again to retry",
               what, file.path, file.lfs ? "sha256" : "git blob sha1", file.etag, actual);
    }
    fs::rename(incomplete, cache_.blob_path(file.etag));
  }

  void sleep_unless_stopping(double seconds) const {
    const auto until = std::chrono::steady_clock::now() +
                       std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000));
    while (std::chrono::steady_clock::now() < until && !stopping()) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }

  const HubHttp& http_;
  const RepoRef& ref_;
  std::string commit_;
  const DownloadOptions& options_;
  HubCache cache_;
  std::atomic<bool> failed_{false};
};

const RemoteFile* find_file(const RepoListing& listing, const std::string& path) {
  for (const auto& file : listing.files) {
    if (file.path == path) return &file;
  }
  return nullptr;
}

nlohmann::json parse_index(const std::string& text, const RepoRef& ref) {
  try {
    return nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    fail_hub(HubErrorKind::kInvalid, "{}: {} is not valid JSON: {}", ref.display(), kIndexFile,
             e.what());
  }
}

[[noreturn]] void fail_no_weights(const RepoRef& ref, const RepoListing& listing,
                                  const std::string& reason) {
  std::string others;
  bool has_gguf = false;
  for (const auto& file : listing.files) {
    for (const char* extension :
         {".bin", ".gguf", ".pt", ".pth", ".ckpt", ".h5", ".msgpack", ".onnx", ".npz"}) {
      if (ends_with(file.path, extension)) others += (others.empty() ? "" : ", ") + file.path;
    }
    has_gguf |= ends_with(file.path, ".gguf");
  }
  fail_hub(HubErrorKind::kNoWeights,
           "{} has no weights dspark can load: {}; dspark loads config.json with .safetensors "
           "weights (MLX or Hugging Face layout){}{}",
           ref.display(), reason, others.empty() ? "" : ". The repo has " + others,
           has_gguf ? "; to use a GGUF file, download it and pass its path to --model" : "");
}

}  // namespace

bool is_model_metadata_file(const std::string& path) {
  static const std::set<std::string> kFiles = {
      "config.json",           "generation_config.json",  "tokenizer.json",
      "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
      "chat_template.jinja",   "chat_template.json",
  };
  return kFiles.count(path) != 0;
}

RepoListing list_repo(const HubHttp& http, const RepoRef& ref) {
  const std::string what = ref.display();
  const std::string api = http.settings().endpoint + "/api/models/" + ref.repo_id;
  RepoListing listing;
  listing.commit = ref.revision;
  if (!is_commit_hash(ref.revision)) {
    const nlohmann::json info =
        http.get_json(api + "/revision/" + percent_encode(ref.revision, false), what);
    listing.commit = info.is_object() ? info.value("sha", "") : "";
    if (!is_commit_hash(listing.commit)) {
      fail_hub(HubErrorKind::kInvalid, "{}: the hub's revision info names no commit ('{}')", what,
               listing.commit);
    }
  }
  std::optional<std::string> page_url = api + "/tree/" + listing.commit;
  for (int page = 0; page_url && page < kMaxListingPages; ++page) {
    std::optional<std::string> next;
    const nlohmann::json entries = http.get_json(*page_url, what, &next);
    if (!entries.is_array()) {
      fail_hub(HubErrorKind::kInvalid, "{}: the hub's file listing at {} is not a JSON array", what,
               *page_url);
    }
    for (const auto& entry : entries) {
      if (auto file = parse_tree_entry(entry, what)) listing.files.push_back(*file);
    }
    page_url = next;
  }
  return listing;
}

std::string download_snapshot(const RepoRef& ref, const HubSettings& settings,
                              const DownloadOptions& options) {
  if (settings.offline) {
    fail_hub(HubErrorKind::kOffline,
             "{} is not in the Hugging Face cache ({}) and HF_HUB_OFFLINE=1 forbids downloading "
             "it; unset HF_HUB_OFFLINE to download it",
             ref.display(), settings.cache_dir);
  }
  std::optional<SigintGuard> sigint;
  if (options.catch_sigint) sigint.emplace();
  const HubHttp http(settings);
  const RepoListing listing = list_repo(http, ref);
  SnapshotDownload download(http, ref, listing.commit, options);

  if (find_file(listing, "config.json") == nullptr) fail_no_weights(ref, listing, "no config.json");
  std::vector<RemoteFile> wanted;
  for (const auto& file : listing.files) {
    if (is_model_metadata_file(file.path)) wanted.push_back(file);
  }
  if (const RemoteFile* index = find_file(listing, kIndexFile)) {
    // The index decides which shards belong to the model (repos may also hold other weights).
    const fs::path cached_index = download.cache().snapshot_dir(listing.commit) / kIndexFile;
    const nlohmann::json parsed = download.present(*index)
                                      ? read_json_file(cached_index.string())
                                      : parse_index(download.read_small_file(*index), ref);
    wanted.push_back(*index);
    std::set<std::string> shards;
    if (parsed.contains("weight_map") && parsed["weight_map"].is_object()) {
      for (const auto& [tensor, shard] : parsed["weight_map"].items()) {
        if (shard.is_string()) shards.insert(shard.get<std::string>());
      }
    }
    if (shards.empty()) fail_no_weights(ref, listing, "its safetensors index lists no shards");
    for (const auto& shard : shards) {
      const RemoteFile* file = find_file(listing, shard);
      if (file == nullptr) {
        fail_hub(HubErrorKind::kCorrupt, "{}: {} lists shard '{}', which the repo does not have",
                 ref.display(), kIndexFile, shard);
      }
      wanted.push_back(*file);
    }
  } else if (const RemoteFile* single = find_file(listing, "model.safetensors")) {
    wanted.push_back(*single);
  } else {
    const size_t before = wanted.size();
    for (const auto& file : listing.files) {
      if (ends_with(file.path, ".safetensors")) wanted.push_back(file);
    }
    if (wanted.size() == before) fail_no_weights(ref, listing, "no .safetensors files");
  }

  std::vector<RemoteFile> missing;
  int64_t missing_bytes = 0;
  int64_t partial_bytes = 0;
  for (const auto& file : wanted) {
    if (download.present(file)) continue;
    missing.push_back(file);
    missing_bytes += file.size;
    std::error_code error;
    const auto partial = fs::file_size(download.cache().incomplete_path(file.etag), error);
    if (!error) partial_bytes += static_cast<int64_t>(std::min<uintmax_t>(partial, file.size));
  }
  if (!missing.empty()) {
    // Both at once, as huggingface_hub does: its cache scan rejects a repo without snapshots/.
    fs::create_directories(download.cache().repo_dir() / "blobs");
    fs::create_directories(download.cache().snapshot_dir(listing.commit));
    check_free_space((download.cache().repo_dir() / "blobs").string(),
                     missing_bytes - partial_bytes);
    DownloadProgress progress(options.progress, ref.display(), missing_bytes,
                              static_cast<int>(missing.size()));
    progress.note(fmt::format("downloading {} files ({}) of commit {} into {}", missing.size(),
                              human_bytes(missing_bytes), listing.commit.substr(0, 12),
                              download.cache().repo_dir().string()));
    download.fetch(missing, progress);
    progress.finish();
  }
  download.cache().write_ref(ref.revision, listing.commit);
  return download.cache().snapshot_dir(listing.commit).string();
}

}  // namespace dspark
