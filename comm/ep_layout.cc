#include "comm/ep_layout.h"

#include <algorithm>
#include <bit>
#include <climits>

#include <fmt/format.h>

namespace pdserve::comm {

Status EpLayout::Validate() const {
  if (n_experts < 1 || ep_size < 1 || n_experts % ep_size != 0) {
    return Status::InvalidArgument(fmt::format(
        "EP layout: {} routed experts cannot be split evenly over {} ranks", n_experts, ep_size));
  }
  return Status::Ok();
}

Status EpSendPlan::Build(const EpLayout& layout, int top_k, int64_t n_tokens,
                         std::span<const int32_t> ids, std::span<const float> weights) {
  PDSERVE_RETURN_IF_ERROR(layout.Validate());
  if (top_k < 1 || n_tokens < 0 || static_cast<int64_t>(ids.size()) != n_tokens * top_k ||
      weights.size() != ids.size()) {
    return Status::InvalidArgument(fmt::format(
        "EP dispatch: {} ids / {} weights for {} tokens x top_k {}", ids.size(), weights.size(),
        n_tokens, top_k));
  }
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] < -1 || ids[i] >= layout.n_experts) {
      return Status::InvalidArgument(fmt::format(
          "EP dispatch: token {} routes to expert {} (model has {})", i / top_k, ids[i], layout.n_experts));
    }
  }
  const int p = layout.ep_size;
  top_k_ = top_k;
  counts_.assign(p, 0);
  displs_.assign(p, 0);

  // Pass 1: rows per destination (a token counts once per distinct destination). `seen` holds
  // the destinations already counted for the current token; top_k is small (8 for V3), so a
  // linear scan beats any set.
  int seen[64];
  const int max_k = static_cast<int>(sizeof(seen) / sizeof(seen[0]));
  if (top_k > max_k) return Status::InvalidArgument(fmt::format("EP dispatch: top_k {} > {}", top_k, max_k));
  int64_t total = 0;
  for (int64_t t = 0; t < n_tokens; ++t) {
    int n_seen = 0;
    for (int j = 0; j < top_k; ++j) {
      const int32_t e = ids[t * top_k + j];
      if (e < 0) continue;
      const int d = layout.OwnerOf(e);
      if (std::find(seen, seen + n_seen, d) != seen + n_seen) continue;
      seen[n_seen++] = d;
      ++counts_[d];
      ++total;
    }
  }
  if (total > INT_MAX) return Status::InvalidArgument("EP dispatch: more than INT_MAX rows");
  for (int d = 1; d < p; ++d) displs_[d] = displs_[d - 1] + counts_[d - 1];

  // Pass 2: fill rows. Tokens are visited in order, so each destination's rows stay in token
  // order.
  row_token_.assign(total, -1);
  meta_.assign(total * 2 * top_k, 0);
  cursor_ = displs_;
  for (int64_t t = 0; t < n_tokens; ++t) {
    int n_seen = 0;
    for (int j = 0; j < top_k; ++j) {
      const int32_t e = ids[t * top_k + j];
      if (e < 0) continue;
      const int d = layout.OwnerOf(e);
      if (std::find(seen, seen + n_seen, d) != seen + n_seen) continue;
      seen[n_seen++] = d;
      const int64_t row = cursor_[d]++;
      row_token_[row] = static_cast<int32_t>(t);
      uint32_t* rec = meta_.data() + row * 2 * top_k;
      int slot = 0;
      for (int jj = 0; jj < top_k; ++jj) {
        const int32_t ee = ids[t * top_k + jj];
        if (ee < 0 || layout.OwnerOf(ee) != d) continue;
        rec[slot] = static_cast<uint32_t>(ee);
        rec[top_k + slot] = std::bit_cast<uint32_t>(weights[t * top_k + jj]);
        ++slot;
      }
      for (; slot < top_k; ++slot) {
        rec[slot] = static_cast<uint32_t>(-1);
        rec[top_k + slot] = std::bit_cast<uint32_t>(0.0f);
      }
    }
  }
  return Status::Ok();
}

int32_t EpSendPlan::Id(int64_t row, int j) const {
  return static_cast<int32_t>(meta_[row * 2 * top_k_ + j]);
}

float EpSendPlan::Weight(int64_t row, int j) const {
  return std::bit_cast<float>(meta_[row * 2 * top_k_ + top_k_ + j]);
}

void ExpertIndex::Build(int n_local_experts, int top_k, int64_t n_rows,
                        std::span<const int32_t> local_ids, std::span<const float> row_weights) {
  offsets.assign(n_local_experts + 1, 0);
  for (int64_t i = 0; i < n_rows * top_k; ++i) {
    if (local_ids[i] >= 0) ++offsets[local_ids[i] + 1];
  }
  for (int e = 0; e < n_local_experts; ++e) offsets[e + 1] += offsets[e];
  rows.resize(offsets[n_local_experts]);
  weights.resize(offsets[n_local_experts]);
  std::vector<int64_t> cursor(offsets.begin(), offsets.end() - 1);
  for (int64_t r = 0; r < n_rows; ++r) {
    for (int j = 0; j < top_k; ++j) {
      const int32_t e = local_ids[r * top_k + j];
      if (e < 0) continue;
      const int64_t at = cursor[e]++;
      rows[at] = static_cast<int32_t>(r);
      weights[at] = row_weights[r * top_k + j];
    }
  }
}

}  // namespace pdserve::comm
