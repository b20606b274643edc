#!/usr/bin/env bash
# Re-resolves the test oracles: scripts/requirements-test*.in (what we ask for) into
# scripts/requirements-test*.lock (every package at an exact version, with the sha256 of each of
# its files on PyPI), which scripts/setup.sh --venv installs with --require-hashes.
#
# To upgrade an oracle: change or drop its pin in the .in file, run this script, run
# scripts/test.sh, and commit the .in and .lock files together.
# The resolution targets CPython 3.11 on x86-64 Linux (glibc 2.36, Debian 12), the machines
# dspark is tested on. uv comes from PyPI at a pinned version, in a throwaway venv.
set -euo pipefail
cd "$(dirname "$0")/.."
tools="$(mktemp -d)"
trap 'rm -rf "$tools"' EXIT
python3 -m venv "$tools"
"$tools/bin/pip" install -q uv==0.13.8
compile() {
  "$tools/bin/uv" pip compile --quiet --generate-hashes --no-header --python-version 3.11 \
    --python-platform x86_64-manylinux_2_36 "$@"
}
compile scripts/requirements-test.in -o scripts/requirements-test.lock
compile --no-deps scripts/requirements-test-nodeps.in -o scripts/requirements-test-nodeps.lock
echo "lock: wrote scripts/requirements-test.lock and scripts/requirements-test-nodeps.lock"
