// main() for GoogleTest binaries run under mpirun (pdserve_add_mpi_test): every rank runs every
// test; rank 0 prints the usual gtest report, other ranks print only their failures, prefixed
// with the rank. The ranks agree on the outcome at the end (MPI_Allreduce), so a failure on any
// rank makes every rank exit non-zero and mpirun report it.
#include <cstdio>

#include <gtest/gtest.h>
#include <mpi.h>

#include "comm/mpi_environment.h"

namespace {

class RankFailurePrinter : public ::testing::EmptyTestEventListener {
 public:
  explicit RankFailurePrinter(int rank) : rank_(rank) {}
  void OnTestPartResult(const ::testing::TestPartResult& r) override {
    if (!r.failed()) return;
    std::fprintf(stderr, "[rank %d] %s:%d: failure\n%s\n", rank_, r.file_name() ? r.file_name() : "?",
                 r.line_number(), r.summary());
  }
  void OnTestEnd(const ::testing::TestInfo& info) override {
    if (info.result()->Failed()) {
      std::fprintf(stderr, "[rank %d] FAILED %s.%s\n", rank_, info.test_suite_name(), info.name());
    }
  }

 private:
  int rank_;
};

}  // namespace

int main(int argc, char** argv) {
  // SERIALIZED: engine tests make their MPI calls from the engine's step thread.
  auto env = pdserve::comm::MpiEnvironment::Init(&argc, &argv, MPI_THREAD_SERIALIZED);
  if (!env.ok()) {
    std::fprintf(stderr, "mpi_test_main: %s\n", env.status().ToString().c_str());
    return 2;
  }
  ::testing::InitGoogleTest(&argc, argv);
  const int rank = (*env)->world_rank();
  const int size = (*env)->world_size();
  if (rank != 0) {
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new RankFailurePrinter(rank));
  }
  const int local = RUN_ALL_TESTS();
  int any = local;
  MPI_Allreduce(&local, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (rank == 0) {
    std::printf("[mpi] %d ranks: %s\n", size, any ? "FAILED on at least one rank" : "passed on every rank");
  }
  std::fflush(stdout);
  std::fflush(stderr);
  env->reset();  // MPI_Finalize before returning
  return any != 0 ? 1 : 0;
}
