# expect_verified_jobs(COMMAND JOB...): each JOB (its arguments separated by spaces) runs as
# `shardmm COMMAND ARGS --run --backend mpi --json`, a 4-rank job; passes when each job exits
# 0 and rank 0 alone prints one JSON document that says verified. Variables: MPIEXEC, SHARDMM.
function(expect_verified_jobs command)
  foreach(job ${ARGN})
    string(REPLACE " " ";" args "${job}")
    execute_process(
      COMMAND ${MPIEXEC} --allow-run-as-root --oversubscribe -n 4 ${SHARDMM} ${command} ${args} --run --backend mpi --json
      OUTPUT_VARIABLE out
      ERROR_VARIABLE err
      RESULT_VARIABLE status
      TIMEOUT 120)
    if(NOT status EQUAL 0)
      message(FATAL_ERROR "shardmm ${command} ${args} under mpirun exited ${status}\n${err}")
    endif()
    string(REGEX MATCHALL "\"verified\": true" verdicts "${out}")
    list(LENGTH verdicts count)
    string(REGEX MATCHALL "\"command\": \"${command}\"" docs "${out}")
    list(LENGTH docs ndocs)
    if(NOT count EQUAL 1 OR NOT ndocs EQUAL 1)
      message(FATAL_ERROR "expected one verified document from rank 0, got ${ndocs} documents:\n${out}")
    endif()
    message(STATUS "${command} ${args}: one verified document from rank 0")
  endforeach()
endfunction()
