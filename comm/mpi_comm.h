// MpiComm: an owned MPI communicator (MPI_Comm_free in the destructor), move-only.
//
// Every communicator comm/ hands out is created here (Dup / Split of another one) and has
// MPI_ERRORS_RETURN set, so failures surface as Status (mpi_status.h) instead of aborting.
// Helpers that issue collectives (TensorParallel, EpDispatcher, DpCoordinator, CpRecordGather)
// each duplicate the group communicator they are given: their traffic can then never match a
// collective of another helper, even when non-blocking operations overlap.
//
// Creation (Dup, Split, World) is collective over the parent: every rank of the parent must
// call it, in the same order relative to other collectives on the parent.
// Threading: an MpiComm may be used by one thread at a time (MPI_THREAD_FUNNELED); const
// accessors are safe from any thread.
// REQUIRES: destroyed before MPI_Finalize (MpiEnvironment outlives every MpiComm); if MPI is
// already finalized the destructor skips the free.
#pragma once

#include <mpi.h>

#include "common/status.h"

namespace pdserve::comm {

class MpiComm {
 public:
  MpiComm() = default;  // null: valid() is false
  ~MpiComm();
  MpiComm(MpiComm&& other) noexcept;
  MpiComm& operator=(MpiComm&& other) noexcept;
  MpiComm(const MpiComm&) = delete;
  MpiComm& operator=(const MpiComm&) = delete;

  // A duplicate of MPI_COMM_WORLD. REQUIRES: MPI initialized.
  static Result<MpiComm> World();

  // A duplicate with the same group (collective).
  Result<MpiComm> Dup() const;
  // MPI_Comm_split: ranks passing the same color form one communicator, ordered by key then
  // parent rank (collective). color < 0 is not allowed (every rank gets a communicator).
  Result<MpiComm> Split(int color, int key) const;

  bool valid() const { return comm_ != MPI_COMM_NULL; }
  MPI_Comm get() const { return comm_; }
  int rank() const { return rank_; }
  int size() const { return size_; }

  Status Barrier() const;

 private:
  // Takes ownership of `comm`, sets MPI_ERRORS_RETURN and caches rank/size.
  static Result<MpiComm> Adopt(MPI_Comm comm);
  void Reset();

  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0;
  int size_ = 0;
};

}  // namespace pdserve::comm
