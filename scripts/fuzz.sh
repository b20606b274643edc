#!/usr/bin/env bash
# Runs the libFuzzer harnesses of tests/fuzz (one per untrusted input surface):
#
#   scripts/fuzz.sh [seconds-per-harness] [harness...]     (default: 60 s, every harness)
#
# Builds them with clang, libFuzzer, AddressSanitizer and UndefinedBehaviorSanitizer in
# build-fuzz (ccache when present), then runs one process per harness for the budget, starting
# from the committed seeds in tests/fuzz/corpus/<harness>. New corpus entries and crash
# artifacts go to a scratch directory (FUZZ_WORK, default a fresh /tmp/dspark-fuzz.*), never into
# the tree. FUZZ_JOBS=n runs n harnesses at once (default 1; each process is single-threaded).
# Prints per harness: executions, exec/s, coverage (libFuzzer's cov and ft), crashes; exits
# non-zero when a harness found a crash, a hang, an out-of-memory or a sanitizer report.
set -uo pipefail
cd "$(dirname "$0")/.."
all=(request jinja json_schema safetensors gguf tokenizer model_config)
seconds="${1:-60}"
shift $(($# > 0 ? 1 : 0))
harnesses=("$@")
((${#harnesses[@]})) || harnesses=("${all[@]}")
work="${FUZZ_WORK:-$(mktemp -d /tmp/dspark-fuzz.XXXXXX)}"
jobs="${FUZZ_JOBS:-1}"
build=build-fuzz

if ! command -v clang++ >/dev/null; then
  echo "fuzz.sh: needs clang++ with libFuzzer (Debian: clang libclang-rt-14-dev)" >&2
  exit 1
fi
launcher=()
command -v ccache >/dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
# -O1 with line tables: quick to build, and crash stacks still name file and line.
cmake -S . -B "$build" -G Ninja -DCMAKE_CXX_COMPILER=clang++ -DDSPARK_FUZZ=ON \
  -DDSPARK_BUILD_TESTS=OFF -DDSPARK_BUILD_BENCH=OFF -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_CXX_FLAGS_RELEASE="-O1 -gline-tables-only" "${launcher[@]}" >/dev/null || exit 1
targets=()
for name in "${harnesses[@]}"; do targets+=("fuzz_$name"); done
cmake --build "$build" -j"$(nproc)" --target "${targets[@]}" || exit 1

fuzz_one() {
  local name="$1" dir="$work/$1"
  mkdir -p "$dir/corpus" "$dir/artifacts"
  # The first directory receives new entries; the seeds are only read.
  UBSAN_OPTIONS=print_stacktrace=1 "$build/tests/fuzz/fuzz_$name" "$dir/corpus" \
    "tests/fuzz/corpus/$name" -max_total_time="$seconds" -rss_limit_mb=2048 -timeout=20 \
    -print_final_stats=1 -artifact_prefix="$dir/artifacts/" >"$dir/log" 2>&1
  echo $? >"$dir/rc"
}

echo "fuzz.sh: ${#harnesses[@]} harnesses x ${seconds} s, $jobs at a time; scratch: $work"
for name in "${harnesses[@]}"; do
  while (($(jobs -rp | wc -l) >= jobs)); do wait -n; done
  fuzz_one "$name" &
done
wait

failed=0
printf '%-14s %8s %12s %8s %7s %8s %8s\n' harness seconds executions exec/s cov ft crashes
for name in "${harnesses[@]}"; do
  dir="$work/$name"
  stat() { sed -n "s/^stat::$1: *//p" "$dir/log" | tail -1; }
  last="$(grep -E '^#[0-9]+.*cov: ' "$dir/log" | tail -1)"
  cov="$(sed -n 's/.* cov: \([0-9]*\).*/\1/p' <<<"$last")"
  ft="$(sed -n 's/.* ft: \([0-9]*\).*/\1/p' <<<"$last")"
  crashes="$(find "$dir/artifacts" -type f | wc -l)"
  printf '%-14s %8s %12s %8s %7s %8s %8s\n' "$name" "$seconds" "$(stat number_of_executed_units)" \
    "$(stat average_exec_per_sec)" "${cov:--}" "${ft:--}" "$crashes"
  if ((crashes)) || [[ "$(cat "$dir/rc")" != 0 ]]; then
    failed=1
    echo "  $name: exit status $(cat "$dir/rc"); log $dir/log"
    find "$dir/artifacts" -type f -printf '  artifact: %p\n'
    grep -m3 -E 'ERROR: |runtime error|Test unit written' "$dir/log" | sed 's/^/  /'
  fi
done
exit "$failed"
