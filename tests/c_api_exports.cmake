# ctest's c_api_exports: libflash3_c exports exactly the functions flash3_c.h
# declares (a C++ or CUDA runtime symbol would bind to, or be bound by, a host
# process's own copies), and loads no libcudart (it carries the static one).
#   cmake -DLIBRARY=<libflash3_c.so> -DNM=<nm> -DOBJDUMP=<objdump> -DHEADER=<flash3_c.h> -P c_api_exports.cmake
execute_process(COMMAND ${NM} -D --defined-only ${LIBRARY} OUTPUT_VARIABLE nm_out RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "${NM} failed on ${LIBRARY}")
endif()
string(REGEX MATCHALL "[^ \n]+\n" names "${nm_out}")
list(TRANSFORM names STRIP)
list(SORT names)

file(READ ${HEADER} header)
string(REGEX MATCHALL "flash3_[a-z0-9_]+\\(" declared "${header}")
list(TRANSFORM declared REPLACE "\\($" "")
list(REMOVE_DUPLICATES declared)
list(SORT declared)
if(NOT names STREQUAL declared)
  message(FATAL_ERROR "${LIBRARY} exports\n  ${names}\nbut flash3_c.h declares\n  ${declared}")
endif()

execute_process(COMMAND ${OBJDUMP} -p ${LIBRARY} OUTPUT_VARIABLE headers RESULT_VARIABLE rc)
string(REGEX MATCHALL "NEEDED +[^\n]+" needed "${headers}")
if(NOT rc EQUAL 0 OR needed MATCHES "cudart")
  message(FATAL_ERROR "${LIBRARY} needs: ${needed} (no libcudart expected; objdump rc ${rc})")
endif()
message(STATUS "exports: ${names}; ${needed}")
