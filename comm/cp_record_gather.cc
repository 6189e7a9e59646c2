#include "comm/cp_record_gather.h"

#include <climits>

#include <fmt/format.h>

#include "comm/mpi_status.h"

namespace pdserve::comm {

Result<std::unique_ptr<CpRecordGather>> CpRecordGather::Create(const MpiComm& cp_group,
                                                               size_t record_bytes) {
  PDSERVE_ASSIGN_OR_RETURN(MpiDatatype record, MpiDatatype::Bytes(record_bytes));
  PDSERVE_ASSIGN_OR_RETURN(MpiComm dup, cp_group.Dup());
  return std::unique_ptr<CpRecordGather>(new CpRecordGather(std::move(dup), std::move(record)));
}

CpRecordGather::~CpRecordGather() {
  if (in_flight_) MPI_Waitall(2, requests_, MPI_STATUSES_IGNORE);  // MPI still owns the buffers
}

Status CpRecordGather::Start(const CpSplit& split, const void* local, void* out) {
  if (in_flight_) return Status::FailedPrecondition("CP record gather already in flight");
  const int p = size();
  if (split.cp_size() != p) {
    return Status::InvalidArgument(fmt::format("CP record gather: split for cp={} on a group of {}",
                                               split.cp_size(), p));
  }
  if (split.seq_len() > INT_MAX) return Status::InvalidArgument("CP record gather: seq_len > INT_MAX");
  for (int half = 0; half < 2; ++half) {
    counts_[half].assign(p, 0);
    displs_[half].assign(p, 0);
    for (int r = 0; r < p; ++r) {
      const ShardRange c = split.RankChunks(r)[half];
      counts_[half][r] = static_cast<int>(c.size());
      displs_[half][r] = static_cast<int>(c.begin);
    }
  }
  // Some MPIs reject null buffers even for zero counts. Distinct dummies for the two sides:
  // Open MPI's libnbc takes sendbuf == recvbuf for MPI_IN_PLACE (a different schedule).
  static uint8_t empty_send[16], empty_recv[16];
  const auto* src = local != nullptr ? static_cast<const uint8_t*>(local) : empty_send;
  void* dst = out != nullptr && split.seq_len() > 0 ? out : static_cast<void*>(empty_recv);
  const int me = rank();
  const uint8_t* second = src + counts_[0][me] * record_bytes();
  PDSERVE_MPI_RETURN_IF_ERROR(
      MPI_Iallgatherv(src, counts_[0][me], record_.get(), dst, counts_[0].data(), displs_[0].data(),
                      record_.get(), comm_.get(), &requests_[0]),
      "MPI_Iallgatherv (cp records, first half)");
  in_flight_ = true;  // from here the destructor must wait
  PDSERVE_MPI_RETURN_IF_ERROR(
      MPI_Iallgatherv(counts_[1][me] > 0 ? second : empty_send, counts_[1][me], record_.get(), dst,
                      counts_[1].data(), displs_[1].data(), record_.get(), comm_.get(), &requests_[1]),
      "MPI_Iallgatherv (cp records, second half)");
  return Status::Ok();
}

Result<bool> CpRecordGather::Progress() {
  if (!in_flight_) return true;
  int done = 0;
  PDSERVE_MPI_RETURN_IF_ERROR(MPI_Testall(2, requests_, &done, MPI_STATUSES_IGNORE),
                              "MPI_Testall (cp records)");
  return done != 0;
}

Status CpRecordGather::Wait() {
  if (!in_flight_) return Status::FailedPrecondition("CP record gather: Wait without Start");
  in_flight_ = false;
  return MpiStatus(MPI_Waitall(2, requests_, MPI_STATUSES_IGNORE), "MPI_Waitall (cp records)");
}

Status CpRecordGather::AllGather(const CpSplit& split, const void* local, void* out) {
  PDSERVE_RETURN_IF_ERROR(Start(split, local, out));
  return Wait();
}

}  // namespace pdserve::comm
