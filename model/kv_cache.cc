#include "model/kv_cache.h"

#include <algorithm>

namespace pdserve::model {

SequenceKvCache::SequenceKvCache(const ModelConfig& c, int64_t block_tokens, KvLatentFormat latent,
                                 KvIndexFormat index)
    : layout_(KvLayoutFor(c, std::max<int64_t>(1, block_tokens), latent, index)) {}

void SequenceKvCache::Resize(int64_t n) {
  const int64_t blocks = layout_.BlocksForTokens(n);
  const int64_t have = static_cast<int64_t>(table_.size());
  if (blocks > have) {
    // Grow geometrically so a token-by-token decode reallocates O(log n) times.
    const int64_t target = std::max(blocks, have * 2);
    storage_.resize(static_cast<size_t>(target * layout_.BlockBytes()), 0);
    for (int64_t b = have; b < target; ++b) table_.push_back(static_cast<int32_t>(b));
  }
  if (n < n_tokens_) {
    // Zero the dropped tokens' bytes in every component so a later regrow reads zeros.
    for (int64_t pos = n; pos < n_tokens_; ++pos)
      for (int64_t l = 0; l < layout_.num_layers; ++l)
        for (int c = 0; c < kNumKvComponents; ++c) {
          const auto comp = static_cast<KvComponent>(c);
          std::fill_n(Ref().Field(l, comp, pos), layout_.ComponentBytesPerToken(comp), 0);
        }
  }
  n_tokens_ = n;
}

KvSequenceRef SequenceKvCache::Ref() {
  KvSequenceRef r;
  r.pool_base = storage_.data();
  r.layout = &layout_;
  r.block_table = table_.data();
  r.capacity_tokens = static_cast<int64_t>(table_.size()) * layout_.tokens_per_block;
  return r;
}

kernels::KvTokenView SequenceKvCache::View(int64_t layer) const {
  return KvView(layout_, storage_.data(), table_.data(), layer);
}

}  // namespace pdserve::model
