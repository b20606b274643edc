#!/usr/bin/env bash
# Builds llama.cpp's llama-bench for this CPU (-DGGML_NATIVE=ON) from the llama.cpp tree inside the
# llama-cpp-python source distribution on PyPI, at the version the tests pin, so the benchmark
# compares against the same llama.cpp code as the oracle tests. Prints the binary's path.
#
#   scripts/build_llama_bench.sh [WORK_DIR]      (default ~/.cache/dspark/llama.cpp)
#
# LLAMA_CMAKE_ARGS adds cmake flags, e.g. "-DGGML_NATIVE=OFF -DGGML_AVX512=OFF". The binary needs
# its own directory on LD_LIBRARY_PATH (bench/llama_bench_side_by_side.py sets it). Where the CPU
# lists AMX but the VM does not run it (llama-bench dies with SIGILL in tinygemm_kernel_amx), build
# the native ISA set without AMX instead: "-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON
# -DGGML_BMI2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_AVX_VNNI=ON -DGGML_AVX512=ON
# -DGGML_AVX512_VBMI=ON -DGGML_AVX512_VNNI=ON -DGGML_AVX512_BF16=ON" (docs/benchmarks, session 35);
# remove the old build directory first, since an existing binary is kept.
set -euo pipefail
cd "$(dirname "$0")/.."
version=$(sed -n 's/^llama-cpp-python==\([0-9.]*\).*/\1/p' scripts/requirements-test-nodeps.lock \
  scripts/requirements-test.lock | head -1)
[[ -n "$version" ]] || { echo "build_llama_bench: no llama-cpp-python pin in the lock files" >&2; exit 1; }
work=${1:-$HOME/.cache/dspark/llama.cpp}
source_dir=$work/llama-cpp-python-$version
build=$source_dir/vendor/llama.cpp/build
binary=$build/bin/llama-bench
if [[ ! -x "$binary" ]]; then
  mkdir -p "$work"
  python3 -m pip download -q --no-deps --no-binary :all: -d "$work" "llama-cpp-python==$version" >&2
  rm -rf "$source_dir" && mkdir -p "$source_dir"
  tar xzf "$work/llama_cpp_python-$version.tar.gz" -C "$source_dir" --strip-components=1
  # shellcheck disable=SC2086
  cmake -S "$source_dir/vendor/llama.cpp" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DGGML_NATIVE=ON -DLLAMA_CURL=OFF -DLLAMA_BUILD_SERVER=OFF ${LLAMA_CMAKE_ARGS:-} >&2
  cmake --build "$build" -j"$(nproc)" --target llama-bench >&2
fi
echo "$binary"
