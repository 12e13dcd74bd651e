# ctest driver: `shardmm run --backend mpi` as a 4-rank job, checked (the default), with
# --no-check, and with --split chunk (I=37 over 4: 10,10,10,7, not 10,9,9,9). Passes when each
# job exits 0, prints exactly one JSON document (rank 0 alone prints) and that document says
# verified.
# Variables: MPIEXEC, SHARDMM.
foreach(check_flag "" "--no-check" "--split=chunk")
  execute_process(
    COMMAND ${MPIEXEC} --allow-run-as-root --oversubscribe -n 4 ${SHARDMM} run "A[I, J_X] @ B[J_X, K] -> C[I_X, K]"
            --mesh X=4 --dims I=37,J=64,K=9 --backend mpi --repeat 2 --json ${check_flag}
    OUTPUT_VARIABLE out
    ERROR_VARIABLE err
    RESULT_VARIABLE status
    TIMEOUT 120)
  if(NOT status EQUAL 0)
    message(FATAL_ERROR "shardmm run ${check_flag} under mpirun exited ${status}\n${err}")
  endif()
  string(REGEX MATCHALL "\"verified\": true" verdicts "${out}")
  list(LENGTH verdicts count)
  if(NOT count EQUAL 1)
    message(FATAL_ERROR "expected one verified document from rank 0, got ${count}:\n${out}")
  endif()
  string(REGEX MATCHALL "\"expr\"" docs "${out}")
  list(LENGTH docs ndocs)
  if(NOT ndocs EQUAL 1)
    message(FATAL_ERROR "expected rank 0 alone to print, got ${ndocs} documents")
  endif()
  message(STATUS "run ${check_flag}: one verified document from rank 0")
endforeach()
