// EpDispatcher: MoE expert-parallel dispatch and combine over one EP group.
//
// One MoE layer, on every rank of the EP group:
//
//   dispatcher.StartDispatch(hidden, n_tokens, topk_ids, topk_weights);  // packs, posts
//   shared_expert(hidden) -> out;  (call dispatcher.Progress() now and then)  // overlaps
//   const EpReceived& in = *dispatcher.WaitDispatch();
//   for each local expert e: rows in.ExpertRows(e) -> expert_out[row] += w * expert_e(row)
//   dispatcher.StartCombine(expert_out);   // [in.rows x hidden], combine dtype
//   dispatcher.WaitCombine(out, /*accumulate=*/true);  // out[token] += sum of its rows
//
// Protocol: StartDispatch packs one row per (token, destination rank) (ep_layout.h), exchanges
// the per-destination row counts with a blocking MPI_Alltoall (p ints: microseconds), then posts
// two MPI_Ialltoallv (hidden rows, metadata records) and returns: the caller computes the shared
// expert while they are in flight. Open MPI progresses non-blocking collectives only inside MPI
// calls (no progress thread here), so a long computation should call Progress() between chunks
// for the transfer to really overlap. Combine is the mirror image (counts are already known):
// expert outputs travel back along the same rows and are summed per token in fp32, in
// destination-rank order, so the result does not depend on message timing.
//
// Overlap accounting (overlap()): for every exchange (a dispatch or a combine), the time from
// posting it to seeing it complete (in Progress() or at the end of the Wait), and the part of
// that time the caller spent blocked in the Wait. An exchange seen complete in Progress() was
// fully hidden behind the caller's work (up to the polling interval).
//
// Zero tokens: a rank with no tokens (a DP rank running a dummy step) calls exactly the same
// sequence with n_tokens = 0; ranks and experts that receive no rows get empty ranges. Every
// rank of the EP group must make the same sequence of calls (one dispatch+combine per MoE layer).
//
// Buffers: the input hidden states and routing are copied into send buffers by StartDispatch
// (caller may reuse them at once). `expert_out` passed to StartCombine must stay valid and
// unchanged until WaitCombine returns. The EpReceived view is valid until the next
// StartDispatch. Buffers grow to the largest step seen and are reused (no per-layer allocation
// in steady state).
//
// Ownership: owns a duplicate of the EP communicator (Create is collective over it).
// Threading: one thread at a time; one dispatch/combine in flight at a time.
// Errors: kInvalidArgument for bad routing or sizes (detected before any communication:
// treat it as fatal, since the peers are then left waiting in the exchange);
// kFailedPrecondition for calls out of order (StartCombine before WaitDispatch, ...); MPI
// failures as in mpi_status.h (the dispatcher is then unusable).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include <mpi.h>

#include "comm/ep_layout.h"
#include "comm/mpi_comm.h"
#include "comm/mpi_datatype.h"
#include "common/dtype.h"
#include "common/status.h"

namespace pdserve::comm {

struct EpDispatcherOptions {
  int n_experts = 0;          // routed experts of the model (divisible by the EP group size)
  int top_k = 1;              // routing entries per token
  int64_t hidden = 0;         // elements per token row
  // Dispatched rows are moved as opaque bytes: `dispatch_row_bytes` per row, default
  // hidden * DTypeSize(dispatch_dtype) (set it for e.g. fp8 rows followed by their scales).
  DType dispatch_dtype = DType::kF32;
  size_t dispatch_row_bytes = 0;
  // Expert outputs sent back by combine: kF32 or kBF16 (summed in fp32 on arrival).
  DType combine_dtype = DType::kF32;
};

// Accumulated over exchanges (see "Overlap accounting" above).
struct EpOverlap {
  int64_t exchanges = 0;
  int64_t completed_in_progress = 0;  // seen complete by Progress() before the Wait
  double in_flight_seconds = 0;       // posting -> completion seen
  double exposed_seconds = 0;         // blocked in WaitDispatch / WaitCombine
};

// What this rank received in a dispatch: the rows its local experts must process.
struct EpReceived {
  int64_t rows = 0;
  int top_k = 0;
  int first_expert = 0;       // global id of local expert 0
  int n_local_experts = 0;
  const uint8_t* hidden = nullptr;        // [rows x dispatch_row_bytes]
  size_t row_bytes = 0;
  std::span<const int32_t> local_expert;  // [rows x top_k]: local expert id or -1
  std::span<const float> weight;          // [rows x top_k]: routing weight, 0 for -1 slots
  std::span<const int> rows_from;         // rows received from each EP rank
  const ExpertIndex* by_expert = nullptr; // rows grouped by local expert

  template <typename T>
  const T* Row(int64_t r) const { return reinterpret_cast<const T*>(hidden + r * row_bytes); }
  // Rows (and weights) that use local expert e; empty when e received nothing.
  std::span<const int32_t> ExpertRows(int e) const {
    return {by_expert->rows.data() + by_expert->offsets[e],
            static_cast<size_t>(by_expert->offsets[e + 1] - by_expert->offsets[e])};
  }
  std::span<const float> ExpertWeights(int e) const {
    return {by_expert->weights.data() + by_expert->offsets[e],
            static_cast<size_t>(by_expert->offsets[e + 1] - by_expert->offsets[e])};
  }
};

class EpDispatcher {
 public:
  static Result<std::unique_ptr<EpDispatcher>> Create(const MpiComm& ep_group,
                                                      const EpDispatcherOptions& options);
  ~EpDispatcher();
  EpDispatcher(const EpDispatcher&) = delete;
  EpDispatcher& operator=(const EpDispatcher&) = delete;

  const EpDispatcherOptions& options() const { return options_; }
  const EpLayout& layout() const { return layout_; }
  int rank() const { return comm_.rank(); }
  int size() const { return comm_.size(); }

  // hidden: [n_tokens x dispatch_row_bytes]; topk_ids / topk_weights: [n_tokens x top_k],
  // global expert ids (-1 = skip the slot).
  Status StartDispatch(const void* hidden, int64_t n_tokens, std::span<const int32_t> topk_ids,
                       std::span<const float> topk_weights);
  // Drives the in-flight exchange (MPI_Testall); true once it has completed. Cheap; call it
  // between chunks of overlapped compute.
  Result<bool> Progress();
  Result<const EpReceived*> WaitDispatch();

  // expert_out: [received rows x hidden] of combine_dtype, row i = the weighted sum of this
  // rank's experts applied to received row i.
  Status StartCombine(const void* expert_out);
  // out: [n_tokens x hidden] fp32 of the last dispatch. accumulate=false overwrites out,
  // accumulate=true adds (e.g. onto the shared expert's output).
  Status WaitCombine(std::span<float> out, bool accumulate);

  // Blocking conveniences (Start + Wait).
  Result<const EpReceived*> Dispatch(const void* hidden, int64_t n_tokens,
                                     std::span<const int32_t> topk_ids,
                                     std::span<const float> topk_weights);
  Status Combine(const void* expert_out, std::span<float> out, bool accumulate);

  // Completed dispatch+combine rounds (the DP tests check every rank ran as many).
  int64_t rounds() const { return rounds_; }
  const EpOverlap& overlap() const { return overlap_; }
  void ResetOverlap() { overlap_ = {}; }

 private:
  enum class State { kIdle, kDispatching, kDispatched, kCombining, kBroken };

  EpDispatcher(MpiComm comm, const EpDispatcherOptions& options, EpLayout layout, MpiDatatype row,
               MpiDatatype meta, MpiDatatype combine_row);
  Status Fail(Status s);  // moves to kBroken
  Status WaitAll(const char* what);
  void Posted();  // an exchange was just posted
  size_t combine_row_bytes() const { return combine_row_.record_bytes(); }

  MpiComm comm_;
  const EpDispatcherOptions options_;
  const EpLayout layout_;
  MpiDatatype row_, meta_, combine_row_;
  State state_ = State::kIdle;
  MPI_Request requests_[2] = {MPI_REQUEST_NULL, MPI_REQUEST_NULL};
  int64_t rounds_ = 0;
  int64_t n_tokens_ = 0;  // of the current round
  int64_t posted_ns_ = 0, done_ns_ = 0;  // of the exchange in flight (done_ns_ 0: not seen done)
  EpOverlap overlap_;

  EpSendPlan plan_;
  std::vector<uint8_t> send_hidden_, recv_hidden_, combine_recv_;
  std::vector<uint32_t> recv_meta_;
  std::vector<int> recv_counts_, recv_displs_;
  std::vector<int32_t> recv_local_expert_;
  std::vector<float> recv_weight_;
  ExpertIndex by_expert_;
  EpReceived received_;
};

}  // namespace pdserve::comm
