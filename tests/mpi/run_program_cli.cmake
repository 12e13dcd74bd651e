# ctest driver: `shardmm program --run --backend mpi` as a 4-rank job: the decoder stack on a
# 2x2 mesh (tensor and data parallel), the MLP with uneven and empty shards, and the MoE
# expert parallel (E=3 over 4: an empty shard; routing on each rank's own sequences)
# (verified_jobs.cmake says what passes). Variables: MPIEXEC, SHARDMM, SOURCE (the repository).
include(${CMAKE_CURRENT_LIST_DIR}/verified_jobs.cmake)
expect_verified_jobs(program
  "${SOURCE}/examples/programs/gpt.prog --dims B=2,T=3,S=3,D=8,H=2,A=4,F=6"
  "${SOURCE}/examples/programs/mlp.prog --dims B=3,T=2,D=5,F=3 --optimizer adam"
  "${SOURCE}/examples/programs/moe.prog --dims B=5,T=6,D=4,F=5,E=3,C=3")
