#pragma once
// Internal to the int8 kernels: the walk over a task's tiles, shared by the ISA units. Templates in
// an anonymous namespace, so that each unit, compiled with its own flags, keeps its own copy.
#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "kernels/cpu/quant_impl.h"

namespace dspark::kernels::cpu {
namespace {

// Calls tile(row, rows, i0, i1) for output rows [row_begin, row_end) in tiles of at most TileRows
// rows, against activation rows in blocks of at most BlockRows; tile is handed the task's bit
// width and blocks per group as integral constants: tile.template operator()<Bits, Blocks>(...).
template <int TileRows, int64_t BlockRows, typename Tile>
void for_each_int8_tile(const Int8Task& task, int64_t row_begin, int64_t row_end,
                        const Tile& tile) {
  const auto walk = [&](auto bits, auto blocks) {
    for (int64_t i0 = 0; i0 < task.m; i0 += BlockRows) {
      const int64_t i1 = std::min(task.m, i0 + BlockRows);
      for (int64_t row = row_begin; row < row_end; row += TileRows) {
        const int rows = static_cast<int>(std::min<int64_t>(TileRows, row_end - row));
        tile.template operator()<decltype(bits)::value, decltype(blocks)::value>(row, rows, i0, i1);
      }
    }
  };
  const auto with_group = [&](auto bits) {
    switch (task.w->format.group_size) {
      case 32:
        return walk(bits, std::integral_constant<int, 1>{});
      case 64:
        return walk(bits, std::integral_constant<int, 2>{});
      default:
        return walk(bits, std::integral_constant<int, 4>{});
    }
  };
  switch (task.w->format.bits) {
    case 2:
      return with_group(std::integral_constant<int, 2>{});
    case 3:
      return with_group(std::integral_constant<int, 3>{});
    case 4:
      return with_group(std::integral_constant<int, 4>{});
    case 5:
      return with_group(std::integral_constant<int, 5>{});
    case 6:
      return with_group(std::integral_constant<int, 6>{});
    default:
      return with_group(std::integral_constant<int, 8>{});
  }
}

}  // namespace
}  // namespace dspark::kernels::cpu
