# The calibration key's build fingerprint (cmake/forward_fingerprint.cmake) on a scratch tree:
# it changes when a forward source (the target's or a drafter's) or the build flags change, not
# when a source outside the forward does, and an unchanged fingerprint leaves the header untouched (so that nothing
# recompiles).
#
#   cmake -DSCRIPT=<forward_fingerprint.cmake> -DWORK=<scratch dir> -P forward_fingerprint_test.cmake
file(REMOVE_RECURSE "${WORK}")
file(WRITE "${WORK}/src/kernels/cpu/tile.h" "int tile();\n")
file(WRITE "${WORK}/src/model/model.cpp" "int model() { return 1; }\n")
file(WRITE "${WORK}/src/speculative/backbone.cpp" "int draft() { return 1; }\n")
file(WRITE "${WORK}/src/server/server.cpp" "int serve() { return 0; }\n")
set(header "${WORK}/forward_fingerprint.h")

function(fingerprint build out)
  execute_process(COMMAND ${CMAKE_COMMAND} -DSOURCE_DIR=${WORK} -DOUTPUT=${header}
                          "-DBUILD=${build}" -P ${SCRIPT} RESULT_VARIABLE status)
  if(NOT status EQUAL 0)
    message(FATAL_ERROR "forward_fingerprint.cmake failed: ${status}")
  endif()
  file(READ "${header}" content)
  if(NOT content MATCHES "kForwardFingerprint\\[\\] = \"([0-9a-f]+)\"")
    message(FATAL_ERROR "no fingerprint in ${header}:\n${content}")
  endif()
  string(LENGTH "${CMAKE_MATCH_1}" length)
  if(NOT length EQUAL 16)
    message(FATAL_ERROR "fingerprint ${CMAKE_MATCH_1} is not 16 hex digits")
  endif()
  set(${out} "${CMAKE_MATCH_1}" PARENT_SCOPE)
endfunction()

function(expect_same a b message)
  if(NOT a STREQUAL b)
    message(FATAL_ERROR "${message}")
  endif()
endfunction()

function(expect_different a b message)
  if(a STREQUAL b)
    message(FATAL_ERROR "${message}")
  endif()
endfunction()

fingerprint("GNU 12|Release|-O3" first)
file(TIMESTAMP "${header}" written "%s")
execute_process(COMMAND ${CMAKE_COMMAND} -E sleep 1.1)
fingerprint("GNU 12|Release|-O3" again)
file(TIMESTAMP "${header}" rewritten "%s")
expect_same("${first}" "${again}" "the same sources and flags gave ${first}, then ${again}")
expect_same("${written}" "${rewritten}" "an unchanged fingerprint rewrote the header")

file(WRITE "${WORK}/src/server/server.cpp" "int serve() { return 1; }\n")
fingerprint("GNU 12|Release|-O3" outside)
expect_same("${outside}" "${first}" "a source outside the forward changed the fingerprint")

file(WRITE "${WORK}/src/kernels/cpu/tile.h" "int tile(int);\n")
fingerprint("GNU 12|Release|-O3" kernel)
expect_different("${kernel}" "${first}" "a changed kernel source kept the fingerprint ${first}")

# A drafter's cost is calibrated under the same key.
file(WRITE "${WORK}/src/speculative/backbone.cpp" "int draft() { return 2; }\n")
fingerprint("GNU 12|Release|-O3" drafter)
expect_different("${drafter}" "${kernel}" "a changed drafter source kept the fingerprint ${kernel}")

fingerprint("GNU 12|Debug|-O0" flags)
expect_different("${flags}" "${drafter}" "other build flags kept the fingerprint ${drafter}")

file(WRITE "${WORK}/src/model/extra.h" "int extra();\n")
fingerprint("GNU 12|Debug|-O0" added)
expect_different("${added}" "${flags}" "a new forward source kept the fingerprint ${flags}")
file(REMOVE_RECURSE "${WORK}")
