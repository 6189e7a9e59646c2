// SequenceKvCache: the per-sequence cache of one DeepSeek-V3.2 model instance, contiguous
// per layer (the paged block pool of engine/ stores the same records in blocks).
//
// Per token and layer it holds exactly what the model computes with:
//   latent   kv_lora_rank fp8 e4m3 codes + one fp32 power-of-two scale per 128 codes
//            (the MLA latent after its fp8 round trip: stored losslessly in this form)
//   k_pe     qk_rope_head_dim bf16 values (post-RoPE)
//   idx_k    index_head_dim fp8 codes + one fp32 scale (indexer key, post-RoPE/Hadamard)
// For the real model that is 512 + 16 + 128 = 656 bytes (MLA) + 132 bytes (indexer).
// Thread-safety: not thread-safe; owned by the sequence's forward pass. Layers may be written
// from different threads as long as each layer is touched by one thread at a time.
#pragma once

#include <cstdint>
#include <vector>

#include "model/config.h"

namespace pdserve::model {

class SequenceKvCache {
 public:
  explicit SequenceKvCache(const ModelConfig& config);

  int64_t n_tokens() const { return n_tokens_; }
  // Grows every layer to hold n tokens (new entries zeroed). Existing entries are kept.
  void Resize(int64_t n);
  // Drops tokens >= n (a rewind, e.g. for recomputation).
  void Truncate(int64_t n) { Resize(n); }

  int64_t latent_dim() const { return latent_dim_; }
  int64_t rope_dim() const { return rope_dim_; }
  int64_t index_dim() const { return index_dim_; }
  int64_t latent_blocks() const { return latent_dim_ / 128; }

  uint8_t* latent_codes(int64_t layer, int64_t pos) { return &L(layer).latent_codes[Idx(pos, latent_dim_)]; }
  float* latent_scales(int64_t layer, int64_t pos) { return &L(layer).latent_scales[Idx(pos, latent_blocks())]; }
  uint16_t* k_pe(int64_t layer, int64_t pos) { return &L(layer).k_pe[Idx(pos, rope_dim_)]; }
  uint8_t* idx_k(int64_t layer, int64_t pos) { return &L(layer).idx_k[Idx(pos, index_dim_)]; }
  float* idx_scale(int64_t layer, int64_t pos) { return &L(layer).idx_scale[static_cast<size_t>(pos)]; }
  const uint8_t* latent_codes(int64_t layer, int64_t pos) const { return &L(layer).latent_codes[Idx(pos, latent_dim_)]; }
  const float* latent_scales(int64_t layer, int64_t pos) const { return &L(layer).latent_scales[Idx(pos, latent_blocks())]; }
  const uint16_t* k_pe(int64_t layer, int64_t pos) const { return &L(layer).k_pe[Idx(pos, rope_dim_)]; }
  const uint8_t* idx_k(int64_t layer, int64_t pos) const { return &L(layer).idx_k[Idx(pos, index_dim_)]; }
  float idx_scale(int64_t layer, int64_t pos) const { return L(layer).idx_scale[static_cast<size_t>(pos)]; }

  // Decodes token `pos`'s latent to fp32 values (codes * scale) into out[latent_dim].
  void DecodeLatent(int64_t layer, int64_t pos, float* out) const;

  // Bytes per token per layer (MLA part, indexer part).
  int64_t mla_bytes_per_token() const { return latent_dim_ + latent_blocks() * 4 + rope_dim_ * 2; }
  int64_t indexer_bytes_per_token() const { return index_dim_ + 4; }

 private:
  struct Layer {
    std::vector<uint8_t> latent_codes;
    std::vector<float> latent_scales;
    std::vector<uint16_t> k_pe;
    std::vector<uint8_t> idx_k;
    std::vector<float> idx_scale;
  };
  static size_t Idx(int64_t pos, int64_t width) { return static_cast<size_t>(pos * width); }
  Layer& L(int64_t layer) { return layers_[static_cast<size_t>(layer)]; }
  const Layer& L(int64_t layer) const { return layers_[static_cast<size_t>(layer)]; }

  int64_t latent_dim_, rope_dim_, index_dim_;
  int64_t n_tokens_ = 0;
  std::vector<Layer> layers_;
};

}  // namespace pdserve::model
