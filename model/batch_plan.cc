#include "model/batch_plan.h"

namespace pdserve::model {

BatchPlan BatchPlan::Build(std::span<const BatchSequence> seqs) {
  BatchPlan p;
  p.seqs = seqs;
  p.seq_row.push_back(0);
  for (size_t s = 0; s < seqs.size(); ++s) {
    const BatchSequence& q = seqs[s];
    for (int64_t i = 0; i < q.n_tokens; ++i) {
      p.row_seq.push_back(static_cast<int32_t>(s));
      p.row_pos.push_back(q.start + i);
    }
    p.seq_row.push_back(static_cast<int64_t>(p.row_seq.size()));
  }
  p.n_rows = static_cast<int64_t>(p.row_seq.size());
  return p;
}

}  // namespace pdserve::model
