// MpiEnvironment: owns MPI initialization for a process (MPI_Init_thread in Init, MPI_Finalize
// in the destructor). Create exactly one, in main, before any other comm/ object, and destroy
// it last (every MpiComm / MpiDatatype must be gone by then: their destructors need MPI).
//
// Threading: MPI is initialized with MPI_THREAD_FUNNELED by default: one thread (the engine
// loop) issues every MPI call; worker threads of the thread pool never touch MPI. Ask for
// MPI_THREAD_MULTIPLE only if several threads really call MPI (Open MPI 4.1 provides it, with
// some overhead on every call).
//
// After Init, MPI_COMM_WORLD returns errors (MPI_ERRORS_RETURN) instead of aborting the job,
// like every communicator comm/ creates.
//
// Errors: Init returns kFailedPrecondition if MPI is already finalized, kUnavailable if MPI
// cannot start or cannot provide the requested thread level.
#pragma once

#include <memory>

#include "common/status.h"

namespace pdserve::comm {

class MpiEnvironment {
 public:
  // `required_thread_level` is one of MPI_THREAD_{SINGLE,FUNNELED,SERIALIZED,MULTIPLE}; -1
  // means MPI_THREAD_FUNNELED. If MPI is already initialized (by a library or a test main)
  // the environment adopts it and leaves finalization to whoever initialized it.
  static Result<std::unique_ptr<MpiEnvironment>> Init(int* argc, char*** argv,
                                                      int required_thread_level = -1);
  ~MpiEnvironment();
  MpiEnvironment(const MpiEnvironment&) = delete;
  MpiEnvironment& operator=(const MpiEnvironment&) = delete;

  int world_rank() const { return world_rank_; }
  int world_size() const { return world_size_; }
  int thread_level() const { return thread_level_; }

 private:
  MpiEnvironment() = default;
  bool owns_init_ = false;
  int world_rank_ = 0;
  int world_size_ = 1;
  int thread_level_ = 0;
};

}  // namespace pdserve::comm
