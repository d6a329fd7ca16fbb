# CUTLASS/CuTe headers come from PyPI's nvidia-cutlass (nothing is vendored):
# either a path the user gives (-DFLASH3_CUTLASS_DIR=<dir holding cute/ and
# cutlass/>), or the package installed into the build tree on first configure.
set(FLASH3_CUTLASS_VERSION 4.2.0.0)
set(FLASH3_CUTLASS_DIR "$ENV{FLASH3_CUTLASS_DIR}" CACHE PATH "CUTLASS include dir (holding cute/ and cutlass/)")
find_package(Python3 COMPONENTS Interpreter REQUIRED)

function(flash3_pip_install package target_dir)
  if(NOT EXISTS ${target_dir})
    message(STATUS "flash3: installing ${package} into ${target_dir}")
    execute_process(COMMAND ${Python3_EXECUTABLE} -m pip install --quiet --disable-pip-version-check --no-deps
                            --target ${target_dir} ${package}
                    RESULT_VARIABLE rc)
    if(NOT rc EQUAL 0)
      file(REMOVE_RECURSE ${target_dir})
      message(FATAL_ERROR "flash3: 'pip install ${package}' failed; install it yourself and pass its path")
    endif()
  endif()
endfunction()

if(FLASH3_CUTLASS_DIR)
  set(FLASH3_CUTLASS_INCLUDE ${FLASH3_CUTLASS_DIR})
else()
  set(dir ${PROJECT_BINARY_DIR}/_deps/nvidia-cutlass-${FLASH3_CUTLASS_VERSION})
  flash3_pip_install(nvidia-cutlass==${FLASH3_CUTLASS_VERSION} ${dir})
  set(FLASH3_CUTLASS_INCLUDE ${dir}/cutlass_library/source/include)
endif()
if(NOT EXISTS ${FLASH3_CUTLASS_INCLUDE}/cute/tensor.hpp)
  message(FATAL_ERROR "flash3: no CuTe headers under ${FLASH3_CUTLASS_INCLUDE}")
endif()
message(STATUS "flash3: CUTLASS headers: ${FLASH3_CUTLASS_INCLUDE}")

# cuobjdump/nvdisasm read the compiled kernels' SASS for a CPU-only test. Some
# toolkits ship without them; PyPI has both.
find_program(FLASH3_CUOBJDUMP cuobjdump HINTS ${CUDAToolkit_BIN_DIR} /usr/local/cuda/bin)
find_program(FLASH3_NVDISASM nvdisasm HINTS ${CUDAToolkit_BIN_DIR} /usr/local/cuda/bin)
if(FLASH3_BUILD_TESTS AND (NOT FLASH3_CUOBJDUMP OR NOT FLASH3_NVDISASM))
  set(tools ${PROJECT_BINARY_DIR}/_deps/cuda-binary-tools)
  flash3_pip_install("nvidia-cuda-cuobjdump==13.2.86;nvidia-cuda-nvdisasm==13.2.86" ${tools})
  set(FLASH3_CUOBJDUMP ${tools}/nvidia/cu13/bin/cuobjdump CACHE FILEPATH "" FORCE)
  set(FLASH3_NVDISASM ${tools}/nvidia/cu13/bin/nvdisasm CACHE FILEPATH "" FORCE)
endif()
