#include "model/batch_plan.h"

#include <algorithm>

#include "kernels/gemm.h"

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
      if (q.grouping == RowGrouping::kPerRow || i == 0) p.group_size.push_back(0);
      p.row_group.push_back(static_cast<int32_t>(p.group_size.size() - 1));
      ++p.group_size.back();
    }
    p.seq_row.push_back(static_cast<int64_t>(p.row_seq.size()));
  }
  p.n_rows = static_cast<int64_t>(p.row_seq.size());
  p.row_tiled.resize(static_cast<size_t>(p.n_rows));
  for (int64_t r = 0; r < p.n_rows; ++r)
    p.row_tiled[r] = p.group_size[static_cast<size_t>(p.row_group[r])] > kernels::kGemmSmallMMax;
  return p;
}

void ForEachGemmPath(const float* x, int64_t n_in, float* y, int64_t n_out, const uint8_t* tiled, int64_t n,
                     const std::function<void(const float*, int64_t, float*)>& fn) {
  std::vector<float> xs, ys;
  auto run = [&](const std::vector<int64_t>& rows) {
    const int64_t m = static_cast<int64_t>(rows.size());
    if (m == 0) return;
    if (rows.back() - rows.front() == m - 1) {  // contiguous: in place
      fn(x + rows.front() * n_in, m, y + rows.front() * n_out);
      return;
    }
    xs.resize(static_cast<size_t>(m * n_in));
    ys.resize(static_cast<size_t>(m * n_out));
    for (int64_t i = 0; i < m; ++i) std::copy_n(x + rows[i] * n_in, n_in, xs.begin() + i * n_in);
    fn(xs.data(), m, ys.data());
    for (int64_t i = 0; i < m; ++i) std::copy_n(ys.begin() + i * n_out, n_out, y + rows[i] * n_out);
  };
  std::vector<int64_t> big, small;
  for (int64_t r = 0; r < n; ++r) (tiled[r] ? big : small).push_back(r);
  run(big);
  std::vector<int64_t> chunk;
  for (size_t i = 0; i < small.size(); i += kernels::kGemmSmallMMax) {
    chunk.assign(small.begin() + static_cast<std::ptrdiff_t>(i),
                 small.begin() + static_cast<std::ptrdiff_t>(std::min(small.size(), i + kernels::kGemmSmallMMax)));
    run(chunk);
  }
}

}  // namespace pdserve::model
