#include "comm/mpi_comm.h"

#include <utility>

#include "comm/mpi_status.h"

namespace pdserve::comm {

MpiComm::~MpiComm() { Reset(); }

MpiComm::MpiComm(MpiComm&& other) noexcept
    : comm_(std::exchange(other.comm_, MPI_COMM_NULL)),
      rank_(std::exchange(other.rank_, 0)),
      size_(std::exchange(other.size_, 0)) {}

MpiComm& MpiComm::operator=(MpiComm&& other) noexcept {
  if (this != &other) {
    Reset();
    comm_ = std::exchange(other.comm_, MPI_COMM_NULL);
    rank_ = std::exchange(other.rank_, 0);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

void MpiComm::Reset() {
  if (comm_ == MPI_COMM_NULL) return;
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) MPI_Comm_free(&comm_);
  comm_ = MPI_COMM_NULL;
  rank_ = size_ = 0;
}

Result<MpiComm> MpiComm::Adopt(MPI_Comm comm) {
  MpiComm out;
  out.comm_ = comm;  // owned from here on, freed by `out` on every error path below
  PDSERVE_MPI_RETURN_IF_ERROR(MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN),
                              "MPI_Comm_set_errhandler");
  PDSERVE_MPI_RETURN_IF_ERROR(MPI_Comm_rank(comm, &out.rank_), "MPI_Comm_rank");
  PDSERVE_MPI_RETURN_IF_ERROR(MPI_Comm_size(comm, &out.size_), "MPI_Comm_size");
  return out;
}

Result<MpiComm> MpiComm::World() {
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (!initialized) return Status::FailedPrecondition("MpiComm::World before MPI_Init");
  MPI_Comm dup = MPI_COMM_NULL;
  PDSERVE_MPI_RETURN_IF_ERROR(MPI_Comm_dup(MPI_COMM_WORLD, &dup), "MPI_Comm_dup (world)");
  return Adopt(dup);
}

Result<MpiComm> MpiComm::Dup() const {
  if (!valid()) return Status::FailedPrecondition("MpiComm::Dup on a null communicator");
  MPI_Comm dup = MPI_COMM_NULL;
  PDSERVE_MPI_RETURN_IF_ERROR(MPI_Comm_dup(comm_, &dup), "MPI_Comm_dup");
  return Adopt(dup);
}

Result<MpiComm> MpiComm::Split(int color, int key) const {
  if (!valid()) return Status::FailedPrecondition("MpiComm::Split on a null communicator");
  if (color < 0) return Status::InvalidArgument("MpiComm::Split: color must be >= 0");
  MPI_Comm out = MPI_COMM_NULL;
  PDSERVE_MPI_RETURN_IF_ERROR(MPI_Comm_split(comm_, color, key, &out), "MPI_Comm_split");
  return Adopt(out);
}

Status MpiComm::Barrier() const {
  if (!valid()) return Status::FailedPrecondition("MpiComm::Barrier on a null communicator");
  return MpiStatus(MPI_Barrier(comm_), "MPI_Barrier");
}

}  // namespace pdserve::comm
