// SequenceKvCache: the per-sequence cache of one DeepSeek-V3.2 model instance, contiguous per
// layer (the paged block pool of engine/ stores the same token records in blocks).
//
// Token record layout (per layer, records back to back, all little-endian):
//   [latent codes: Lkv x u8 fp8 e4m3][latent scales: Lkv/128 x f32][k_pe: dr x bf16]
//   [indexer key: ID x u8 fp8 e4m3][indexer scale: f32]
// The latent is the MLA latent after its fp8 round trip, stored losslessly as codes + one
// power-of-two scale per 128 values; k_pe is post-RoPE; the indexer key is post-RoPE/Hadamard.
// For the real model: 512 + 16 + 128 = 656 bytes (MLA) + 132 bytes (indexer) per token-layer.
// Thread-safety: not thread-safe; owned by the sequence's forward pass. Distinct layers and
// distinct tokens may be written from different threads. Resize invalidates views.
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/mla_attention.h"
#include "model/config.h"

namespace pdserve::model {

// Byte offsets of the fields of one token record (shared with the paged block pool).
struct KvRecordLayout {
  int64_t latent_dim, rope_dim, index_dim;
  int64_t latent_offset() const { return 0; }
  int64_t latent_scale_offset() const { return latent_dim; }
  int64_t kpe_offset() const { return latent_dim + latent_dim / 128 * 4; }
  int64_t idx_k_offset() const { return kpe_offset() + rope_dim * 2; }
  int64_t idx_scale_offset() const { return idx_k_offset() + index_dim; }
  int64_t record_bytes() const { return idx_scale_offset() + 4; }
  int64_t mla_bytes() const { return idx_k_offset(); }
  int64_t indexer_bytes() const { return index_dim + 4; }
  static KvRecordLayout ForConfig(const ModelConfig& c) {
    return {c.kv_lora_rank, c.qk_rope_head_dim, c.index_head_dim};
  }
};

class SequenceKvCache {
 public:
  explicit SequenceKvCache(const ModelConfig& config);

  int64_t n_tokens() const { return n_tokens_; }
  // Grows (new records zeroed) or shrinks every layer to n tokens.
  void Resize(int64_t n);
  const KvRecordLayout& layout() const { return layout_; }

  uint8_t* record(int64_t layer, int64_t pos) {
    return layers_[static_cast<size_t>(layer)].data() + pos * layout_.record_bytes();
  }
  uint8_t* latent_codes(int64_t layer, int64_t pos) { return record(layer, pos) + layout_.latent_offset(); }
  float* latent_scales(int64_t layer, int64_t pos) {
    return reinterpret_cast<float*>(record(layer, pos) + layout_.latent_scale_offset());
  }
  uint16_t* k_pe(int64_t layer, int64_t pos) {
    return reinterpret_cast<uint16_t*>(record(layer, pos) + layout_.kpe_offset());
  }
  uint8_t* idx_k(int64_t layer, int64_t pos) { return record(layer, pos) + layout_.idx_k_offset(); }
  float* idx_scale(int64_t layer, int64_t pos) {
    return reinterpret_cast<float*>(record(layer, pos) + layout_.idx_scale_offset());
  }

  // A kernel view of one layer (valid until the next Resize).
  kernels::KvTokenView View(int64_t layer) const;

 private:
  KvRecordLayout layout_;
  int64_t n_tokens_ = 0;
  std::vector<std::vector<uint8_t>> layers_;
};

// A KvTokenView over records laid out back to back from `base`, record layout `l`.
kernels::KvTokenView ContiguousKvView(const uint8_t* base, const KvRecordLayout& l, int64_t n_tokens);

}  // namespace pdserve::model
