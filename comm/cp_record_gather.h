// CpRecordGather: after a CP rank computed the per-token records of its positions (a layer's
// MLA latent + rope key + indexer key, treated here as opaque fixed-size byte records), gives
// every rank of the CP group the records of the whole prompt in position order, so each rank can
// run attention (and the indexer) for its own queries against every earlier key.
//
// Input on rank r: split.RankTokens(r) records in rank r's local order (cp_split.h: chunk r then
// chunk 2cp-1-r). Output: split.seq_len() records, record p = position p. Implementation: two
// MPI_Iallgatherv with displacements that drop every chunk straight into its final place (first
// the chunks 0..cp-1, which rank order already sorts, then the chunks cp..2cp-1, which rank
// order reverses): no staging copy, no reordering pass.
//
// Start/Wait lets the caller overlap the exchange with other work (e.g. computing the next
// layer's query projections); call Progress() now and then, as for EpDispatcher. Every rank of
// the CP group must call with the same split and record size.
//
// Buffers: `local` and `out` must stay valid until Wait returns and must not overlap.
// Ownership: owns a duplicate of the CP communicator (Create is collective over it).
// Threading: one thread at a time, one gather in flight.
// Errors: kInvalidArgument if the split's cp size differs from the group size or seq_len >
// INT_MAX; kFailedPrecondition for calls out of order; MPI failures as in mpi_status.h.
#pragma once

#include <cstddef>
#include <memory>
#include <vector>

#include <mpi.h>

#include "comm/cp_split.h"
#include "comm/mpi_comm.h"
#include "comm/mpi_datatype.h"
#include "common/status.h"

namespace pdserve::comm {

class CpRecordGather {
 public:
  static Result<std::unique_ptr<CpRecordGather>> Create(const MpiComm& cp_group, size_t record_bytes);
  ~CpRecordGather();
  CpRecordGather(const CpRecordGather&) = delete;
  CpRecordGather& operator=(const CpRecordGather&) = delete;

  size_t record_bytes() const { return record_.record_bytes(); }
  int rank() const { return comm_.rank(); }
  int size() const { return comm_.size(); }

  Status Start(const CpSplit& split, const void* local, void* out);
  Result<bool> Progress();
  Status Wait();
  // Start + Wait.
  Status AllGather(const CpSplit& split, const void* local, void* out);

 private:
  CpRecordGather(MpiComm comm, MpiDatatype record) : comm_(std::move(comm)), record_(std::move(record)) {}

  MpiComm comm_;
  MpiDatatype record_;
  bool in_flight_ = false;
  MPI_Request requests_[2] = {MPI_REQUEST_NULL, MPI_REQUEST_NULL};
  // Per-rank counts and displacements of both halves; must outlive the requests.
  std::vector<int> counts_[2], displs_[2];
};

}  // namespace pdserve::comm
