// BatchPlan: the rows of one ForwardBatch call (internal to model/). Rows are laid out
// sequence after sequence; each row knows its sequence, absolute position and row group
// (model/batch.h), and whether its group's size selects the tiled GEMM path.
// Thread-safety: built once per call, then read-only.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "model/batch.h"

namespace pdserve::model {

struct BatchPlan {
  std::span<const BatchSequence> seqs;
  int64_t n_rows = 0;
  std::vector<int64_t> seq_row;    // [n_seqs + 1]: first row of each sequence
  std::vector<int32_t> row_seq;    // [n_rows]
  std::vector<int64_t> row_pos;    // [n_rows]: absolute position of the row's token
  std::vector<int32_t> row_group;  // [n_rows]: row group id
  std::vector<int64_t> group_size; // [n_groups]
  std::vector<uint8_t> row_tiled;  // [n_rows]: group_size > kGemmSmallMMax
  BatchStats* stats = nullptr;     // counters to add to (may be null)

  static BatchPlan Build(std::span<const BatchSequence> seqs);
  int64_t n_seqs() const { return static_cast<int64_t>(seqs.size()); }
};

// Runs fn(x_sub, m, y_sub) over rows [0, n) of x [n, n_in] (rows packed) writing y [n, n_out]
// so that the rows flagged in `tiled` go through one call together (m = their count) and the
// others through calls of at most kGemmSmallMMax rows. Contiguous runs are passed in place;
// otherwise rows are gathered into scratch and the outputs scattered back.
// REQUIRES: fn's per-row results depend on m only through the GEMM path; when any row is
// flagged, at least kGemmSmallMMax + 1 rows are.
void ForEachGemmPath(const float* x, int64_t n_in, float* y, int64_t n_out, const uint8_t* tiled, int64_t n,
                     const std::function<void(const float*, int64_t, float*)>& fn);

}  // namespace pdserve::model
