// AVX-VNNI (VEX vpdpbusd / vpdpwssd) kernel of the int8 numerics: the 256-bit tiles of
// int8_tiles_256.h compiled with -mavxvnni, for CPUs with AVX-VNNI but no AVX-512 (Alder Lake and
// later Intel client cores). It reads activations in quantize_activations_avx2's order.
#include "kernels/cpu/int8_tiles_256.h"

namespace dspark::kernels::cpu {

void int8_rows_avxvnni(const Int8Task& task, int64_t row_begin, int64_t row_end) {
  int8_rows_any(task, row_begin, row_end);
}

}  // namespace dspark::kernels::cpu
