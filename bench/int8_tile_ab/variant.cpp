// One side of the int8 tile A/B (scripts/int8_tile_ab.sh): the 256-bit int8 tiles compiled from
// whichever int8_tiles_256.h comes first on the include path, under the name VARIANT.
#include "kernels/cpu/int8_tiles_256.h"

namespace dspark::kernels::cpu {
void VARIANT(const Int8Task& task, int64_t row_begin, int64_t row_end) {
  int8_rows_any(task, row_begin, row_end);
}
}  // namespace dspark::kernels::cpu
