// Expert placement and the packing math of EP dispatch, without MPI (EpDispatcher moves the
// bytes; this file decides which bytes go where, and is unit-tested on its own).
//
// Placement: EP rank r of an EP group owns the contiguous routed experts
// [r * n_experts/ep, (r+1) * n_experts/ep).
//
// Packing (EpSendPlan): a token whose top-k experts live on m distinct ranks is sent once to
// each of those m ranks (not once per expert): the row carries the token's hidden state plus a
// metadata record listing the entries routed to that rank. Rows are grouped by destination
// rank and keep token order within a destination, which is what MPI_Alltoallv needs and what
// makes combine deterministic.
//
// Metadata wire record (per row, 8*k bytes): k int32 global expert ids (the entries for this
// destination first, then -1), followed by k float weights (0 for unused slots).
//
// Thread-safety: EpLayout is a value type; EpSendPlan / ExpertIndex are reusable buffers owned
// by one thread.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "common/status.h"

namespace pdserve::comm {

struct EpLayout {
  int n_experts = 0;  // routed experts of the model
  int ep_size = 1;    // ranks in the EP group

  // Errors: kInvalidArgument unless n_experts >= 1, ep_size >= 1 and ep_size | n_experts.
  Status Validate() const;
  int experts_per_rank() const { return n_experts / ep_size; }
  int OwnerOf(int expert) const { return expert / experts_per_rank(); }
  int FirstExpert(int rank) const { return rank * experts_per_rank(); }
};

class EpSendPlan {
 public:
  // Builds the plan for n_tokens tokens with top_k routing entries each: ids and weights are
  // row-major [n_tokens x top_k]. An id of -1 means "no expert" (the slot is skipped).
  // Errors: kInvalidArgument for span sizes that do not match or ids outside [-1, n_experts).
  Status Build(const EpLayout& layout, int top_k, int64_t n_tokens, std::span<const int32_t> ids,
               std::span<const float> weights);

  int top_k() const { return top_k_; }
  int64_t rows() const { return static_cast<int64_t>(row_token_.size()); }
  // Rows per destination rank and their first row (MPI_Alltoallv counts / displacements).
  const std::vector<int>& counts() const { return counts_; }
  const std::vector<int>& displs() const { return displs_; }
  // Which input token each row carries.
  const std::vector<int32_t>& row_token() const { return row_token_; }
  // The packed metadata records, 2*top_k 32-bit words per row (see the wire record above).
  const std::vector<uint32_t>& meta() const { return meta_; }
  int32_t Id(int64_t row, int j) const;
  float Weight(int64_t row, int j) const;

 private:
  int top_k_ = 0;
  std::vector<int> counts_, displs_, cursor_;
  std::vector<int32_t> row_token_;
  std::vector<uint32_t> meta_;
};

// The received rows grouped by local expert (CSR), for grouped expert GEMMs: the rows that use
// local expert e are rows[offsets[e] .. offsets[e+1]) with the matching weights. An expert that
// received nothing has an empty range.
struct ExpertIndex {
  std::vector<int64_t> offsets;  // [n_local_experts + 1]
  std::vector<int32_t> rows;
  std::vector<float> weights;

  // local_ids / weights: [n_rows x top_k], local expert ids in [0, n_local_experts) or -1.
  void Build(int n_local_experts, int top_k, int64_t n_rows, std::span<const int32_t> local_ids,
             std::span<const float> row_weights);
};

}  // namespace pdserve::comm
