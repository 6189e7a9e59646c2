# Multi-process (mpirun) tests. Include it from the top-level CMakeLists.txt or from each module
# with MPI tests (comm/ does). No include guard on purpose: the variables below are directory
# scoped, so every directory that includes it must get them; re-including only redefines them.
#
#   pdserve_add_mpi_test(NAME name TARGET exe NP n [ARGS a...] [TIMEOUT s] [LABELS l...])
#
# registers one CTest entry that runs `mpirun -n <NP> <exe> <ARGS>` under PDSERVE_MPI_TEST_ENV,
# bounded by `timeout` so a hung collective fails the test instead of blocking CI. The target is
# a test binary with its own main (comm/testing/mpi_test_main.cc: MPI_Init, every rank runs the
# tests, a failure on any rank makes every rank exit non-zero).
#
# PDSERVE_MPI_TEST_ENV is the environment that makes mpirun work here without a hostfile:
#   * run as root (CI containers) and more ranks than cores (oversubscribe);
#   * yield when idle: oversubscribed ranks that busy-poll starve the rank they wait for;
#   * shared memory + loopback TCP only, so no test ever touches a real network interface.
# Use it for any other mpirun-driven CTest entry: `${CMAKE_COMMAND} -E env ${PDSERVE_MPI_TEST_ENV} ...`.
find_program(PDSERVE_TIMEOUT_EXE timeout REQUIRED)

set(PDSERVE_MPIEXEC ${MPIEXEC_EXECUTABLE})
if(NOT PDSERVE_MPIEXEC)
  find_program(PDSERVE_MPIEXEC NAMES mpirun mpiexec REQUIRED)
endif()
set(PDSERVE_MPI_NP_FLAG ${MPIEXEC_NUMPROC_FLAG})
if(NOT PDSERVE_MPI_NP_FLAG)
  set(PDSERVE_MPI_NP_FLAG -n)
endif()

set(PDSERVE_MPI_TEST_ENV
  OMPI_ALLOW_RUN_AS_ROOT=1
  OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
  OMPI_MCA_rmaps_base_oversubscribe=1
  OMPI_MCA_mpi_yield_when_idle=1
  OMPI_MCA_btl=self,vader,tcp
  OMPI_MCA_btl_tcp_if_include=lo
  OMPI_MCA_oob_tcp_if_include=lo)

function(pdserve_add_mpi_test)
  cmake_parse_arguments(T "" "NAME;TARGET;NP;TIMEOUT" "ARGS;LABELS" ${ARGN})
  if(NOT T_NAME OR NOT T_TARGET OR NOT T_NP)
    message(FATAL_ERROR "pdserve_add_mpi_test: NAME, TARGET and NP are required")
  endif()
  if(NOT T_TIMEOUT)
    set(T_TIMEOUT 120)
  endif()
  add_test(NAME ${T_NAME}
    COMMAND ${CMAKE_COMMAND} -E env ${PDSERVE_MPI_TEST_ENV}
            ${PDSERVE_TIMEOUT_EXE} --kill-after=10 ${T_TIMEOUT}
            ${PDSERVE_MPIEXEC} ${PDSERVE_MPI_NP_FLAG} ${T_NP} $<TARGET_FILE:${T_TARGET}> ${T_ARGS}
    WORKING_DIRECTORY ${CMAKE_SOURCE_DIR})
  # The outer CTest timeout only backs up the inner one. PROCESSORS keeps `ctest -j` from
  # stacking several oversubscribed jobs on the same two cores.
  math(EXPR ctest_timeout "${T_TIMEOUT} + 30")
  set_tests_properties(${T_NAME} PROPERTIES
    TIMEOUT ${ctest_timeout}
    PROCESSORS ${T_NP}
    LABELS "mpi;${T_LABELS}")
  pdserve_test_hygiene(${T_NAME})
endfunction()
