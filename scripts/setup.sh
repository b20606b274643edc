#!/usr/bin/env bash
# Installs what dspark needs on a fresh Debian machine and builds it.
#   scripts/setup.sh            Debian packages + the dspark binary (Release, in build/)
#   scripts/setup.sh --tests    also the Python venv with the test oracles (PyPI, exact versions
#                               and hashes from scripts/requirements-test*.lock) and every test
#                               and benchmark program
# Environment: DSPARK_VENV (default ~/.cache/dspark/venv), DSPARK_BUILD (default build).
set -euo pipefail
cd "$(dirname "$0")/.."

APT_PACKAGES=(build-essential cmake ninja-build pkg-config git python3 python3-venv python3-pip
  nlohmann-json3-dev libcpp-httplib-dev libcli11-dev libfmt-dev libpcre2-dev libicu-dev libssl-dev
  libgtest-dev libgmock-dev libbenchmark-dev librsvg2-bin ccache)
with_tests=0
[[ "${1:-}" == "--tests" ]] && with_tests=1
# The sanitizer build and the fuzz harnesses use clang (scripts/test.sh).
((with_tests)) && APT_PACKAGES+=(clang libclang-rt-14-dev)

missing=()
for package in "${APT_PACKAGES[@]}"; do
  dpkg -s "$package" >/dev/null 2>&1 || missing+=("$package")
done
if ((${#missing[@]})); then
  echo "setup: installing Debian packages: ${missing[*]}"
  SUDO=""
  [[ $(id -u) -ne 0 ]] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi

VENV="${DSPARK_VENV:-$HOME/.cache/dspark/venv}"
# llama-cpp-python compiles llama.cpp for this CPU (-march=native), with ggml's AMX matmul where the
# CPU lists AMX; a VM can list it and still fault on the tile instructions (SIGILL on an Emerald
# Rapids Firecracker guest, docs/benchmarks session 35). The oracle needs none of it.
LLAMA_CPP_FLAGS="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
if ((with_tests)); then
  stamp="$VENV/.requirements.sha256"
  wanted=$( (cat scripts/requirements-test.lock scripts/requirements-test-nodeps.lock
    echo "$LLAMA_CPP_FLAGS") | sha256sum | cut -d' ' -f1)
  if [[ ! -x "$VENV/bin/python" || ! -f "$stamp" || "$(cat "$stamp")" != "$wanted" ]]; then
    # A venv made from other pins is made anew, so that nothing outside the lock lingers.
    echo "setup: creating the test venv in $VENV (PyPI oracles; llama-cpp-python compiles, be patient)"
    PYTHON=python3
    command -v python3.11 >/dev/null && PYTHON=python3.11
    rm -rf "$VENV"
    "$PYTHON" -m venv "$VENV"
    # No cache: a wheel built earlier with other flags would be reused.
    CFLAGS="$LLAMA_CPP_FLAGS" CXXFLAGS="$LLAMA_CPP_FLAGS" "$VENV/bin/pip" install -q --no-cache-dir \
      --require-hashes -r scripts/requirements-test.lock
    "$VENV/bin/pip" install -q --require-hashes --no-deps -r scripts/requirements-test-nodeps.lock
    echo "$wanted" > "$stamp"
  fi
fi

BUILD="${DSPARK_BUILD:-build}"
# ccache makes a rebuild of an unchanged file (another checkout, a clean clone) a cache hit,
# wherever the clone lies.
export CCACHE_BASEDIR="$PWD" CCACHE_NOHASHDIR=1
cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DDSPARK_VENV="$VENV" \
  -DCMAKE_CXX_COMPILER_LAUNCHER=ccache >/dev/null
if ((with_tests)); then
  cmake --build "$BUILD" -j"$(nproc)"
else
  cmake --build "$BUILD" -j"$(nproc)" --target dspark
fi
