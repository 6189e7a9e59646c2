// BatchPlan: the rows of one ForwardBatch call (internal to model/). Rows are laid out
// sequence after sequence; each row knows its sequence and absolute position. Every GEMM of
// the step takes all its rows in one call: the kernels sum each output in one order for
// every m (docs/kernels-gemm.md), so a row's numbers do not depend on what shares its call.
// Thread-safety: built once per call, then read-only.
#pragma once

#include <cstdint>
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
  BatchStats* stats = nullptr;     // counters to add to (may be null)

  static BatchPlan Build(std::span<const BatchSequence> seqs);
  int64_t n_seqs() const { return static_cast<int64_t>(seqs.size()); }
};

}  // namespace pdserve::model
