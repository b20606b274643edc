#!/usr/bin/env bash
# Installs what dspark needs on a fresh Debian machine and builds it.
#   scripts/setup.sh            Debian packages + Release build in build/
#   scripts/setup.sh --venv     also the Python venv with the test oracles (PyPI)
# Environment: DSPARK_VENV (default ~/.cache/dspark/venv), DSPARK_BUILD (default build).
set -euo pipefail
cd "$(dirname "$0")/.."

APT_PACKAGES=(build-essential cmake ninja-build pkg-config git python3 python3-venv python3-pip
  nlohmann-json3-dev libcpp-httplib-dev libcli11-dev libfmt-dev libpcre2-dev libicu-dev libssl-dev
  libgtest-dev libgmock-dev libbenchmark-dev librsvg2-bin)

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

if [[ "${1:-}" == "--venv" ]]; then
  VENV="${DSPARK_VENV:-$HOME/.cache/dspark/venv}"
  stamp="$VENV/.requirements.sha256"
  wanted=$(cat scripts/requirements-test.txt scripts/requirements-test-nodeps.txt | sha256sum | cut -d' ' -f1)
  if [[ ! -x "$VENV/bin/python" || ! -f "$stamp" || "$(cat "$stamp")" != "$wanted" ]]; then
    echo "setup: creating the test venv in $VENV (PyPI oracles; llama-cpp-python compiles, be patient)"
    PYTHON=python3
    command -v python3.11 >/dev/null && PYTHON=python3.11
    "$PYTHON" -m venv "$VENV"
    "$VENV/bin/pip" install -q --upgrade pip
    "$VENV/bin/pip" install -q -r scripts/requirements-test.txt
    "$VENV/bin/pip" install -q --no-deps -r scripts/requirements-test-nodeps.txt
    echo "$wanted" > "$stamp"
  fi
fi

BUILD="${DSPARK_BUILD:-build}"
cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DDSPARK_VENV="${DSPARK_VENV:-$HOME/.cache/dspark/venv}" >/dev/null
cmake --build "$BUILD" -j"$(nproc)"
