// The backend memory contract (backend/backend.h): transfers check their ranges and backends, the
// test backend seals its memory outside compute sections, and a state's snapshots, restores and
// rollbacks in a sealed backend give the CPU backend's bits.
#include "backend/backend.h"

#include <gtest/gtest.h>

#include <numeric>
#include <vector>

#include "../error_of.h"
#include "../sealed_backend.h"
#include "model/model.h"
#include "tiny_checkpoint.h"

namespace dspark {
namespace {

using testing::error_of;

TEST(Backend, TransfersMoveBytesAndCheckTheirRanges) {
  backend::Backend& cpu = backend::cpu_backend();
  backend::Buffer buffer = cpu.allocate(16);
  std::vector<uint8_t> host(16, 0xff);
  cpu.download(buffer, 0, 16, host.data());
  EXPECT_EQ(host, std::vector<uint8_t>(16, 0));  // allocations are zeroed
  std::iota(host.begin(), host.end(), uint8_t{1});
  cpu.upload(host.data(), buffer, 0, 16);
  const backend::Buffer copy = cpu.duplicate(buffer, 4, 8);
  std::vector<uint8_t> back(8);
  cpu.download(copy, 0, 8, back.data());
  EXPECT_EQ(back, std::vector<uint8_t>(host.begin() + 4, host.begin() + 12));
  cpu.fill_zero(buffer, 2, 3);
  cpu.download(buffer, 0, 6, back.data());
  EXPECT_EQ(std::vector<uint8_t>(back.begin(), back.begin() + 6),
            (std::vector<uint8_t>{1, 2, 0, 0, 0, 6}));

  EXPECT_NE(error_of([&] {
              cpu.download(buffer, 10, 7, back.data());
            }).find("download of bytes [10, 17) outside a buffer of 16"),
            std::string::npos);
  EXPECT_NE(error_of([&] { cpu.fill_zero(buffer, -1, 2); }).find("fill of bytes [-1, 1)"),
            std::string::npos);
  EXPECT_NE(error_of([&] { cpu.allocate(-5); }).find("cannot allocate -5 bytes"),
            std::string::npos);
  testing::SealedBackend sealed;
  backend::Buffer elsewhere = sealed.allocate(16);
  EXPECT_NE(error_of([&] {
              cpu.copy(elsewhere, 0, buffer, 0, 4);
            }).find("copy on a buffer of another backend"),
            std::string::npos);
}

TEST(SealedBackend, ItsMemoryFaultsOutsideComputeSections) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  testing::SealedBackend sealed;
  backend::Buffer buffer = sealed.allocate(64);
  const float value = 2.5f;
  sealed.upload(&value, buffer, 8, sizeof value);
  {
    const backend::ComputeSection section(sealed);
    EXPECT_EQ(buffer.as<float>()[2], 2.5f);
  }
  EXPECT_DEATH(
      {
        volatile float read = buffer.as<float>()[2];
        (void)read;
      },
      "");
}

// Prefix-cache work on a sealed pool: snapshots, a recorded verify rolled back, restores; every
// state and every logit equals the same work on the CPU backend, and a snapshot of one backend
// does not restore into another.
TEST(SealedBackend, SnapshotsRestoresAndRollbacksGiveTheCpuBits) {
  testing::TinyCheckpoint checkpoint(5);
  testing::fill_nemotron(checkpoint, "M*EM-");
  const auto model = load_model(checkpoint.write());
  testing::SealedBackend sealed;
  StatePool cpu_pool = model->new_pool(1), sealed_pool = model->new_pool(1, sealed);
  struct Side {
    StatePool& pool;
    SequenceId id;
    std::vector<float> logits;
  };
  std::vector<Side> sides = {{cpu_pool, cpu_pool.open(), {}},
                             {sealed_pool, sealed_pool.open(), {}}};
  auto run = [&](Side& side, const std::vector<int32_t>& tokens) {
    ForwardOutput out;
    std::vector<int64_t> rows(tokens.size());
    std::iota(rows.begin(), rows.end(), 0);
    model->forward_batch(
        {{tokens.data(), static_cast<int64_t>(tokens.size()), side.id, rows, {}, &out}}, side.pool);
    side.logits.insert(side.logits.end(), out.logits.begin(), out.logits.end());
  };
  for (Side& side : sides) {
    run(side, {3, 1, 4, 1, 5, 9, 2});
    const StateSnapshot prompt = side.pool.snapshot(side.id);
    side.pool.set_recording(side.id, true);
    run(side, {6, 5, 3, 5, 8});
    side.pool.trim(side.id, 9);
    run(side, {7, 9});
    side.pool.restore(side.id, prompt);
    run(side, {2, 7});
    EXPECT_EQ(side.pool.length(side.id), 9);
  }
  EXPECT_EQ(sides[0].logits, sides[1].logits);
  EXPECT_TRUE(cpu_pool.contents(sides[0].id) == sealed_pool.contents(sides[1].id));
  EXPECT_GT(sealed.sections(), 0);
  const StateSnapshot sealed_snapshot = sealed_pool.snapshot(sides[1].id);
  EXPECT_NE(error_of([&] { cpu_pool.restore(sides[0].id, sealed_snapshot); }).find("backend"),
            std::string::npos);
}

}  // namespace
}  // namespace dspark
