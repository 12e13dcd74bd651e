# cmake -P driver of the install_consumer test: install BUILD_DIR into WORK_DIR/prefix,
# configure and build CONSUMER_SOURCE_DIR against it, run the consumer. Stops at the first
# failing step with a "CMake Error".
foreach(var BUILD_DIR CONSUMER_SOURCE_DIR WORK_DIR GENERATOR CXX_COMPILER)
  if(NOT DEFINED ${var})
    message(FATAL_ERROR "run_consumer.cmake needs -D${var}=...")
  endif()
endforeach()

set(prefix ${WORK_DIR}/prefix)
set(build ${WORK_DIR}/build)
file(REMOVE_RECURSE ${WORK_DIR})

function(run_step what)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "install_consumer: ${what} failed (${rc}):\n${out}")
  endif()
endfunction()

run_step("installing ${BUILD_DIR} into ${prefix}"
         ${CMAKE_COMMAND} --install ${BUILD_DIR} --prefix ${prefix})

set(configure ${CMAKE_COMMAND} -S ${CONSUMER_SOURCE_DIR} -B ${build} -G ${GENERATOR}
    -DCMAKE_PREFIX_PATH=${prefix} -DCMAKE_CXX_COMPILER=${CXX_COMPILER})
if(MAKE_PROGRAM)
  list(APPEND configure -DCMAKE_MAKE_PROGRAM=${MAKE_PROGRAM})
endif()
if(BUILD_TYPE)
  list(APPEND configure -DCMAKE_BUILD_TYPE=${BUILD_TYPE})
endif()
if(C_COMPILER)  # the package config enables C to find MPI's C library
  list(APPEND configure -DCMAKE_C_COMPILER=${C_COMPILER})
endif()
run_step("configuring the consumer" ${configure})

# A shardmm installed elsewhere (/usr/local) must not stand in for the one under test.
file(STRINGS ${build}/CMakeCache.txt found REGEX "^shardmm_DIR:")
string(REGEX REPLACE "^[^=]*=" "" found "${found}")
cmake_path(IS_PREFIX prefix "${found}" NORMALIZE under_prefix)
if(NOT under_prefix)
  message(FATAL_ERROR "install_consumer: the consumer found shardmm in '${found}', not under ${prefix}")
endif()

run_step("building the consumer" ${CMAKE_COMMAND} --build ${build})

# The consumer's output goes straight to the test log, where the test checks it.
execute_process(COMMAND ${build}/consumer RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "install_consumer: the consumer exited with ${rc}")
endif()

# The Python package, imported from the prefix (not the build tree) in a scratch directory.
if(PYTHON)
  run_step("importing shardmm from ${prefix}/${PYTHON_PACKAGE_DIR}"
           ${CMAKE_COMMAND} -E chdir ${WORK_DIR} ${CMAKE_COMMAND} -E env PYTHONPATH=${prefix}/${PYTHON_PACKAGE_DIR}
           ${PYTHON} ${CMAKE_CURRENT_LIST_DIR}/import_installed.py ${prefix})
endif()
