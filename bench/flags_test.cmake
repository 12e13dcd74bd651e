# ctest driver: the bench programs' flags. --help prints the usage and exits 0; a bad flag is
# one line on stderr naming it and its rule, exit 2, before anything is measured.
# Variables: BENCHES ("launcher|program" entries separated by commas; launcher empty or an
# mpirun command line).
string(REPLACE "," ";" BENCHES "${BENCHES}")
foreach(entry ${BENCHES})
  string(FIND "${entry}" "|" bar)
  string(SUBSTRING "${entry}" 0 ${bar} launcher)
  math(EXPR after "${bar} + 1")
  string(SUBSTRING "${entry}" ${after} -1 program)
  separate_arguments(launcher UNIX_COMMAND "${launcher}")
  get_filename_component(name "${program}" NAME)
  execute_process(COMMAND ${launcher} ${program} --help OUTPUT_VARIABLE out ERROR_VARIABLE err RESULT_VARIABLE status
                  TIMEOUT 60)
  if(NOT status EQUAL 0 OR NOT out MATCHES "^usage: ")
    message(FATAL_ERROR "${name} --help: exit ${status}, expected 0 and the usage\n${out}${err}")
  endif()
  foreach(bad "--repeat;0|--repeat: '0' is not a whole number from 1 up"
              "--repeat|--repeat needs a value"
              "--no-such-flag|unknown flag '--no-such-flag'")
    string(REPLACE "|" ";" case "${bad}")
    list(GET case -1 expected)
    list(REMOVE_AT case -1)
    execute_process(COMMAND ${launcher} ${program} ${case} OUTPUT_VARIABLE out ERROR_VARIABLE err
                    RESULT_VARIABLE status TIMEOUT 60)
    string(FIND "${err}" "${name}: ${expected}" at)
    if(NOT status EQUAL 2 OR at EQUAL -1)
      message(FATAL_ERROR "${name} ${case}: exit ${status}, expected 2 and '${name}: ${expected}'\n${out}${err}")
    endif()
  endforeach()
  message(STATUS "${name}: --help and three bad flags as expected")
endforeach()
