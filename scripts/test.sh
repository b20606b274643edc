#!/usr/bin/env bash
# The test command: installs everything the tests need (Debian packages, the PyPI oracle venv, the
# default model), builds Release and runs every test (unit + oracle), then builds the tests with
# AddressSanitizer + UndefinedBehaviorSanitizer and runs the unit tests again (those on the real
# default model are left to the Release run: they are the slow ones under a sanitizer).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh --venv
scripts/install_default_model.sh
jobs="$(nproc)"
(cd build && ctest --output-on-failure -j"$jobs" --timeout 1500)

cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=Debug -DDSPARK_SANITIZE=ON \
  -DDSPARK_BUILD_BENCH=OFF -DDSPARK_VENV="${DSPARK_VENV:-$HOME/.cache/dspark/venv}" >/dev/null
cmake --build build-asan -j"$jobs"
(cd build-asan && ASAN_OPTIONS=detect_leaks=1 ctest --output-on-failure -L unit -E DefaultModel \
  -j"$jobs" --timeout 1500)
