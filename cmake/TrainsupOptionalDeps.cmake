# Decides TRAINSUP_WITH_PYTHON / _TORCH / _CUDA.
#
# Each option is tri-state in practice: unset (auto: ON if the dependency is found, OFF with a
# message if not), ON (the dependency is required; configure fails without it) or OFF (skipped).
#
# torch comes from a Python environment (the PyPI wheel ships libtorch and its CMake config):
# the one of Python_EXECUTABLE (scripts/build.sh passes the project's venv; `pip install .` its
# own interpreter). An explicit Torch_DIR or CMAKE_PREFIX_PATH entry wins.

# The oldest torch whose c10d Backend API and torchrun internals trainsup is written for.
set(TRAINSUP_TORCH_MIN_VERSION 2.9)
set(_trainsup_cmake_dir ${CMAKE_CURRENT_LIST_DIR})

macro(_trainsup_layer name found_var why)
  if(NOT DEFINED TRAINSUP_WITH_${name})
    if(${found_var})
      set(TRAINSUP_WITH_${name} ON CACHE BOOL "Build the ${name} layer" FORCE)
    else()
      message(STATUS "trainsup: ${name} layer OFF: ${why}")
      set(TRAINSUP_WITH_${name} OFF CACHE BOOL "Build the ${name} layer" FORCE)
    endif()
  elseif(TRAINSUP_WITH_${name} AND NOT ${found_var})
    message(FATAL_ERROR "TRAINSUP_WITH_${name}=ON but ${why}")
  endif()
endmacro()

macro(trainsup_optional_layers)
  # Python: the interpreter of the environment trainsup is built for (its torch, its pybind11).
  set(_trainsup_want_python FALSE)
  if(NOT DEFINED TRAINSUP_WITH_PYTHON OR TRAINSUP_WITH_PYTHON OR NOT DEFINED TRAINSUP_WITH_TORCH OR TRAINSUP_WITH_TORCH)
    set(_trainsup_want_python TRUE)
    find_package(Python 3.9 QUIET COMPONENTS Interpreter Development.Module)
  endif()

  # torch: located through that interpreter unless Torch_DIR says where.
  if(NOT DEFINED TRAINSUP_WITH_TORCH OR TRAINSUP_WITH_TORCH)
    if(NOT Torch_DIR AND Python_Interpreter_FOUND)
      execute_process(COMMAND ${Python_EXECUTABLE} ${_trainsup_cmake_dir}/find_torch.py
                      OUTPUT_VARIABLE _trainsup_torch_info RESULT_VARIABLE _rc ERROR_QUIET)
      if(_rc EQUAL 0 AND _trainsup_torch_info)
        list(GET _trainsup_torch_info 0 _trainsup_torch_prefix)
        list(GET _trainsup_torch_info 1 TRAINSUP_TORCH_PY_VERSION)
        list(APPEND CMAKE_PREFIX_PATH ${_trainsup_torch_prefix})
        message(STATUS "trainsup: torch ${TRAINSUP_TORCH_PY_VERSION} of ${Python_EXECUTABLE} (${_trainsup_torch_prefix})")
      endif()
    endif()
    # TorchConfig.cmake looks for CUDA by itself when the wheel is a CUDA build.
    find_package(Torch QUIET)
    if(Torch_FOUND AND TORCH_VERSION AND NOT Torch_VERSION)
      set(Torch_VERSION ${TORCH_VERSION})
    endif()
    if(Torch_FOUND AND Torch_VERSION VERSION_LESS TRAINSUP_TORCH_MIN_VERSION)
      message(FATAL_ERROR "trainsup needs torch >= ${TRAINSUP_TORCH_MIN_VERSION}; found ${Torch_VERSION} "
                          "(${Torch_DIR}). Install a newer torch into the build's Python environment.")
    endif()
  endif()
  if(Torch_FOUND AND NOT TRAINSUP_TORCH_PY_VERSION)
    set(TRAINSUP_TORCH_PY_VERSION ${Torch_VERSION})
  endif()
  _trainsup_layer(TORCH Torch_FOUND "libtorch was not found: install torch into the Python environment (pip install torch==2.13.0), or set Torch_DIR")

  # CUDA: only the toolkit is needed to build; a machine without a driver or device runs fine.
  if(NOT DEFINED TRAINSUP_WITH_CUDA OR TRAINSUP_WITH_CUDA)
    if(NOT CUDAToolkit_ROOT AND EXISTS /usr/local/cuda)
      set(CUDAToolkit_ROOT /usr/local/cuda)
    endif()
    find_package(CUDAToolkit QUIET)
  endif()
  _trainsup_layer(CUDA CUDAToolkit_FOUND "the CUDA toolkit was not found; set CUDAToolkit_ROOT")

  # pybind11: from the same environment (the pybind11 wheel ships its CMake config).
  if(_trainsup_want_python AND Python_FOUND AND NOT pybind11_DIR)
    execute_process(COMMAND ${Python_EXECUTABLE} -c "import pybind11; print(pybind11.get_cmake_dir(), end='')"
                    OUTPUT_VARIABLE _trainsup_pybind11_dir RESULT_VARIABLE _rc ERROR_QUIET)
    if(_rc EQUAL 0)
      set(pybind11_DIR ${_trainsup_pybind11_dir})
    endif()
  endif()
  if(_trainsup_want_python AND Python_FOUND AND (NOT DEFINED TRAINSUP_WITH_PYTHON OR TRAINSUP_WITH_PYTHON))
    set(PYBIND11_FINDPYTHON ON)
    find_package(pybind11 2.12 CONFIG QUIET)
  endif()
  if(Python_FOUND AND pybind11_FOUND)
    set(_trainsup_py_found TRUE)
  else()
    set(_trainsup_py_found FALSE)
  endif()
  _trainsup_layer(PYTHON _trainsup_py_found "Python 3 development files or pybind11 were not found (pip install pybind11 into the build's environment)")
endmacro()
