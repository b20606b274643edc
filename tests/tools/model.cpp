// Runs a model over a token script for the oracle tests.
//
//   dspark_tool_model CHECKPOINT_DIR SCRIPT.json OUT_DIR
//
// SCRIPT.json: {"prefill_chunk": 2048 (optional), "steps": [STEP, ...]} where STEP is one of
//   {"op": "forward", "tokens": [...], "logit_rows": [...] | "all", "tap_layers": [...]}
//   {"op": "recording", "on": true|false}
//   {"op": "trim", "length": N}
//   {"op": "snapshot"}   {"op": "restore"}   (one saved snapshot)
//   {"op": "reset"}
// Forward step i writes OUT_DIR/step{i}_logits.npy [rows, vocab] and, when taps were asked for,
// OUT_DIR/step{i}_taps.npy [tokens, taps, hidden] (float32). OUT_DIR/info.json describes the model.
#include "model/model.h"

#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "base/error.h"
#include "formats/checkpoint.h"

namespace {

void write_npy(const std::string& path, const std::vector<float>& data,
               const std::vector<int64_t>& shape) {
  std::string dims;
  for (int64_t d : shape) dims += std::to_string(d) + ", ";
  std::string header = "{'descr': '<f4', 'fortran_order': False, 'shape': (" + dims + "), }";
  const size_t unpadded = 10 + header.size() + 1;
  header.append((64 - unpadded % 64) % 64, ' ');
  header += '\n';
  std::ofstream out(path, std::ios::binary);
  if (!out) dspark::fail("cannot write {}", path);
  out.write("\x93NUMPY\x01\x00", 8);
  const uint16_t length = static_cast<uint16_t>(header.size());
  out.write(reinterpret_cast<const char*>(&length), 2);
  out.write(header.data(), static_cast<std::streamsize>(header.size()));
  out.write(reinterpret_cast<const char*>(data.data()),
            static_cast<std::streamsize>(data.size() * sizeof(float)));
  if (!out) dspark::fail("cannot write {}", path);
}

int run(const std::string& checkpoint_dir, const std::string& script_path,
        const std::string& out_dir) {
  const nlohmann::json script = dspark::read_json_file(script_path);
  std::unique_ptr<dspark::Model> model = dspark::load_model(checkpoint_dir);
  if (script.contains("prefill_chunk")) {
    model->set_prefill_chunk(script["prefill_chunk"].get<int64_t>());
  }
  dspark::ModelState state = model->new_state();
  dspark::StateSnapshot saved;
  int step_index = 0;
  for (const auto& step : script.at("steps")) {
    const std::string op = step.at("op").get<std::string>();
    if (op == "forward") {
      const std::vector<int32_t> tokens = step.at("tokens").get<std::vector<int32_t>>();
      const int64_t n = static_cast<int64_t>(tokens.size());
      std::vector<int64_t> rows;
      if (step.contains("logit_rows") && step["logit_rows"].is_string()) {
        for (int64_t r = 0; r < n; ++r) rows.push_back(r);
      } else if (step.contains("logit_rows")) {
        rows = step["logit_rows"].get<std::vector<int64_t>>();
      }
      std::vector<int> taps;
      if (step.contains("tap_layers")) taps = step["tap_layers"].get<std::vector<int>>();
      dspark::ForwardOutput out;
      model->forward(tokens.data(), n, state, rows, taps, out);
      const std::string prefix = out_dir + "/step" + std::to_string(step_index);
      write_npy(prefix + "_logits.npy", out.logits,
                {static_cast<int64_t>(rows.size()), model->vocab_size()});
      if (!taps.empty()) {
        write_npy(prefix + "_taps.npy", out.taps,
                  {n, static_cast<int64_t>(taps.size()), model->hidden_size()});
      }
    } else if (op == "recording") {
      state.set_recording(step.at("on").get<bool>());
    } else if (op == "trim") {
      state.trim(step.at("length").get<int64_t>());
    } else if (op == "snapshot") {
      saved = state.snapshot();
    } else if (op == "restore") {
      state.restore(saved);
    } else if (op == "reset") {
      state.reset();
    } else {
      dspark::fail("{}: unknown op '{}' in step {}", script_path, op, step_index);
    }
    ++step_index;
  }
  nlohmann::json info = {{"architecture", model->architecture()},
                         {"vocab_size", model->vocab_size()},
                         {"num_layers", model->num_layers()},
                         {"hidden_size", model->hidden_size()},
                         {"layer_kinds", model->config().layer_kinds},
                         {"decode_weight_bytes", model->decode_weight_bytes()},
                         {"length", state.length()}};
  std::ofstream(out_dir + "/info.json") << info.dump(2) << "\n";
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 4) {
    std::fprintf(stderr, "usage: %s CHECKPOINT_DIR SCRIPT.json OUT_DIR\n", argv[0]);
    return 2;
  }
  try {
    return run(argv[1], argv[2], argv[3]);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
