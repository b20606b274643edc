// dspark_tool_hub: drives the hub module for tests/oracle/test_hub.py.
//   resolve <model> [options]          --model resolution (cache, download, GGUF, models dir)
//   find-or-download <repo> [options]  the drafter lookup: a path, or "absent"
//   cached <repo[@rev]>                the cache only: a path, or "absent"
//   companions <target repo> <marker>  cached companion repos, one per line
//   load <dir>                         opens the checkpoint; prints its tensors as JSON
// options: --models-dir DIR, --parallel N, --attempts N, --retry-pause SECONDS, --plain (progress
// as lines even on a terminal), --offline (as HF_HUB_OFFLINE=1)
// The hub settings come from the environment (HF_ENDPOINT, HF_HUB_CACHE, HF_TOKEN, ...).
// Exit codes: 0 ok, 1 error (stderr: "error[<kind>]: <message>"), 130 interrupted, 2 usage.
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "base/error.h"
#include "formats/checkpoint.h"
#include "hub/checksum.h"
#include "hub/hub_error.h"
#include "hub/resolve.h"

namespace {

const char* kind_name(dspark::HubErrorKind kind) {
  using dspark::HubErrorKind;
  switch (kind) {
    case HubErrorKind::kNotFound:
      return "not_found";
    case HubErrorKind::kUnauthorized:
      return "unauthorized";
    case HubErrorKind::kGated:
      return "gated";
    case HubErrorKind::kOffline:
      return "offline";
    case HubErrorKind::kNetwork:
      return "network";
    case HubErrorKind::kCorrupt:
      return "corrupt";
    case HubErrorKind::kDiskFull:
      return "disk_full";
    case HubErrorKind::kNoWeights:
      return "no_weights";
    case HubErrorKind::kInterrupted:
      return "interrupted";
    case HubErrorKind::kInvalid:
      return "invalid";
  }
  return "?";
}

nlohmann::json describe_checkpoint(const std::string& dir) {
  const dspark::Checkpoint checkpoint(dir);
  nlohmann::json tensors = nlohmann::json::object();
  for (const auto& name : checkpoint.names()) {
    const dspark::TensorView& view = checkpoint.tensor(name);
    tensors[name] = {
        {"dtype", std::string(dspark::dtype_name(view.dtype))},
        {"shape", view.shape},
        {"sha256", dspark::Digest::sha256_hex(
                       std::string(reinterpret_cast<const char*>(view.data), view.nbytes))},
    };
  }
  return {{"config", checkpoint.config()}, {"tensors", tensors}};
}

int usage() {
  std::fprintf(stderr,
               "usage: dspark_tool_hub resolve|find-or-download|cached|companions|load ...\n");
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> positional;
  dspark::ResolveOptions options;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    const bool has_value = i + 1 < argc;
    if (arg == "--models-dir" && has_value) {
      options.models_dir = argv[++i];
    } else if (arg == "--parallel" && has_value) {
      options.download.parallel_files = std::stoi(argv[++i]);
    } else if (arg == "--attempts" && has_value) {
      options.download.max_attempts = std::stoi(argv[++i]);
    } else if (arg == "--retry-pause" && has_value) {
      options.download.retry_pause_seconds = std::stod(argv[++i]);
    } else if (arg == "--offline") {
      options.hub.offline = true;
    } else if (arg == "--plain") {
      options.download.progress = dspark::DownloadProgress::Style::kLines;
    } else {
      positional.push_back(arg);
    }
  }
  if (positional.empty()) return usage();
  const std::string& command = positional[0];
  try {
    if (command == "resolve" && positional.size() == 2) {
      std::printf("%s\n", dspark::resolve_model_or_download(positional[1], options).c_str());
    } else if (command == "find-or-download" && positional.size() == 2) {
      const auto path = dspark::find_or_download_repo(positional[1], options.hub, options.download);
      std::printf("%s\n", path ? path->c_str() : "absent");
    } else if (command == "cached" && positional.size() == 2) {
      const auto ref = dspark::parse_repo_ref(positional[1]);
      const auto path = ref ? dspark::find_cached_snapshot(*ref, options.hub) : std::nullopt;
      std::printf("%s\n", path ? path->c_str() : "absent");
    } else if (command == "companions" && positional.size() == 3) {
      for (const auto& id :
           dspark::find_cached_companions(positional[1], positional[2], options.hub)) {
        std::printf("%s\n", id.c_str());
      }
    } else if (command == "load" && positional.size() == 2) {
      std::printf("%s\n", describe_checkpoint(positional[1]).dump().c_str());
    } else {
      return usage();
    }
    return 0;
  } catch (const dspark::HubError& e) {
    std::fprintf(stderr, "error[%s]: %s\n", kind_name(e.kind()), e.what());
    return e.kind() == dspark::HubErrorKind::kInterrupted ? 130 : 1;
  } catch (const dspark::Error& e) {
    std::fprintf(stderr, "error[other]: %s\n", e.what());
    return 1;
  }
}
