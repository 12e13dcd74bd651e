#!/usr/bin/env bash
# Builds and runs the test suite under the sanitizers, each in its own build directory:
#   asan  build-asan/  AddressSanitizer + UndefinedBehaviorSanitizer (leaks included)
#   tsan  build-tsan/  ThreadSanitizer (the threads backend's collectives, the executor)
# usage: bash scripts/test-sanitizers.sh [asan|tsan|all]     (default: all)
# Any sanitizer report fails its test. On 2 cores the whole run takes about 30 minutes.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

which=${1:-all}
case "$which" in
  asan | tsan | all) ;;
  *)
    echo "usage: $0 [asan|tsan|all]" >&2
    exit 2
    ;;
esac

bash scripts/setup.sh
jobs=$(nproc)

# The random suites are the bulk of the run time; under a sanitizer (5-15x slower) a
# smaller sample keeps the run bounded while every code path still runs (the normal
# build's ctest runs the full sample).
export SHARDMM_RANDOM_CASES=${SHARDMM_RANDOM_CASES:-150}

# Tests that cannot run under any sanitizer build:
#   install_consumer  installs this build and links an unsanitized consumer program
#                     against its static libraries, which then lack the sanitizer runtime.
#                     It tests packaging, not memory or threads; scripts/test.sh runs it.
common_exclude='^install_consumer$'

run() {  # run NAME FLAGS CTEST_EXCLUDE_REGEX
  local name=$1 flags=$2 exclude=$3 dir=build-$1
  local start=$SECONDS
  echo "sanitizers: configuring $dir ($flags)" >&2
  cmake -S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DSHARDMM_BUILD_BENCHMARKS=OFF \
    -DCMAKE_CXX_FLAGS="$flags" -DCMAKE_C_FLAGS="$flags" \
    -DCMAKE_EXE_LINKER_FLAGS="$flags" -DCMAKE_SHARED_LINKER_FLAGS="$flags" >/dev/null
  echo "sanitizers: building $dir" >&2
  cmake --build "$dir" -j"$jobs"
  echo "sanitizers: running ctest in $dir (excluding: $exclude)" >&2
  ctest --test-dir "$dir" --output-on-failure -j"$jobs" -E "$exclude"
  echo "sanitizers: $name passed in $((SECONDS - start)) s" >&2
}

if [[ "$which" == asan || "$which" == all ]]; then
  # halt_on_error: the first report ends the test with a non-zero status.
  export ASAN_OPTIONS=detect_leaks=1:halt_on_error=1:detect_stack_use_after_return=1:strict_string_checks=1
  export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
  run asan "-fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined" "$common_exclude"
fi

if [[ "$which" == tsan || "$which" == all ]]; then
  export TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1
  run tsan "-fsanitize=thread" "$common_exclude"
fi
