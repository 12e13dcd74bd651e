#!/usr/bin/env bash
# Ranks of one mpirun job that disagree before their first collective: started with different
# flags or environments, or failing alone. Each case ends at once, exit 2, with one message
# from rank 0 naming the ranks and what differs (it used to print nothing, or hang until the
# watchdog with "rank 0 never arrived").
# usage: ranks_disagree.sh MPIEXEC SHARDMM [memory]
#   memory: only the case of an address-space limit on one rank (not under the sanitizers,
#           whose runtimes cannot start under one)
set -u
mpiexec=$1 shardmm=$2 only=${3:-}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir "$work/r0" "$work/r1"
cp "$(dirname "$0")/../../profiles/example-cpu.json" "$work/r0/p.json"  # on rank 0's "machine" only
fail=0
# case NAME EXPECTED-MESSAGE PER-RANK-BASH [prefix]: runs the job with PER-RANK-BASH before exec
# on each rank ($R is the rank, $A the arguments to change), expecting exit 2 and the message
# (with `prefix`, a message that starts with it).
case_() {
  local name=$1 expected=$2 setup=$3 start=$SECONDS
  local out
  out=$("$mpiexec" --allow-run-as-root --oversubscribe --bind-to none -n 2 bash -c \
    "R=\$OMPI_COMM_WORLD_RANK; A=(run 'A[I, J_X] @ B[J_X, K] -> C[I, K]' --mesh X=2 --dims I=64,J=64,K=64 --backend mpi); cd '$work'/r\$R; $setup; exec '$shardmm' \"\${A[@]}\"" 2>&1)
  local rc=$? took=$((SECONDS - start))
  local lines
  lines=$(grep "^shardmm: error: " <<<"$out")
  local match=$lines
  [[ ${4:-} == prefix ]] && match=${lines:0:$((16 + ${#expected}))}
  local count
  count=$(grep -c . <<<"$lines")
  if [[ $rc != 2 || $took -gt 20 || $count != 1 || $match != "shardmm: error: $expected" ]]; then
    echo "FAIL $name: exit $rc after $took s; expected one line 'shardmm: error: $expected', got:"
    echo "$out"
    fail=1
  else
    echo "ok $name ($took s)"
  fi
}
if [[ $only == memory ]]; then
  case_ "an address-space limit on rank 1 only" \
    "rank 1: the run maps 744 MiB in this process (1 rank x (544 MiB + 200 MiB for BLAS's work buffer and the rank's stack)), but its address-space limit (ulimit -v) leaves " \
    '[[ $R == 1 ]] && ulimit -v 600000; A[5]=I=8192,J=256,K=8192' prefix
  exit $fail
fi
case_ "bad input on rank 1 only" \
  "the ranks were not started alike: rank 1 has 'argument I=abc' where rank 0 has 'argument I=64,J=64,K=64' (every rank must run the same command, with the same SHARDMM_ environment)" \
  '[[ $R == 1 ]] && A[5]=I=abc'
case_ "a flag on rank 1 only" \
  "the ranks were not started alike: rank 1 has 'argument --no-check', which rank 0 has not (every rank must run the same command, with the same SHARDMM_ environment)" \
  '[[ $R == 1 ]] && A+=(--no-check)'
case_ "an environment on rank 1 only" \
  "the ranks were not started alike: rank 1 has 'environment SHARDMM_MPI_SHARED_MEMORY=0', which rank 0 has not (every rank must run the same command, with the same SHARDMM_ environment)" \
  '[[ $R == 1 ]] && export SHARDMM_MPI_SHARED_MEMORY=0'
case_ "a profile file on rank 0's machine only" \
  "rank 1: unknown hardware profile 'p.json': not a built-in (tpu-v5e, tpu-v5p, tpu-v6e, h100) and no such file" \
  'A+=(--hw p.json)'
case_ "the same bad input on every rank" \
  "bad dims 'I=abc': size of dimension 'I' is not a whole number; a dimension size is a whole number >= 1" \
  'A[5]=I=abc'
exit $fail
