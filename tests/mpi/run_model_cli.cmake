# ctest driver: `shardmm model --run --backend mpi` as a 4-rank job, one layer per strategy
# family. Passes when each job exits 0 and rank 0 alone prints one JSON document that says
# verified. Variables: MPIEXEC, SHARDMM.
foreach(args "mlp;--strategy;fsdp;--mesh;X=4;--dims;B=5,T=4,D=16,F=24"
             "block;--strategy;dp+sp;--mesh;dp=2,tp=2;--dims;B=3,T=6,D=8,F=16,H=2;--causal"
             "moe;--strategy;ep;--mesh;X=4;--dims;B=4,T=8,D=8,F=16,E=6,K=2;--dtype;f64")
  execute_process(
    COMMAND ${MPIEXEC} --allow-run-as-root --oversubscribe -n 4 ${SHARDMM} model ${args} --run --backend mpi --json
    OUTPUT_VARIABLE out
    ERROR_VARIABLE err
    RESULT_VARIABLE status
    TIMEOUT 120)
  if(NOT status EQUAL 0)
    message(FATAL_ERROR "shardmm model ${args} under mpirun exited ${status}\n${err}")
  endif()
  string(REGEX MATCHALL "\"verified\": true" verdicts "${out}")
  list(LENGTH verdicts count)
  string(REGEX MATCHALL "\"command\": \"model\"" docs "${out}")
  list(LENGTH docs ndocs)
  if(NOT count EQUAL 1 OR NOT ndocs EQUAL 1)
    message(FATAL_ERROR "expected one verified document from rank 0, got ${ndocs} documents:\n${out}")
  endif()
  message(STATUS "model ${args}: one verified document from rank 0")
endforeach()
