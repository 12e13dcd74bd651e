#!/usr/bin/env bash
# Fuzzes the parsers and the command line: builds the libFuzzer targets (fuzz/) in
# build-fuzz/ with clang, AddressSanitizer and UndefinedBehaviorSanitizer, and runs each for
# SECONDS (default 60) from its checked-in corpus (fuzz/corpus/<target>/).
#   scripts/fuzz.sh [SECONDS]
# Fails (non-zero) on any crash, uncaught exception other than InputError, broken invariant,
# leak, sanitizer report, input slower than 10 s or using more than 2 GiB. What a target
# finds is saved under build-fuzz/artifacts/ (reproduce: build-fuzz/fuzz/fuzz_<target> FILE);
# inputs that grew coverage go to build-fuzz/corpus/<target>/, not into the checked-in corpus.
#
# Environment: FUZZ_SEED (default 1) fixes libFuzzer's random seed, and FUZZ_RUNS=N stops
# each target after N inputs (or SECONDS, whichever comes first). CI sets both and starts
# from the checked-in corpus alone (FUZZ_FRESH=1 empties build-fuzz/corpus/ first): CI runs
# then try nearly the same inputs (libFuzzer's coverage feedback is not exactly repeatable),
# and new ground is broken by running this script by hand (without FUZZ_RUNS, or another seed).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

seconds=${1:-60}
[[ "$seconds" =~ ^[0-9]+$ && "$seconds" -ge 1 ]] || { echo "usage: scripts/fuzz.sh [SECONDS >= 1]" >&2; exit 2; }

bash scripts/setup.sh clang libclang-rt-14-dev
source scripts/compiler-cache.sh
echo "fuzz: configuring build-fuzz/ (clang, ASan + UBSan, libFuzzer)" >&2
# -O1 -g1, as the sanitizers' builds (scripts/test-sanitizers.sh): line tables are all a
# finding's stack needs, and it compiles in about half the time of RelWithDebInfo's -O2 -g.
CC=clang CXX=clang++ cmake -S . -B build-fuzz -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g1" -DCMAKE_C_FLAGS_RELWITHDEBINFO="-O1 -g1" \
  -DSHARDMM_BUILD_FUZZERS=ON -DSHARDMM_WITH_MPI=OFF -DSHARDMM_BUILD_TESTS=OFF -DSHARDMM_BUILD_BENCHMARKS=OFF \
  >/dev/null
echo "fuzz: building fuzz_parse, fuzz_cli and fuzz_program" >&2
if ! cmake --build build-fuzz -j"$(nproc)" --target fuzz_parse fuzz_cli fuzz_program >build-fuzz/build.log 2>&1; then
  echo "fuzz: the build failed; the end of build-fuzz/build.log:" >&2
  tail -30 build-fuzz/build.log >&2
  exit 1
fi

export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
seed=${FUZZ_SEED:-1}
runs=()
[[ -n "${FUZZ_RUNS:-}" ]] && runs=(-runs="$FUZZ_RUNS")
[[ "${FUZZ_FRESH:-0}" == 1 ]] && rm -rf build-fuzz/corpus
# The targets run side by side (one process each: the machine's cores share them).
targets=(parse cli program)
pids=()
for target in "${targets[@]}"; do
  work=build-fuzz/corpus/$target
  mkdir -p "$work" build-fuzz/artifacts
  log=build-fuzz/fuzz_$target.log
  max_len=512
  [[ $target == program ]] && max_len=2048  # a program is many lines
  echo "fuzz: fuzz_$target for ${seconds}s (log: $log)" >&2
  # New inputs go to the first corpus directory (the work copy); the checked-in one seeds it.
  build-fuzz/fuzz/fuzz_$target "$work" "fuzz/corpus/$target" -dict="fuzz/$target.dict" \
    -seed="$seed" "${runs[@]}" -max_total_time="$seconds" -max_len="$max_len" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
    -artifact_prefix="build-fuzz/artifacts/$target-" </dev/null >"$log" 2>&1 &
  pids+=($!)
done
failed=()
for i in "${!targets[@]}"; do
  target=${targets[$i]}
  log=build-fuzz/fuzz_$target.log
  if wait "${pids[$i]}"; then
    { grep -E '^#[0-9]+[[:space:]]+DONE' "$log" | tail -1 || true; } | sed "s/^/fuzz: fuzz_$target /" >&2
  else
    echo "fuzz: fuzz_$target FAILED; the end of its log:" >&2
    tail -40 "$log" >&2
    failed+=("fuzz_$target")
  fi
done

if ((${#failed[@]})); then
  echo "fuzz: failed: ${failed[*]} (inputs under build-fuzz/artifacts/)" >&2
  exit 1
fi
echo "fuzz: no findings (${FUZZ_RUNS:-unbounded} inputs or ${seconds}s per target, seed $seed)" >&2
