// config.json from untrusted bytes, read the three ways dspark reads one: as a model's config
// (nemotron_h or dense, over small real checkpoints whose weights the config must then match),
// and as a DSpark or DFlash drafter's config. A config that loads must also run: one forward of
// two tokens, so sizes that pass validation yet disagree with the state or kernels show up.
#include <cstdint>
#include <nlohmann/json.hpp>

#include "../model/tiny_checkpoint.h"
#include "base/error.h"
#include "fuzz_input.h"
#include "model/model.h"
#include "speculative/drafter_loader.h"

namespace {

// The checkpoint directories the fuzzed config.json is dropped into: one per architecture family,
// written once (the weights stay; only config.json changes).
struct Checkpoints {
  dspark::testing::TinyCheckpoint nemotron{1};
  dspark::testing::TinyCheckpoint dense{2};
  std::string nemotron_dir, dense_dir;
  Checkpoints() {
    dspark::testing::fill_nemotron(nemotron, "M*E-");
    dspark::testing::fill_llama(dense);
    nemotron_dir = nemotron.write();
    dense_dir = dense.write();
  }
};

void load_and_run(const std::string& dir, std::string_view config_text) {
  dspark::fuzz::write_file(dir + "/config.json", config_text);
  try {
    const std::unique_ptr<dspark::Model> model = dspark::load_model(dir);
    dspark::ModelState state = model->new_state();
    const int32_t tokens[2] = {1, static_cast<int32_t>(model->vocab_size() - 1)};
    dspark::ForwardOutput out;
    model->forward(tokens, 2, state, {1}, {}, out);
  } catch (const dspark::Error&) {
  }
}

void read_as_drafter(std::string_view config_text) {
  nlohmann::json config;
  try {
    config = nlohmann::json::parse(config_text);
  } catch (const nlohmann::json::exception&) {
    return;  // read_json_file turns this into an Error before any reader sees it
  }
  const std::string source = "drafter/config.json";
  try {
    (void)dspark::detect_drafter_packaging(config, source);
  } catch (const dspark::Error&) {
  }
  try {
    (void)dspark::read_dspark_config(config, source);
  } catch (const dspark::Error&) {
  }
  try {
    (void)dspark::read_dflash_config(config, source);
  } catch (const dspark::Error&) {
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static Checkpoints checkpoints;
  const std::string_view text = dspark::fuzz::as_text(data, size);
  load_and_run(text.find("nemotron_h") != std::string_view::npos ? checkpoints.nemotron_dir
                                                                 : checkpoints.dense_dir,
               text);
  read_as_drafter(text);
  return 0;
}
