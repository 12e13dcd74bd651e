#!/usr/bin/env bash
# A rank of a 4-rank run on the mpi backend sent SIGNAL in the middle of its repeats:
#   STOP       the job ends within about the watchdog (2 s), exit 2, and the first report names
#              the stopped rank, whichever phase it was stopped in (the call check, the data
#              through the shared window, a lent piece);
#   KILL, TERM the job ends at once, mpirun naming the rank and the signal.
# usage: signal_rank.sh MPIEXEC SHARDMM SIGNAL
set -u
mpiexec=$1 shardmm=$2 signal=$3
out=$(mktemp)
trap 'rm -f "$out"' EXIT
# Our job's ranks carry this in their environment: another run of this test on the machine
# (another checkout's suite) has the same command line, and its rank 2 is not ours to signal.
export SHARDMM_SIGNAL_TEST_JOB="$$.$RANDOM"
"$mpiexec" --allow-run-as-root --oversubscribe --bind-to none -n 4 "$shardmm" reshard 'A[I_X, J]' 'A[I, J]' \
  --mesh X=4 --dims I=4096,J=4096 --dtype f32 --run --backend mpi --repeat 1000000 --warmup 0 --warmup-time 0 \
  --watchdog 2 >"$out" 2>&1 &
job=$!
rank2=
for _ in $(seq 300); do  # up to 30 s for the ranks to start
  for p in $(pgrep -f "reshard A\[I_X, J\] A\[I, J\]"); do
    environ=$(tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null)
    grep -qx "SHARDMM_SIGNAL_TEST_JOB=$SHARDMM_SIGNAL_TEST_JOB" <<<"$environ" &&
      grep -qx "OMPI_COMM_WORLD_RANK=2" <<<"$environ" && rank2=$p
  done
  [[ -n $rank2 ]] && break
  sleep 0.1
done
[[ -n $rank2 ]] || { echo "rank 2 never started"; cat "$out"; kill $job; exit 1; }
sleep 2  # well into the repeats
kill -"$signal" "$rank2"
sent=$SECONDS
wait $job
rc=$?
kill -CONT "$rank2" 2>/dev/null
took=$((SECONDS - sent))
cat "$out"
fail=0
[[ $took -le 20 ]] || { echo "FAIL: the job took $took s to end after SIG$signal (watchdog 2 s)"; fail=1; }
if [[ $signal == STOP ]]; then
  [[ $rc == 2 ]] || { echo "FAIL: exit $rc, not 2"; fail=1; }
  # The first report of another rank names rank 2 (rank 2 may report too, when mpirun's SIGCONT
  # before its SIGTERM wakes it past its own deadline). Later reports may name a rank stalled
  # behind it: a rank that got rank 2's data before the stop goes on and waits for one that did not.
  first=$(grep -m1 -E "^shardmm: rank [013]: collective timeout" "$out")
  [[ -n $first ]] || { echo "FAIL: no other rank reported the timeout"; fail=1; }
  # A rank stalled behind rank 2 may be named beside it ("the data of ranks 2, 3 had not all
  # arrived"), so rank 2 is looked for in the list of ranks each phrase names.
  ranks_with_2='ranks? ([0-9]+, )*2(, [0-9]+)*'
  grep -qE "$ranks_with_2 never arrived|the data of $ranks_with_2 had not all arrived|$ranks_with_2 had not read" <<<"$first" ||
    { echo "FAIL: the first report does not name rank 2: $first"; fail=1; }
else
  [[ $rc != 0 ]] || { echo "FAIL: exit 0"; fail=1; }
  grep -qE "process rank 2 with PID .* exited on signal" "$out" || { echo "FAIL: mpirun does not name rank 2"; fail=1; }
fi
exit $fail
