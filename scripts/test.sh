#!/usr/bin/env bash
# The test command: installs everything the tests need (Debian packages, the PyPI oracle venv),
# builds Release and runs every test (unit + oracle), then builds the unit tests with
# AddressSanitizer + UndefinedBehaviorSanitizer and runs them again.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh --venv
jobs="$(nproc)"
(cd build && ctest --output-on-failure -j"$jobs" --timeout 1500)

cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=Debug -DDSPARK_SANITIZE=ON \
  -DDSPARK_BUILD_BENCH=OFF -DDSPARK_VENV="${DSPARK_VENV:-$HOME/.cache/dspark/venv}" >/dev/null
cmake --build build-asan -j"$jobs"
(cd build-asan && ASAN_OPTIONS=detect_leaks=1 ctest --output-on-failure -L unit -j"$jobs" \
  --timeout 1500)
