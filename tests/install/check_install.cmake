# Installs the build tree into a fresh prefix, then configures, builds and runs an out-of-tree
# consumer that does find_package(trainsup) and links trainsup::supervisor and trainsup::agent.
file(REMOVE_RECURSE ${WORK_DIR})
set(prefix ${WORK_DIR}/prefix)
function(run)
  execute_process(COMMAND ${ARGV} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "command failed (${rc}): ${ARGV}\n${out}\n${err}")
  endif()
  message(STATUS "${out}")
endfunction()
run(${CMAKE_COMMAND} --install ${BUILD_DIR} --prefix ${prefix})
foreach(f include/trainsup/supervisor.h include/trainsup/version.h lib/cmake/trainsup/trainsupConfig.cmake
          lib/cmake/trainsup/trainsupConfigVersion.cmake)
  if(NOT EXISTS ${prefix}/${f})
    message(FATAL_ERROR "install is missing ${f}")
  endif()
endforeach()
run(${CMAKE_COMMAND} -S ${SOURCE_DIR} -B ${WORK_DIR}/build -DCMAKE_PREFIX_PATH=${prefix})
run(${CMAKE_COMMAND} --build ${WORK_DIR}/build)
run(${CMAKE_COMMAND} -E env TRAINSUP_LOG_DIR=${WORK_DIR}/logs TRAINSUP_NODE_NAME=consumer-host
    ${WORK_DIR}/build/consumer)
run(${WORK_DIR}/build/consumer_agent)
file(GLOB logs ${WORK_DIR}/logs/local-consumer-host-r0.log)
if(NOT logs)
  message(FATAL_ERROR "the consumer did not write its rank log under ${WORK_DIR}/logs")
endif()
# The installed Python package imports from the prefix alone (RPATH to libtrainsup).
if(PYTHON_EXECUTABLE AND EXISTS ${prefix}/lib/python3/dist-packages/trainsup/__init__.py)
  run(${CMAKE_COMMAND} -E env PYTHONPATH=${prefix}/lib/python3/dist-packages
      ${PYTHON_EXECUTABLE} -c "import trainsup\nprint('installed trainsup', trainsup.__version__, trainsup.__file__)")
  # The installed commands find the package beside them, with no PYTHONPATH.
  run(${prefix}/bin/trainsup quarantine exclude-arg --dir ${prefix}/quarantine-check)
  run(${prefix}/bin/trainsup-run --help)
endif()
