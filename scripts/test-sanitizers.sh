#!/usr/bin/env bash
# Builds the tests under the sanitizers, each in its own build directory, and runs them:
#   asan  build-asan/  AddressSanitizer + UndefinedBehaviorSanitizer, leaks included
#   tsan  build-tsan/  ThreadSanitizer: the threads backend's collectives, the executor
# usage: bash scripts/test-sanitizers.sh [asan|tsan|all]     (default: all)
# Both are clang builds. Any report fails its test, and the script exits non-zero. CI runs `all`.
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

bash scripts/setup.sh clang libclang-rt-14-dev
source scripts/compiler-cache.sh
jobs=$(nproc)

# The random suites are most of the run time, and a sanitizer slows them 3-15x: smaller
# samples keep the run bounded while every code path still runs (scripts/test.sh runs
# the full samples). executor_test's random contractions (default 1000), the planner's
# property tests (a fraction of their default), the determinism tests' cases (each still
# repeated 100 times; defaults 12 on threads, 3 on mpi).
# (executor_test's 150 random contractions ran past 10 minutes under ASan on a 2-vCPU EPYC VM,
# 2026-12-01: 60 now, with a 30-minute limit per test.)
export SHARDMM_RANDOM_CASES=60 SHARDMM_PROPERTY_SCALE=0.2 SHARDMM_DETERMINISM_CASES=2

# Excluded under both sanitizers:
#   install_consumer  installs this build and links an uninstrumented program against its
#                     static libraries, which then lack the sanitizer's runtime. It tests
#                     packaging, not memory or threads; scripts/test.sh runs it.
#   CliRun.AnAddressSpaceLimitIsCheckedBeforeTheRun, mpi_cli_rank_memory_cap
#                     run shardmm under a RLIMIT_AS of about 1 GB, which a sanitizer's runtime
#                     (terabytes of shadow mappings) cannot start under.
exclude='^(install_consumer|CliRun.AnAddressSpaceLimitIsCheckedBeforeTheRun|mpi_cli_rank_memory_cap)$'

# The shared-memory transport only: no network probing (tests/mpi/CMakeLists.txt sets the
# same for each MPI test).
export OMPI_MCA_btl=self,vader OMPI_MCA_pml=ob1 OMPI_MCA_btl_vader_single_copy_mechanism=none

build() {  # build NAME FLAGS [CMAKE_ARGS...]
  local dir=build-$1 flags=$2
  shift 2
  echo "sanitizers: configuring $dir ($flags)" >&2
  # Line tables (-g1) are all a report's stack needs, and -O1 is what the sanitizers'
  # documentation suggests: together they compile 2.5x faster than RelWithDebInfo's -O2 -g.
  # clang compiles these builds 15% faster than g++ (the Release build stays with g++).
  # No Python module: a sanitized one cannot load into Debian's python3, which would need the
  # sanitizer's runtime loaded first; the Release build tests it.
  # Shared libraries: each of the ~80 test programs then links against them instead of copying
  # in the instrumented static libraries, a link the compiler cache cannot save (the ASan build's
  # links took 235 s of its 1,600 s of compiling and linking, 2026-12-06).
  CC=clang CXX=clang++ cmake -S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g1" \
    -DCMAKE_C_FLAGS_RELWITHDEBINFO="-O1 -g1" -DSHARDMM_BUILD_BENCHMARKS=OFF -DSHARDMM_BUILD_PYTHON=OFF \
    -DSHARDMM_TEST_TIMEOUT=1800 -DBUILD_SHARED_LIBS=ON \
    -DCMAKE_CXX_FLAGS="$flags" -DCMAKE_C_FLAGS="$flags" \
    -DCMAKE_EXE_LINKER_FLAGS="$flags" -DCMAKE_SHARED_LINKER_FLAGS="$flags" "$@" >/dev/null
  echo "sanitizers: building $dir" >&2
  cmake --build "$dir" -j"$jobs"
}

failed=0
check() {  # check NAME CTEST_ARGS...: runs ctest, records a failure, goes on
  local name=$1
  shift
  local start=$SECONDS
  echo "sanitizers: $name: ctest $*" >&2
  if ctest --output-on-failure -j"$jobs" "$@"; then
    echo "sanitizers: $name passed in $((SECONDS - start)) s" >&2
  else
    echo "sanitizers: $name FAILED (after $((SECONDS - start)) s)" >&2
    failed=1
  fi
}

if [[ "$which" == asan || "$which" == all ]]; then
  start=$SECONDS
  build asan "-fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined"
  # halt_on_error: the first report ends the test with a non-zero status.
  export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
  export ASAN_OPTIONS=detect_leaks=1:halt_on_error=1:strict_string_checks=1:detect_stack_use_after_return=1
  check asan --test-dir build-asan -LE mpi -E "$exclude"
  # The MPI tests without leak checking: Open MPI never frees what MPI_Init allocates, and
  # those reports cannot be told from shardmm's by a suppression, because Open MPI has no
  # frame pointers and its components are unloaded at MPI_Finalize (the stacks end in
  # "<unknown module>"); unwinding every malloc the slow way to name them made the MPI
  # tests 9x slower. Every other check stays on, and shardmm's own allocations are
  # leak-checked by the tests above, which run the same code on the threads backend.
  ASAN_OPTIONS=detect_leaks=0:halt_on_error=1:strict_string_checks=1 check asan-mpi --test-dir build-asan -L mpi -E "$exclude"
  echo "sanitizers: asan took $((SECONDS - start)) s" >&2
fi

if [[ "$which" == tsan || "$which" == all ]]; then
  start=$SECONDS
  # Only the tests of the code that starts threads are built: the runtime (ranks, the copy
  # engine, the executor's poller), autodiff and nn on it, and solve (its recordings run in
  # parallel). Not core's, plan's, program's (no thread there), nor cli's, whose commands
  # start no thread of their own and run the runtime's, which these tests drive (the ASan
  # build runs them all); nor the mpirun tests (not run here, below).
  build tsan "-fsanitize=thread" -DSHARDMM_BUILD_MPIRUN_TESTS=OFF "-DSHARDMM_TEST_DIRS=runtime;autodiff;nn;solve"
  export TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1
  # OpenBLAS's own thread pool, like Open MPI below, is not built with ThreadSanitizer: where a
  # caller leaves it more than one thread (CBC's factorization, through LAPACK, in the solve
  # tests), its workers' copies are reported as races with the caller's buffers. One BLAS thread
  # keeps the reports to threads ThreadSanitizer can see.
  export OPENBLAS_NUM_THREADS=1
  # Not the MPI tests (label mpi): Open MPI is not built with ThreadSanitizer, so the
  # synchronization inside it (shared-memory transport, progress thread) is invisible and
  # would be reported as races; and there each rank is its own process, with nothing for
  # ThreadSanitizer to see between them. The threads backend's tests are what it is for.
  # Nor the solvers' tests (Solvers.*: random choice problems, CBC against exhaustive search),
  # which start no thread: 115 s of the TSan run (2026-12-05), and the ASan build runs them.
  check tsan --test-dir build-tsan -LE mpi -E "$exclude|^Solvers\\."
  echo "sanitizers: tsan took $((SECONDS - start)) s" >&2
fi

exit "$failed"
