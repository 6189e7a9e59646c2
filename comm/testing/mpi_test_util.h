// Helpers for tests that run under mpirun (comm/testing/mpi_test_main.cc). Test-only.
//
// Rule for multi-rank tests: every rank must reach every collective, whatever its own checks
// found, or the ranks still running block until the test's timeout. So use EXPECT_* around
// collectives, ASSERT_* only on conditions that are identical on every rank (e.g. statuses of
// operations every rank ran), and agree on cross-rank facts with AllRanks/AllEqual.
#pragma once

#include <cstdint>
#include <vector>

#include <gtest/gtest.h>
#include <mpi.h>

#include "comm/mpi_comm.h"

namespace pdserve::comm::testing {

inline int WorldRank() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}

inline int WorldSize() {
  int s = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &s);
  return s;
}

// True on every rank iff `value` is true on every rank of `comm`.
inline bool AllRanks(bool value, MPI_Comm comm = MPI_COMM_WORLD) {
  int in = value ? 1 : 0, out = 0;
  MPI_Allreduce(&in, &out, 1, MPI_INT, MPI_MIN, comm);
  return out != 0;
}

// Every rank's value, in rank order.
inline std::vector<int64_t> AllGather(int64_t value, MPI_Comm comm = MPI_COMM_WORLD) {
  int size = 0;
  MPI_Comm_size(comm, &size);
  std::vector<int64_t> out(size);
  MPI_Allgather(&value, 1, MPI_INT64_T, out.data(), 1, MPI_INT64_T, comm);
  return out;
}

}  // namespace pdserve::comm::testing
