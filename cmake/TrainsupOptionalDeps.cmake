# Decides TRAINSUP_WITH_TORCH / _CUDA / _PYTHON.
#
# Each option is tri-state in practice: unset (auto: ON if the dependency is found, OFF with a
# message if not), ON (the dependency is required; configure fails without it) or OFF (skipped).

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
  # torch: Debian's libtorch-dev ships TorchConfig.cmake. Probe quietly unless asked for.
  if(NOT DEFINED TRAINSUP_WITH_TORCH OR TRAINSUP_WITH_TORCH)
    find_package(Torch QUIET)
  endif()
  _trainsup_layer(TORCH Torch_FOUND "libtorch (TorchConfig.cmake) was not found; set Torch_DIR or install libtorch-dev")

  # CUDA: only the toolkit is needed to build; a machine without a driver or device runs fine.
  if(NOT DEFINED TRAINSUP_WITH_CUDA OR TRAINSUP_WITH_CUDA)
    if(NOT CUDAToolkit_ROOT AND EXISTS /usr/local/cuda)
      set(CUDAToolkit_ROOT /usr/local/cuda)
    endif()
    find_package(CUDAToolkit QUIET)
  endif()
  _trainsup_layer(CUDA CUDAToolkit_FOUND "the CUDA toolkit was not found; set CUDAToolkit_ROOT")

  # Python: the interpreter that has torch. On Debian that is /usr/bin/python3, not a pyenv shim.
  if(NOT DEFINED TRAINSUP_WITH_PYTHON OR TRAINSUP_WITH_PYTHON)
    if(NOT Python_EXECUTABLE AND EXISTS /usr/bin/python3)
      set(Python_EXECUTABLE /usr/bin/python3)
    endif()
    find_package(Python 3.8 QUIET COMPONENTS Interpreter Development.Module)
    if(Python_FOUND)
      set(PYBIND11_FINDPYTHON ON)
      find_package(pybind11 CONFIG QUIET)
    endif()
  endif()
  if(Python_FOUND AND pybind11_FOUND)
    set(_trainsup_py_found TRUE)
  else()
    set(_trainsup_py_found FALSE)
  endif()
  _trainsup_layer(PYTHON _trainsup_py_found "Python 3 development files or pybind11 were not found (install python3-dev pybind11-dev)")
endmacro()
