#!/usr/bin/env bash
# shardmm against its peers, side by side (docs/benchmarks.md, "Peers"): every table is a ratio
# against a reference measured in the same run, medians of REPEAT, one BLAS thread per rank.
#
#   scripts/bench-peers.sh                     # everything, into build/peers and docs/plots
#   PROFILE=profiles/example-cpu.json scripts/bench-peers.sh    # the same suite on a fixed profile
#
# Environment (defaults): BUILD (build), OUT (BUILD/peers), PLOTS (docs/plots), PROFILE
# (calibrate: `shardmm calibrate` on a step's mesh and backend right before each step, which is
# planned and predicted with that profile: a rank's GEMM rate depends on how many ranks share the
# cores, and this VM's speed moves by tens of % within minutes; or a profile file used by every step),
# CALIBRATE_FLAGS ("": e.g. --quick, passed to each calibrate), SIZES (512,1024,2048,4096), REPEAT (7), ROUNDS (3: the reference GEMM and the plans, and
# shardmm and PyTorch, alternate this many times), WARMUP_TIME (0.2: `bench matmul --warmup-time`, the
# untimed seconds before each plan's runs),
# CHOICE_SIZES (256,512,1024,2048), CROSSOVER_DIMS (I=1024,J=1024), CROSSOVER_SIZES
# (128,256,512,1024,2048,4096), JUDGE_SIZES (999,1501), JUDGE_DIMS (J=1200), JUDGE_THIN (I=3),
# SOLVE_PROGRAM (examples/programs/block.prog), SOLVE_DIMS (B=4,T=256,S=256,D=512,H=8,A=64,F=2048),
# SKIP ("": any of gemm choice judge solve scalapack torch plots).
# Needs the build's shardmm and bench/scalapack_bench (libscalapack-openmpi-dev), mpirun;
# The plots need gnuplot-nox, which this script installs through scripts/setup.sh (CI does not
# need it); PyTorch (python3-torch, large) is used when present, else that part says it is skipped.
# Each step records `uptime` next to its JSON (STEP.load): the load is part of every figure.
set -euo pipefail
cd "$(dirname "$0")/.."

BUILD=${BUILD:-build}
OUT=${OUT:-$BUILD/peers}
PLOTS=${PLOTS:-docs/plots}
PROFILE=${PROFILE:-calibrate}
SIZES=${SIZES:-512,1024,2048,4096}
REPEAT=${REPEAT:-7}
CHOICE_SIZES=${CHOICE_SIZES:-256,512,1024,2048}
CROSSOVER_DIMS=${CROSSOVER_DIMS:-I=1024,J=1024}
CROSSOVER_SIZES=${CROSSOVER_SIZES:-128,256,512,1024,2048,4096}
JUDGE_SIZES=${JUDGE_SIZES:-999,1501}
JUDGE_DIMS=${JUDGE_DIMS:-J=1200}
JUDGE_THIN=${JUDGE_THIN:-I=3}
SOLVE_PROGRAM=${SOLVE_PROGRAM:-examples/programs/block.prog}
SOLVE_DIMS=${SOLVE_DIMS:-B=4,T=256,S=256,D=512,H=8,A=64,F=2048}
ROUNDS=${ROUNDS:-3}
WARMUP_TIME=${WARMUP_TIME:-0.2}
SKIP=${SKIP:-}
SHARDMM=$BUILD/src/shardmm
# Every `bench matmul` step times its plans alike.
MATMUL=(bench matmul --repeat "$REPEAT" --rounds "$ROUNDS" --warmup-time "$WARMUP_TIME")
mkdir -p "$OUT" "$PLOTS"
if [[ " $SKIP " != *" plots "* ]]; then
  scripts/setup.sh gnuplot-nox
fi

export OPENBLAS_NUM_THREADS=1 OMPI_MCA_btl=self,vader OMPI_MCA_pml=ob1 OMPI_MCA_btl_vader_single_copy_mechanism=none
# --bind-to none: Open MPI binds each of 2 ranks to one core, which would give the one-GEMM
# reference's 2 threads on rank 0 a single core (shardmm bench matmul refuses that).
MPIRUN=(mpirun --allow-run-as-root --oversubscribe --bind-to none)

wanted() { [[ " $SKIP " != *" $1 "* ]]; }
# profile MESH BACKEND STEP: a profile of that mesh and backend for STEP, calibrated now (a few
# seconds to a quarter of a minute), kept as OUT/profile-STEP.json with calibrate's report beside
# it; an earlier run's profiles are removed first.
[[ $PROFILE == calibrate ]] && rm -f "$OUT"/profile-*.json "$OUT"/profile-*.json.txt
profile() {
  [[ $PROFILE != calibrate ]] && { echo "$PROFILE"; return; }
  local file="$OUT/profile-$3.json" ranks=1 size
  for size in $(tr ',' ' ' <<<"${1//[A-Z]=/}"); do ranks=$((ranks * size)); done
  local try
  # calibrate refuses timings too noisy to fit (a busy machine): up to three tries, then stop.
  for try in 1 2 3; do
    echo "bench-peers: calibrating $2 on $1 into $file (try $try of 3)" >&2
    if [[ $2 == mpi ]]; then
      "${MPIRUN[@]}" -n "$ranks" "$SHARDMM" calibrate ${CALIBRATE_FLAGS:-} --backend mpi --mesh "$1" --out "$file" \
        >"$file.txt" && break
    else
      "$SHARDMM" calibrate ${CALIBRATE_FLAGS:-} --mesh "$1" --out "$file" >"$file.txt" && break
    fi
  done
  [[ -f $file ]] || { echo "bench-peers: calibrating $2 on $1 failed three times; stopping" >&2; exit 1; }
  echo "$file"
}
# step NAME COMMAND...: runs COMMAND with stdout to OUT/NAME.json, the load before it to NAME.load.
step() {
  local name=$1
  shift
  uptime >"$OUT/$name.load"
  echo "bench-peers: $name: $*" >&2
  echo "$*" >"$OUT/$name.cmd"
  "$@" >"$OUT/$name.json"
}

if wanted gemm; then
  # 1. The chosen plan vs one OpenBLAS GEMM of the same FLOPs on the same cores.
  gather='A[I_X, J] @ B[J_X, K] -> C[I_X, K]'
  step gemm_threads_X2 "$SHARDMM" "${MATMUL[@]}" "$gather" --mesh X=2 --sizes "$SIZES" \
    --hw "$(profile X=2 threads gemm_threads_X2)" --json
  step gemm_mpi_X2 "${MPIRUN[@]}" -n 2 "$SHARDMM" "${MATMUL[@]}" "$gather" --mesh X=2 --backend mpi --sizes "$SIZES" \
    --hw "$(profile X=2 mpi gemm_mpi_X2)" --json
fi

if wanted choice; then
  # 4 and 5. Every candidate of a fixed suite: how often the choice is within 5% of the fastest,
  # and predicted / measured per strategy on PROFILE.
  step choice_gather "$SHARDMM" "${MATMUL[@]}" 'A[I_X, J] @ B[J_X, K] -> C[I_X, K]' --mesh X=2 --sizes "$CHOICE_SIZES" \
    --all --hw "$(profile X=2 threads choice_gather)" --json
  step choice_reduce "$SHARDMM" "${MATMUL[@]}" 'A[I, J_X] @ B[J_X, K] -> C[I, K]' --mesh X=2 --sizes "$CHOICE_SIZES" \
    --all --hw "$(profile X=2 threads choice_reduce)" --json
  step choice_2d "$SHARDMM" "${MATMUL[@]}" 'A[I_X, J_Y] @ B[J_X, K_Y] -> C[I_X, K_Y]' --mesh X=2,Y=2 \
    --sizes "$CHOICE_SIZES" --all --hw "$(profile X=2,Y=2 threads choice_2d)" --json
  # Gathering A (I x J) or B (J x K): the cheaper one changes where K passes I.
  step choice_crossover "$SHARDMM" "${MATMUL[@]}" 'A[I_X, J] @ B[J, K_X] -> C[I, K_X]' --mesh X=2 \
    --dims "$CROSSOVER_DIMS" --sizes "$CROSSOVER_SIZES" --all --hw "$(profile X=2 threads choice_crossover)" --json
fi

if wanted judge; then
  # 6. The cost model judged on shapes calibration never measures (issue 31): calibrate measures
  # square and skinny power-of-two GEMMs, power-of-two collectives and fixed probe shapes; here
  # I, J, K differ (JUDGE_DIMS fixes one, JUDGE_SIZES the others: odd sizes split unevenly over 2),
  # and JUDGE_THIN is a block of 3 rows over 2 devices. Both backends; 2 ranks and 4 (X=2,Y=2,
  # time-sliced on 2 cores) are reported apart. Every step is calibrated right before it.
  n=0
  for expr in 'A[I_X, J] @ B[J_X, K] -> C[I_X, K]' 'A[I, J_X] @ B[J_X, K] -> C[I, K]' \
    'A[I_X, J] @ B[J, K_X] -> C[I, K_X]' 'A[I, J_X] @ B[J_X, K] -> C[I_X, K]'; do
    n=$((n + 1))
    step "judge_threads_X2_$n" "$SHARDMM" "${MATMUL[@]}" "$expr" --mesh X=2 --dims "$JUDGE_DIMS" --sizes "$JUDGE_SIZES" \
      --all --hw "$(profile X=2 threads "judge_threads_X2_$n")" --json
    step "judge_mpi_X2_$n" "${MPIRUN[@]}" -n 2 "$SHARDMM" "${MATMUL[@]}" "$expr" --mesh X=2 --backend mpi \
      --dims "$JUDGE_DIMS" --sizes "$JUDGE_SIZES" --all \
      --hw "$(profile X=2 mpi "judge_mpi_X2_$n")" --json
  done
  thin='A[I_X, J] @ B[J_X, K] -> C[I_X, K]'
  step judge_threads_X2_thin "$SHARDMM" "${MATMUL[@]}" "$thin" --mesh X=2 --dims "$JUDGE_THIN" --sizes "$JUDGE_SIZES" \
    --all --hw "$(profile X=2 threads judge_threads_X2_thin)" --json
  step judge_mpi_X2_thin "${MPIRUN[@]}" -n 2 "$SHARDMM" "${MATMUL[@]}" "$thin" --mesh X=2 --backend mpi \
    --dims "$JUDGE_THIN" --sizes "$JUDGE_SIZES" --all \
    --hw "$(profile X=2 mpi judge_mpi_X2_thin)" --json
  two_d='A[I_X, J_Y] @ B[J_X, K_Y] -> C[I_X, K_Y]'
  step judge_threads_X2Y2 "$SHARDMM" "${MATMUL[@]}" "$two_d" --mesh X=2,Y=2 --dims "$JUDGE_DIMS" \
    --sizes "$JUDGE_SIZES" --all \
    --hw "$(profile X=2,Y=2 threads judge_threads_X2Y2)" --json
  step judge_mpi_X2Y2 "${MPIRUN[@]}" -n 4 "$SHARDMM" "${MATMUL[@]}" "$two_d" --mesh X=2,Y=2 --backend mpi \
    --dims "$JUDGE_DIMS" --sizes "$JUDGE_SIZES" --all \
    --hw "$(profile X=2,Y=2 mpi judge_mpi_X2Y2)" --json
fi

if wanted solve; then
  # 7. The sharding `shardmm solve` chooses for SOLVE_PROGRAM at SOLVE_DIMS, run beside every named
  # strategy (issue 27): 2 ranks and 4 (X=2,Y=2, time-sliced on 2 cores), both backends, each
  # solved with a profile calibrated right before it.
  for mesh in X=2 X=2,Y=2; do
    ranks=1
    for size in $(tr ',' ' ' <<<"${mesh//[A-Z]=/}"); do ranks=$((ranks * size)); done
    tag=${mesh//[=,]/}
    step "solve_threads_$tag" "$BUILD/bench/solve_measured_bench" --program "$SOLVE_PROGRAM" --mesh "$mesh" \
      --dims "$SOLVE_DIMS" --repeat "$REPEAT" --hw "$(profile "$mesh" threads "solve_threads_$tag")" --json
    step "solve_mpi_$tag" "${MPIRUN[@]}" -n "$ranks" "$BUILD/bench/solve_measured_bench" --program "$SOLVE_PROGRAM" \
      --mesh "$mesh" --backend mpi --dims "$SOLVE_DIMS" --repeat "$REPEAT" \
      --hw "$(profile "$mesh" mpi "solve_mpi_$tag")" --json
  done
fi

if wanted scalapack; then
  # 2. ScaLAPACK pdgemm on the same ranks, layout and BLAS, f64.
  for grid in 2x1 2x2; do
    ranks=$((${grid%x*} * ${grid#*x}))
    mesh=X=${grid%x*}
    [[ ${grid#*x} == 1 ]] || mesh+=",Y=${grid#*x}"
    step "scalapack_$grid" "${MPIRUN[@]}" -n "$ranks" "$BUILD/bench/scalapack_bench" --grid "$grid" --sizes "$SIZES" \
      --repeat "$REPEAT" --rounds "$ROUNDS" --hw "$(profile "$mesh" mpi scalapack_$grid)" --json
  done
fi

if wanted torch; then
  # 3. PyTorch gloo with the same plan and collective. Debian's python3-torch is in /usr/bin/python3.
  python=""
  for candidate in python3 /usr/bin/python3; do
    if command -v "$candidate" >/dev/null && "$candidate" -c 'import torch.distributed' 2>/dev/null; then
      python=$candidate
      break
    fi
  done
  if [[ -z $python ]]; then
    echo "bench-peers: torch: skipped: no python3 here imports torch (apt-get install python3-torch)" >&2
    rm -f "$OUT/torch.json"
  else
    step torch "$python" bench/torch_matmul_bench.py --shardmm "$SHARDMM" --ranks 2 --sizes "$SIZES" \
      --repeat "$REPEAT" --rounds "$ROUNDS" --hw "$(profile X=2 mpi torch)" --json
  fi
fi

python3 scripts/peers_report.py "$OUT" >/dev/null
echo "bench-peers: tables in $OUT/tables.md" >&2

if wanted plots; then
  if ! command -v gnuplot >/dev/null; then
    echo "bench-peers: plots: skipped: gnuplot is not installed (apt-get install gnuplot-nox)" >&2
    exit 0
  fi
  if [[ -f $OUT/crossover.dat ]]; then
    cat >"$OUT/crossover.plot" <<PLOT
load '$OUT/crossover.gp'
set terminal svg size 900,700 dynamic noenhanced font 'sans,11'
set output '$PLOTS/crossover.svg'
set title 'A[I_X, J] @ B[J, K_X] -> C[I, K_X], $CROSSOVER_DIMS, X = 2 (threads): measured time per strategy'
set logscale xy
set xlabel swept
set ylabel 'seconds (median)'
# The strategies' names are long: the legend goes below the plot, one entry a line, not over the data.
set key outside below left Left reverse vertical maxcols 1 font 'sans,9'
set grid
do for [k = 1:crossings] {
  set arrow k from value('crossing'.k), graph 0 to value('crossing'.k), graph 1 nohead dashtype 2 linecolor 'black'
}
if (crossings > 0) {
  set label 1 'predicted crossover' at value('crossing1'), graph 0.5 offset 0.5,0
}
# The circles: the plan the planner chose at each size, on its strategy's measured point.
plot for [k = 1:plans] '$OUT/crossover.dat' using 1:(column(k + 1)) with linespoints title value('plan'.k), \
  '$OUT/crossover.dat' using 1:(column(chosen_column)) with points pointtype 6 pointsize 2.5 linewidth 1.5 \
  linecolor 'black' title 'chosen plan'
PLOT
    gnuplot "$OUT/crossover.plot"
  fi
  scalapack_plots=()
  for f in "$OUT"/scalapack_*.dat; do [[ -f $f ]] && scalapack_plots+=("$f"); done
  if ((${#scalapack_plots[@]})); then
    plot=""
    for f in "${scalapack_plots[@]}"; do
      grid=$(basename "$f" .dat)
      grid=${grid#scalapack_}
      plot+="${plot:+, }'$f' using 1:2 with linespoints title 'shardmm mpi, grid $grid', '$f' using 1:3 with linespoints dt 2 title 'pdgemm, grid $grid'"
    done
    cat >"$OUT/scalapack.plot" <<PLOT
set terminal svg size 800,540 dynamic noenhanced font 'sans,11'
set output '$PLOTS/scalapack.svg'
set title 'f64 distributed matmul, same ranks, layout and BLAS (1 thread per rank)'
set logscale x 2
set xlabel 'N'
set ylabel 'GFLOP/s (median)'
# From 0, so that the gap between the lines reads at its true size. scalapack_bench's JSON has the
# medians only (no per-round times), so there is no spread to draw as error bars.
set yrange [0:*]
set key outside below center horizontal
set grid
plot $plot
PLOT
    gnuplot "$OUT/scalapack.plot"
  fi
  echo "bench-peers: plots in $PLOTS" >&2
fi
