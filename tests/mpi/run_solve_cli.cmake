# ctest driver: `shardmm solve --run --backend mpi` as a 4-rank job: every rank solves (the
# solvers are deterministic: the same answer on each), rank 0 prints, the chosen sharding runs
# and verifies (verified_jobs.cmake). Variables: MPIEXEC, SHARDMM, SOURCE (the repository).
include(${CMAKE_CURRENT_LIST_DIR}/verified_jobs.cmake)
expect_verified_jobs(solve
  "${SOURCE}/examples/programs/mlp_free.prog --dims B=3,T=2,D=5,F=3 --optimizer adam"
  "${SOURCE}/examples/programs/mlp_free.prog --dims B=4,T=4,D=8,F=12 --pin w_in=w_in[D,F_X] --split chunk")
