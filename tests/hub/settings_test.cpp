#include "hub/settings.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>

namespace dspark {
namespace {

namespace fs = std::filesystem;

// Sets environment variables for one test and restores them afterwards.
class ScopedEnvironment {
 public:
  ScopedEnvironment() {
    for (const char* name :
         {"HF_ENDPOINT", "HF_HOME", "HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "XDG_CACHE_HOME",
          "HF_TOKEN", "HF_TOKEN_PATH", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HOME"}) {
      const char* value = std::getenv(name);
      saved_[name] = value ? std::optional<std::string>(value) : std::nullopt;
      if (std::string(name) != "HOME") ::unsetenv(name);
    }
  }
  ~ScopedEnvironment() {
    for (const auto& [name, value] : saved_) {
      if (value) {
        ::setenv(name.c_str(), value->c_str(), 1);
      } else {
        ::unsetenv(name.c_str());
      }
    }
  }
  void set(const char* name, const std::string& value) { ::setenv(name, value.c_str(), 1); }

 private:
  std::map<std::string, std::optional<std::string>> saved_;
};

TEST(HubSettingsTest, DefaultsMatchHuggingfaceHub) {
  ScopedEnvironment environment;
  environment.set("HOME", "/home/someone");
  const HubSettings settings = HubSettings::from_environment();
  EXPECT_EQ(settings.endpoint, "https://huggingface.co");
  EXPECT_EQ(settings.cache_dir, "/home/someone/.cache/huggingface/hub");
  EXPECT_FALSE(settings.offline);
}

TEST(HubSettingsTest, EnvironmentOverridesInHuggingfaceHubOrder) {
  ScopedEnvironment environment;
  environment.set("HOME", "/home/someone");
  environment.set("XDG_CACHE_HOME", "/xdg");
  EXPECT_EQ(HubSettings::from_environment().cache_dir, "/xdg/huggingface/hub");
  environment.set("HF_HOME", "~/hf");
  EXPECT_EQ(HubSettings::from_environment().cache_dir, "/home/someone/hf/hub");
  environment.set("HUGGINGFACE_HUB_CACHE", "/legacy");
  EXPECT_EQ(HubSettings::from_environment().cache_dir, "/legacy");
  environment.set("HF_HUB_CACHE", "/hub-cache");
  EXPECT_EQ(HubSettings::from_environment().cache_dir, "/hub-cache");

  environment.set("HF_ENDPOINT", "http://127.0.0.1:8000//");
  EXPECT_EQ(HubSettings::from_environment().endpoint, "http://127.0.0.1:8000");

  for (const char* value : {"1", "true", "ON", "yes"}) {
    environment.set("HF_HUB_OFFLINE", value);
    EXPECT_TRUE(HubSettings::from_environment().offline) << value;
  }
  environment.set("HF_HUB_OFFLINE", "0");
  EXPECT_FALSE(HubSettings::from_environment().offline);
  environment.set("TRANSFORMERS_OFFLINE", "1");
  EXPECT_TRUE(HubSettings::from_environment().offline);
}

TEST(HubSettingsTest, TokenFromEnvironmentElseFromTheLoginFile) {
  ScopedEnvironment environment;
  const fs::path home =
      fs::temp_directory_path() / ("dspark_hub_home_" + std::to_string(::getpid()));
  fs::create_directories(home);
  environment.set("HF_HOME", home.string());
  EXPECT_EQ(HubSettings::from_environment().token, "");
  std::ofstream(home / "token") << "hf_fromfile\n";
  EXPECT_EQ(HubSettings::from_environment().token, "hf_fromfile");
  environment.set("HF_TOKEN", "hf_fromenv");
  EXPECT_EQ(HubSettings::from_environment().token, "hf_fromenv");
  fs::remove_all(home);
}

}  // namespace
}  // namespace dspark
