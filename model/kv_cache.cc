#include "model/kv_cache.h"

namespace pdserve::model {

SequenceKvCache::SequenceKvCache(const ModelConfig& c)
    : layout_(KvRecordLayout::ForConfig(c)), layers_(static_cast<size_t>(c.num_hidden_layers)) {}

void SequenceKvCache::Resize(int64_t n) {
  for (auto& l : layers_) l.resize(static_cast<size_t>(n * layout_.record_bytes()));
  n_tokens_ = n;
}

kernels::KvTokenView ContiguousKvView(const uint8_t* base, const KvRecordLayout& l, int64_t n_tokens) {
  kernels::KvTokenView v;
  v.base = base;
  v.block_table = nullptr;
  v.block_tokens = n_tokens > 0 ? n_tokens : 1;  // one block holding every token
  v.block_stride = 0;
  const int64_t r = l.record_bytes();
  v.latent_offset = l.latent_offset();
  v.latent_scale_offset = l.latent_scale_offset();
  v.kpe_offset = l.kpe_offset();
  v.idx_k_offset = l.idx_k_offset();
  v.idx_scale_offset = l.idx_scale_offset();
  v.latent_stride = v.latent_scale_stride = v.kpe_stride = v.idx_k_stride = v.idx_scale_stride = r;
  v.latent_dim = l.latent_dim;
  v.rope_dim = l.rope_dim;
  v.index_dim = l.index_dim;
  return v;
}

kernels::KvTokenView SequenceKvCache::View(int64_t layer) const {
  return ContiguousKvView(layers_[static_cast<size_t>(layer)].data(), layout_, n_tokens_);
}

}  // namespace pdserve::model
