#include "hub/settings.h"

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace dspark {
namespace fs = std::filesystem;
namespace {

std::string env(const char* name) {
  const char* value = std::getenv(name);
  return value != nullptr ? value : "";
}

std::string expand_home(const std::string& path) {
  if (path == "~" || path.rfind("~/", 0) == 0) return env("HOME") + path.substr(1);
  return path;
}

bool is_true(std::string value) {
  std::transform(value.begin(), value.end(), value.begin(),
                 [](unsigned char c) { return static_cast<char>(std::toupper(c)); });
  return value == "1" || value == "ON" || value == "YES" || value == "TRUE";
}

std::string trim(const std::string& text) {
  const auto begin = text.find_first_not_of(" \t\r\n");
  if (begin == std::string::npos) return "";
  return text.substr(begin, text.find_last_not_of(" \t\r\n") - begin + 1);
}

}  // namespace

HubSettings HubSettings::from_environment() {
  HubSettings settings;
  settings.endpoint = env("HF_ENDPOINT");
  if (settings.endpoint.empty()) settings.endpoint = "https://huggingface.co";
  while (!settings.endpoint.empty() && settings.endpoint.back() == '/') {
    settings.endpoint.pop_back();
  }

  std::string home = expand_home(env("HF_HOME"));
  if (home.empty()) {
    const std::string xdg = expand_home(env("XDG_CACHE_HOME"));
    home =
        ((xdg.empty() ? fs::path(env("HOME")) / ".cache" : fs::path(xdg)) / "huggingface").string();
  }
  settings.cache_dir = expand_home(env("HF_HUB_CACHE"));
  if (settings.cache_dir.empty()) settings.cache_dir = expand_home(env("HUGGINGFACE_HUB_CACHE"));
  if (settings.cache_dir.empty()) settings.cache_dir = (fs::path(home) / "hub").string();

  settings.token = trim(env("HF_TOKEN"));
  if (settings.token.empty()) {
    std::string token_path = expand_home(env("HF_TOKEN_PATH"));
    if (token_path.empty()) token_path = (fs::path(home) / "token").string();
    std::ifstream in(token_path);
    if (in) {
      std::stringstream text;
      text << in.rdbuf();
      settings.token = trim(text.str());
    }
  }
  settings.offline = is_true(env("HF_HUB_OFFLINE")) || is_true(env("TRANSFORMERS_OFFLINE"));
  return settings;
}

}  // namespace dspark
