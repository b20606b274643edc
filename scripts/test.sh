#!/usr/bin/env bash
# The test command. Installs everything the tests need (Debian packages, the PyPI oracle venv
# pinned by scripts/requirements-test*.lock, the default model), builds Release and runs every
# test (unit + oracle) on this CPU's best kernels, runs the unit tests again on each narrower ISA
# the CPU also has (avx2, scalar), then builds with AddressSanitizer + UndefinedBehaviorSanitizer
# and runs the unit tests once more (those on the real default model are left to the Release
# run: they are the slow ones under a sanitizer).
#
# Every stage runs even when an earlier one failed; the script ends with a summary and exits
# non-zero naming the stages that failed. DSPARK_ISA=avx2|scalar set for the whole run makes
# that ISA the "best" one (it simulates a CPU without the wider ones).
set -uo pipefail
cd "$(dirname "$0")/.."
jobs="$(nproc)"
venv="${DSPARK_VENV:-$HOME/.cache/dspark/venv}"
failed=()
timings=()
# A clone anywhere (CI's, a second checkout) hits the compiler cache of an identical file.
export CCACHE_BASEDIR="$PWD" CCACHE_NOHASHDIR=1

stage() {
  local name="$1"
  shift
  echo "=== test.sh: stage '$name'"
  local start=$SECONDS
  if "$@"; then
    timings+=("$name: passed in $((SECONDS - start)) s")
  else
    timings+=("$name: FAILED after $((SECONDS - start)) s")
    failed+=("$name")
  fi
}

# The summary repeats what failed, since a later stage's output pushes it out of a log's tail.
failed_tests=()
ctest_in() {
  local dir="$1"
  shift
  (cd "$dir" && ctest --output-on-failure --timeout 1500 -j"$jobs" "$@") && return 0
  local listed="$dir/Testing/Temporary/LastTestsFailed.log"
  [[ -f "$listed" ]] && mapfile -t -O "${#failed_tests[@]}" failed_tests < <(sed "s|^|$dir: |" "$listed")
  local tails
  tails="$(print_failure_tails "$dir")"
  [[ -n "$tails" ]] && failure_tails+=("$tails")
  return 1
}

# The last lines each failed test printed (pytest's short summary, gtest's failed expectations),
# from ctest's full log: the summary repeats them, since CI shows only the end of the log.
failure_tails=()
print_failure_tails() {
  local dir="$1" name
  local log="$dir/Testing/Temporary/LastTest.log" listed="$dir/Testing/Temporary/LastTestsFailed.log"
  # A run that failed before any test (ctest itself) leaves no lists to read.
  [[ -f "$log" && -f "$listed" ]] || return 0
  while IFS=: read -r _ name; do
    echo "  --- $dir: $name (its last lines)"
    awk -v test="$name" '
      $0 ~ "^[0-9]+/[0-9]+ Test: " && $3 == test { inside = 1; count = 0; next }
      inside && /^<end of output>/ { exit }
      inside { lines[count++ % 25] = $0 }
      END { for (i = (count > 25 ? count - 25 : 0); i < count; ++i) print "    " lines[i % 25] }
    ' "$log" | cut -c1-400
  done < "$listed"
}

# The ISAs this CPU runs, widest first (the same test as the kernels' dispatch).
cpu_isas() {
  local flags
  flags="$(grep -m1 '^flags' /proc/cpuinfo)"
  has() { [[ " $flags " == *" $1 "* ]]; }
  if has avx512f && has avx512bw && has avx512vl && has avx512dq && has fma && has f16c; then
    if has avx512_vnni; then echo avx512vnni; fi
    echo avx512
  fi
  if has avx2 && has fma && has f16c; then
    if has avx_vnni; then echo avxvnni; fi
    echo avx2
  fi
  echo scalar
}

release_tests() {
  ctest_in build
}

unit_tests_on() {
  # The default-model cases are left to the release stage, as under the sanitizer: they are the
  # slow ones, and the kernels they run are what the other unit tests check on every ISA. So are
  # the chi-square sampling tests (thousands of tiny-model generations, 63 % of the scalar stage's
  # test time): every ISA gives the same bits, which the kernel and greedy tests hold here.
  DSPARK_ISA="$1" ctest_in build -L unit \
    -E 'DefaultModel|LosslessSampling[.]|SampledTokensFollowTheRestricted'
}

asan_tests() {
  cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=Debug -DCMAKE_CXX_COMPILER=clang++ \
    -DCMAKE_CXX_FLAGS_DEBUG="-O1 -gline-tables-only" -DDSPARK_SANITIZE=ON -DDSPARK_BUILD_BENCH=OFF \
    -DDSPARK_VENV="$venv" -DCMAKE_CXX_COMPILER_LAUNCHER=ccache >/dev/null &&
    cmake --build build-asan -j"$jobs" --target unit_test_programs &&
    ASAN_OPTIONS=detect_leaks=1 ctest_in build-asan -L unit \
      -E 'DefaultModel|^fp32[.]|FollowTheTargetWithAWrongDrafter|SampledTokensFollowTheRestricted'
}

# A short libFuzzer pass over every harness (10 s each, one per core); the long runs are
# scripts/fuzz.sh by hand.
fuzz_tests() {
  FUZZ_JOBS="$jobs" scripts/fuzz.sh 10
}

stage setup scripts/setup.sh --tests
stage default-model scripts/install_default_model.sh
mapfile -t isas < <(cpu_isas)
best="${DSPARK_ISA:-${isas[0]}}"
stage "release ($best)" release_tests
narrower=0
for isa in "${isas[@]}"; do
  if ((narrower)); then stage "unit ($isa)" unit_tests_on "$isa"; fi
  [[ "$isa" == "$best" ]] && narrower=1
done
stage fuzz fuzz_tests
stage asan asan_tests

echo "=== test.sh: summary"
printf '  %s\n' "${timings[@]}"
if ((${#failed_tests[@]})); then
  echo "  failed tests:"
  printf '    %s\n' "${failed_tests[@]}"
  printf '%s\n' "${failure_tails[@]}"
fi
if ((${#failed[@]})); then
  echo "test.sh: failed stages: ${failed[*]}"
  exit 1
fi
echo "test.sh: every stage passed"
