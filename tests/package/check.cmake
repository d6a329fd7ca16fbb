# The package test (ctest's "package"): installs the built flash3 into a
# scratch prefix and builds and runs the consumer project against it, then
# configures the consumer with flash3 as add_subdirectory and FetchContent and
# compiles its source (linking would build the kernels again).
#   cmake -DBUILD_DIR=<flash3 build> -DSOURCE_DIR=<flash3 tree> -DWORK_DIR=<scratch>
#         -DCUDA_COMPILER=<nvcc> -DCUDA_ROOT=<toolkit> -DCUTLASS_DIR=<include dir> [-DNINJA=<ninja>] -P check.cmake
function(run)
  execute_process(COMMAND ${ARGV} RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    list(JOIN ARGV " " command)
    message(FATAL_ERROR "failed (${rc}): ${command}")
  endif()
endfunction()

set(generator -G Ninja)
if(NINJA)
  list(APPEND generator -DCMAKE_MAKE_PROGRAM=${NINJA})
endif()
file(REMOVE_RECURSE ${WORK_DIR})

run(${CMAKE_COMMAND} --install ${BUILD_DIR} --prefix ${WORK_DIR}/prefix)
run(${CMAKE_COMMAND} -S ${CMAKE_CURRENT_LIST_DIR} -B ${WORK_DIR}/find_package ${generator}
    -DFLASH3_FROM=find_package -DCMAKE_PREFIX_PATH=${WORK_DIR}/prefix -DCUDAToolkit_ROOT=${CUDA_ROOT})
run(${CMAKE_COMMAND} --build ${WORK_DIR}/find_package)
run(${WORK_DIR}/find_package/consumer)

foreach(from IN ITEMS add_subdirectory FetchContent)
  run(${CMAKE_COMMAND} -S ${CMAKE_CURRENT_LIST_DIR} -B ${WORK_DIR}/${from} ${generator}
      -DFLASH3_FROM=${from} -DFLASH3_TREE=${SOURCE_DIR} -DCMAKE_CUDA_COMPILER=${CUDA_COMPILER}
      -DFLASH3_CUTLASS_DIR=${CUTLASS_DIR})
  run(${CMAKE_COMMAND} --build ${WORK_DIR}/${from} --target CMakeFiles/consumer.dir/main.cpp.o)
endforeach()
