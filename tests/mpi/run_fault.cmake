# ctest driver: stages one fault of mpi_fault_program.cpp as a 2-rank job and passes when the
# job ends by itself, non-zero, within the bound (a hang guard, far above the 2 s watchdog),
# and its output holds each fragment of the expected message. Run with SHARDMM_WATCHDOG_S=2
# in the environment.
# Variables: MPIEXEC, PROGRAM, MODE.
set(bound 60)
set(hint "(watchdog 2 s; SHARDMM_WATCHDOG_S sets it)")
if(MODE STREQUAL "watchdog")
  set(expect "shardmm: rank 0: collective timeout in group over X of device 0: rank 0 called all_reduce(f32, 2 elements) and waited 2 s; rank 1 never arrived ${hint}")
elseif(MODE STREQUAL "recv-watchdog")
  set(expect "shardmm: rank 0: p2p timeout: rank 0 waited 2 s in recv(8 bytes from rank 1, tag 3); nothing arrived ${hint}")
elseif(MODE STREQUAL "irecv-watchdog")
  set(expect "shardmm: rank 0: p2p timeout: rank 0 waited 2 s in recv(8 bytes from rank 1, tag 3); nothing arrived ${hint}")
elseif(MODE STREQUAL "isend-watchdog")
  set(expect "shardmm: rank 0: p2p timeout: rank 0 waited 2 s in isend(1048576 bytes to rank 1, tag 3); no receive was posted ${hint}")
elseif(MODE STREQUAL "end-watchdog")
  set(expect "shardmm: rank 0: collective timeout at the end of the run: rank 0 returned and waited 2 s; rank 1 never returned ${hint}")
elseif(MODE STREQUAL "mismatch")
  # Both ranks find it; whichever aborts first prints.
  set(expect "collective mismatch in group over X of device 0: rank 0 called all_gather(f32, counts [1, 1]), rank 1 called all_reduce(f32, 2 elements)")
elseif(MODE STREQUAL "unchecked-mismatch")
  set(expect "shardmm: rank 0: collective mismatch in all_to_all" "rank 0 expects a message of 2 elements from rank 1, which sent another count")
elseif(MODE STREQUAL "unchecked-lent-mismatch")
  set(expect "shardmm: rank 0: collective mismatch in all_to_all" "rank 0 expects a message of 300001 elements from rank 1, which sent another count")
elseif(MODE STREQUAL "throw")
  set(expect "shardmm: rank 1: rank 1 failed on purpose")
elseif(MODE STREQUAL "exit")
  set(expect "shardmm: rank 1: the process exited in the middle of a run of the mpi backend")
elseif(MODE STREQUAL "abort")
  # mpirun's own report (Open MPI's wording).
  set(expect "process rank 1 with PID" "exited on signal 6 (Aborted)")
else()
  message(FATAL_ERROR "unknown MODE '${MODE}'")
endif()

string(TIMESTAMP start "%s")
execute_process(
  COMMAND ${MPIEXEC} --allow-run-as-root --oversubscribe -n 2 ${PROGRAM} ${MODE}
  OUTPUT_VARIABLE out
  ERROR_VARIABLE err
  RESULT_VARIABLE status
  TIMEOUT ${bound})
string(TIMESTAMP end "%s")
math(EXPR took "${end} - ${start}")
set(output "--- stdout\n${out}--- stderr\n${err}")
if(NOT status MATCHES "^[0-9]+$")
  message(FATAL_ERROR "${MODE}: the job did not end by itself within ${bound} s (${status})\n${output}")
endif()
if(status EQUAL 0)
  message(FATAL_ERROR "${MODE}: the job exited 0\n${output}")
endif()
foreach(fragment IN LISTS expect)
  string(FIND "${out}${err}" "${fragment}" at)
  if(at EQUAL -1)
    message(FATAL_ERROR "${MODE}: exit status ${status} but the output lacks\n  ${fragment}\n${output}")
  endif()
endforeach()
message(STATUS "${MODE}: the job ended with status ${status} after ${took} s and said\n  ${expect}")
