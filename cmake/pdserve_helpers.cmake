# Temp-dir hygiene: every test runs with TMPDIR=<build>/test-tmp (fixture `test_tmp`): the
# setup test empties it first, the cleanup test (after every test that ran) fails, naming them,
# when anything is left there. So a test that leaves files behind, also on failure, is caught.
set(PDSERVE_TEST_TMPDIR ${CMAKE_BINARY_DIR}/test-tmp)
set(PDSERVE_TEST_HYGIENE_PROPERTIES ENVIRONMENT "TMPDIR=${PDSERVE_TEST_TMPDIR}" FIXTURES_REQUIRED test_tmp)
# pdserve_test_hygiene(test ...): the same for tests registered with add_test.
function(pdserve_test_hygiene)
  foreach(t ${ARGN})
    set_property(TEST ${t} APPEND PROPERTY ENVIRONMENT "TMPDIR=${PDSERVE_TEST_TMPDIR}")
    set_property(TEST ${t} APPEND PROPERTY FIXTURES_REQUIRED test_tmp)
  endforeach()
endfunction()

# pdserve_add_test(NAME name SOURCES a.cc b.cc LIBS lib1 lib2 [TIMEOUT s] [LABELS l])
# A GoogleTest binary registered with CTest (one CTest entry per test case).
function(pdserve_add_test)
  cmake_parse_arguments(T "" "NAME;TIMEOUT" "SOURCES;LIBS;LABELS" ${ARGN})
  if(NOT T_TIMEOUT)
    set(T_TIMEOUT 300)
  endif()
  add_executable(${T_NAME} ${T_SOURCES})
  target_link_libraries(${T_NAME} PRIVATE ${T_LIBS} GTest::gtest GTest::gtest_main GTest::gmock)
  set_target_properties(${T_NAME} PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/tests)
  gtest_discover_tests(${T_NAME}
    WORKING_DIRECTORY ${CMAKE_SOURCE_DIR}
    PROPERTIES TIMEOUT ${T_TIMEOUT} LABELS "${T_LABELS}" ${PDSERVE_TEST_HYGIENE_PROPERTIES}
    DISCOVERY_TIMEOUT 60)
endfunction()
