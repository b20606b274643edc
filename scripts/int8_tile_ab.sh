#!/usr/bin/env bash
# Paired A/B of the AVX2 int8 tiles (src/kernels/cpu/int8_tiles_256.h) in one process:
# A = the header at REV (default HEAD), B = the working tree's (or the one in B_DIR/kernels/cpu/).
# Both are compiled into one driver (bench/int8_tile_ab/) that alternates them call by call on the
# default model's matrix shapes and checks that their outputs are bit-identical (exit 1 if not).
# Needs the Release build (build/, or DSPARK_BUILD) for the kernels library.
#
#   scripts/int8_tile_ab.sh [REV] [ROUNDS] [WORKING_SET_MIB]   (64: weights from memory; 1: from
#                                                              caches, the compute cost alone)
#   A_IMPL=1 scripts/int8_tile_ab.sh ...                        (A with REV's quant_impl.h too)
set -euo pipefail
cd "$(dirname "$0")/.."
rev="${1:-HEAD}"
rounds="${2:-20}"
working_set="${3:-64}"
build="${DSPARK_BUILD:-build}"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/a/kernels/cpu"
git show "$rev:src/kernels/cpu/int8_tiles_256.h" >"$work/a/kernels/cpu/int8_tiles_256.h"
# Only the constants and helpers may differ: the structs are shared with the kernels library.
if [[ -n "${A_IMPL:-}" ]]; then
  git show "$rev:src/kernels/cpu/quant_impl.h" >"$work/a/kernels/cpu/quant_impl.h"
fi
b_dir="${B_DIR:-src}"
flags=(-O3 -std=c++20 -mavx2 -mfma -mf16c -Wall -Wextra -Werror)
g++ "${flags[@]}" -I"$work/a" -Isrc -DVARIANT=variant_a -c bench/int8_tile_ab/variant.cpp \
  -o "$work/a.o" &
g++ "${flags[@]}" -I"$b_dir" -Isrc -DVARIANT=variant_b -c bench/int8_tile_ab/variant.cpp \
  -o "$work/b.o" &
g++ -O2 -std=c++20 -Wall -Wextra -Werror -Isrc -c bench/int8_tile_ab/driver.cpp -o "$work/driver.o"
wait
g++ "$work/driver.o" "$work/a.o" "$work/b.o" "$build/libdspark_kernels.a" "$build/libdspark_base.a" \
  "$build/libdspark_tensor.a" -lfmt -lpthread -o "$work/int8_tile_ab"
echo "A = $rev, B = ${B_DIR:-the working tree}"
"$work/int8_tile_ab" "$rounds" "$working_set"
