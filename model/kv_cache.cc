#include "model/kv_cache.h"

#include "common/dtype.h"

namespace pdserve::model {

SequenceKvCache::SequenceKvCache(const ModelConfig& c)
    : latent_dim_(c.kv_lora_rank),
      rope_dim_(c.qk_rope_head_dim),
      index_dim_(c.index_head_dim),
      layers_(static_cast<size_t>(c.num_hidden_layers)) {}

void SequenceKvCache::Resize(int64_t n) {
  for (auto& l : layers_) {
    l.latent_codes.resize(Idx(n, latent_dim_));
    l.latent_scales.resize(Idx(n, latent_blocks()));
    l.k_pe.resize(Idx(n, rope_dim_));
    l.idx_k.resize(Idx(n, index_dim_));
    l.idx_scale.resize(static_cast<size_t>(n));
  }
  n_tokens_ = n;
}

void SequenceKvCache::DecodeLatent(int64_t layer, int64_t pos, float* out) const {
  const uint8_t* codes = latent_codes(layer, pos);
  const float* scales = latent_scales(layer, pos);
  const float* table = Fp8E4M3DecodeTable();
  for (int64_t b = 0; b < latent_blocks(); ++b) {
    const float s = scales[b];
    for (int64_t i = 0; i < 128; ++i) out[b * 128 + i] = table[codes[b * 128 + i]] * s;
  }
}

}  // namespace pdserve::model
