#pragma once
// Where the hub is and where its cache lives, read from the same environment variables as the
// huggingface_hub Python package so that dspark and other tools share one cache and one token.
#include <string>

namespace dspark {

struct HubSettings {
  // HF_ENDPOINT, default https://huggingface.co (trailing '/' removed).
  std::string endpoint;
  // HF_HUB_CACHE, else HUGGINGFACE_HUB_CACHE, else $HF_HOME/hub; HF_HOME defaults to
  // $XDG_CACHE_HOME/huggingface, else ~/.cache/huggingface.
  std::string cache_dir;
  // HF_TOKEN, else the token file that `hf auth login` writes ($HF_TOKEN_PATH, else
  // $HF_HOME/token); empty when there is none.
  std::string token;
  // HF_HUB_OFFLINE (or TRANSFORMERS_OFFLINE) set to 1/ON/YES/TRUE: never touch the network.
  bool offline = false;

  static HubSettings from_environment();
};

}  // namespace dspark
