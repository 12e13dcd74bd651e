# ctest driver: `shardmm model --run --backend mpi` as a 4-rank job, one layer per strategy
# family (verified_jobs.cmake says what passes). Variables: MPIEXEC, SHARDMM.
include(${CMAKE_CURRENT_LIST_DIR}/verified_jobs.cmake)
expect_verified_jobs(model
  "mlp --strategy fsdp --mesh X=4 --dims B=5,T=4,D=16,F=24"
  "block --strategy dp+sp --mesh dp=2,tp=2 --dims B=3,T=6,D=8,F=16,H=2 --causal"
  "moe --strategy ep --mesh X=4 --dims B=4,T=8,D=8,F=16,E=6,K=2 --dtype f64")
