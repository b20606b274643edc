// A fixed amount of work for instruction counts (valgrind --tool=callgrind), which stay
// comparable on a loaded machine where wall-clock timings do not: `forwards` verify forwards of
// `width` rows on the default model after a 64-token context, as verify_bench runs them, rolled
// back after each. Only measured_forwards is the workload; collect it alone, on one thread:
//
//   DSPARK_THREADS=1 valgrind --tool=callgrind --toggle-collect='*measured_forwards*'
//       build/bench/forward_instructions <width> <forwards>
#include <cstdio>
#include <cstdlib>
#include <numeric>
#include <string>
#include <vector>

#include "formats/model_store.h"
#include "model/model.h"

namespace {

constexpr int64_t kContext = 64;

std::vector<int32_t> synthetic_tokens(int64_t n, int64_t vocab, int64_t seed) {
  std::vector<int32_t> tokens(n);
  for (int64_t i = 0; i < n; ++i) {
    tokens[i] = static_cast<int32_t>((1000 + 7919 * (i + seed)) % vocab);
  }
  return tokens;
}

__attribute__((noinline)) float measured_forwards(dspark::Model& model,
                                                  dspark::ModelState& sequence, int64_t width,
                                                  int64_t forwards) {
  const std::vector<int32_t> rows = synthetic_tokens(width, model.vocab_size(), kContext);
  std::vector<int64_t> logit_rows(width);
  std::iota(logit_rows.begin(), logit_rows.end(), 0);
  dspark::ForwardOutput out;
  float checksum = 0.0f;
  for (int64_t k = 0; k < forwards; ++k) {
    model.forward(rows.data(), width, sequence, logit_rows, {}, out);
    checksum += out.logits[0];
    sequence.trim(kContext);
  }
  return checksum;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: %s <width> <forwards>\n", argv[0]);
    return 2;
  }
  const int64_t width = std::atoll(argv[1]), forwards = std::atoll(argv[2]);
  const char* dir = std::getenv("DSPARK_VERIFY_MODEL");
  auto model = dspark::load_model(dir ? dir : dspark::models_dir() + "/SmolLM2-135M-Instruct");
  dspark::ModelState sequence = model->new_state();
  dspark::ForwardOutput out;
  const std::vector<int32_t> context = synthetic_tokens(kContext, model->vocab_size(), 0);
  model->forward(context.data(), kContext, sequence, {kContext - 1}, {}, out);
  // Room for the measured rows up front: the first forward past the context would otherwise grow
  // (allocate, zero and copy) every KV cache inside the count, a cost a decode pays once per 1.5x
  // of context, not per forward.
  sequence.reserve(kContext + width);
  std::printf("checksum %.9g\n", measured_forwards(*model, sequence, width, forwards));
  return 0;
}
