#!/usr/bin/env bash
# Our mpi backend's collectives against the best of Open MPI's algorithms (docs/benchmarks.md,
# "MPI backend vs Open MPI's own collectives"). Open MPI's tuned component picks one algorithm
# per call by its decision rules; this runs bench/mpi_collectives_bench once with that choice
# and once per algorithm it offers for the call (coll_tuned_use_dynamic_rules=1 and
# coll_tuned_<collective>_algorithm=N, read by MPI_Init), and prints, per call and size, the
# paired ratio MPI/ours of every run and the least of them: >= 1 means ours is not slower
# than any of Open MPI's algorithms at that size. Open MPI's own shared-memory collectives run
# too: its sm component (coll_sm_priority=100: barrier, bcast, reduce and allreduce through a
# shared segment; the other calls stay tuned's) and han (coll_han_priority=100, hierarchical,
# sm within a node). The forced algorithm is MPI's side's alone: on one node ours go through
# the group's shared window (shared_exchange.h).
#
#   scripts/bench-mpi-algorithms.sh              # 2 ranks, 1, 4, 16, 64 MiB, into build/mpi-algorithms
#
# Environment (defaults): BUILD (build), OUT (BUILD/mpi-algorithms), RANKS (2), SIZES
# (1MiB,4MiB,16MiB,64MiB), REPEAT (21), CALLS (every MPI call the bench has: MPI_Allgather
# MPI_Reduce_scatter_block MPI_Reduce_scatter MPI_Allreduce MPI_Alltoall).
# Needs the build's bench/mpi_collectives_bench, mpirun (Open MPI) and python3.
set -euo pipefail
cd "$(dirname "$0")/.."

BUILD=${BUILD:-build}
OUT=${OUT:-$BUILD/mpi-algorithms}
RANKS=${RANKS:-2}
SIZES=${SIZES:-1MiB,4MiB,16MiB,64MiB}
REPEAT=${REPEAT:-21}
CALLS=${CALLS:-MPI_Allgather MPI_Reduce_scatter_block MPI_Reduce_scatter MPI_Allreduce MPI_Alltoall}
BENCH=$BUILD/bench/mpi_collectives_bench
[[ -x $BENCH ]] || { echo "bench-mpi-algorithms: $BENCH is not built (cmake --build $BUILD)" >&2; exit 2; }
command -v ompi_info >/dev/null || { echo "bench-mpi-algorithms: needs Open MPI (ompi_info)" >&2; exit 2; }
mkdir -p "$OUT"
rm -f "$OUT"/*.jsonl

export OPENBLAS_NUM_THREADS=1 OMPI_MCA_btl=self,vader OMPI_MCA_pml=ob1 OMPI_MCA_btl_vader_single_copy_mechanism=none
MPIRUN=(mpirun --allow-run-as-root --oversubscribe --bind-to none -n "$RANKS")

# The tuned component's parameter for an MPI call.
collective() {
  case $1 in
    MPI_Allgather) echo allgather ;;
    MPI_Reduce_scatter_block) echo reduce_scatter_block ;;
    MPI_Reduce_scatter) echo reduce_scatter ;;
    MPI_Allreduce) echo allreduce ;;
    MPI_Alltoall) echo alltoall ;;
    *) echo "bench-mpi-algorithms: unknown MPI call $1" >&2; exit 2 ;;
  esac
}

# The algorithms Open MPI offers for a collective, as "N:name" (ompi_info's "Valid values",
# without 0:"ignore").
algorithms() {
  ompi_info --param coll tuned --level 9 |
    awk -v p="\"coll_tuned_$1_algorithm\"" '$0 ~ p {found = 1; next} found && /Valid values/ {print; exit}' |
    grep -o '[1-9][0-9]*:"[^"]*"' | tr -d '"'
}

for call in $CALLS; do
  name=$(collective "$call")
  echo "bench-mpi-algorithms: $call, Open MPI's own choice" >&2
  "${MPIRUN[@]}" "$BENCH" --sizes "$SIZES" --repeat "$REPEAT" --only "$call" --json |
    sed -n 's/^{\(.*\)}$/{"algorithm":"default",\1}/p' >>"$OUT/$name.jsonl"
  for component in sm han; do
    echo "bench-mpi-algorithms: $call, Open MPI's $component component" >&2
    env "OMPI_MCA_coll_${component}_priority=100" \
      "${MPIRUN[@]}" "$BENCH" --sizes "$SIZES" --repeat "$REPEAT" --only "$call" --json |
      sed -n 's/^{\(.*\)}$/{"algorithm":"coll '"$component"'",\1}/p' >>"$OUT/$name.jsonl"
  done
  for algorithm in $(algorithms "$name"); do
    echo "bench-mpi-algorithms: $call, algorithm $algorithm" >&2
    env OMPI_MCA_coll_tuned_use_dynamic_rules=1 "OMPI_MCA_coll_tuned_${name}_algorithm=${algorithm%%:*}" \
      "${MPIRUN[@]}" "$BENCH" --sizes "$SIZES" --repeat "$REPEAT" --only "$call" --json |
      sed -n 's/^{\(.*\)}$/{"algorithm":"'"$algorithm"'",\1}/p' >>"$OUT/$name.jsonl"
  done
done

python3 - "$OUT" <<'EOF'
import glob, json, sys
rows = [json.loads(line) for path in sorted(glob.glob(sys.argv[1] + "/*.jsonl")) for line in open(path)]
print("MPI/ours per Open MPI algorithm (paired medians; >= 1: ours is not slower than it)")
for call in dict.fromkeys(r["mpi_call"] for r in rows):
    sizes = sorted({r["bytes"] for r in rows if r["mpi_call"] == call})
    print(f"\n| {call} | " + " | ".join(f"{s >> 20} MiB" if s >= 1 << 20 else f"{s >> 10} KiB" for s in sizes) + " |")
    print("|---" * (len(sizes) + 1) + "|")
    runs = list(dict.fromkeys(r["algorithm"] for r in rows if r["mpi_call"] == call))
    ratio = {(r["algorithm"], r["bytes"]): r["mpi_over_ours"] for r in rows
             if r["mpi_call"] == call and r["mpi_over_ours"] is not None}  # None: a noisy row
    for a in runs:
        print(f"| {a} | " + " | ".join(f"{ratio[(a, s)]:.3f}" if (a, s) in ratio else "-" for s in sizes) + " |")
    least = [min((ratio[(a, s)], a) for a in runs if (a, s) in ratio) for s in sizes]
    print("| **least (vs the best algorithm)** | " + " | ".join(f"**{v:.3f}** ({a})" for v, a in least) + " |")
EOF
