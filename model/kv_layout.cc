#include "model/kv_layout.h"

namespace pdserve::model {

KvLayout KvLayoutFor(const ModelConfig& c, int64_t block_tokens, KvLatentFormat latent, KvIndexFormat index) {
  KvLayout l;
  l.num_layers = static_cast<uint32_t>(c.num_hidden_layers);
  l.kv_lora_rank = static_cast<uint32_t>(c.kv_lora_rank);
  l.qk_rope_head_dim = static_cast<uint32_t>(c.qk_rope_head_dim);
  l.index_head_dim = static_cast<uint32_t>(c.index_head_dim);
  l.tokens_per_block = static_cast<uint32_t>(block_tokens);
  l.latent_format = latent;
  l.index_format = index;
  l.latent_scale_group = 128;  // kernels::EncodeLatent's FP8 block
  return l;
}

kernels::KvTokenView KvView(const KvLayout& layout, const uint8_t* base, const int32_t* table, int64_t layer) {
  auto offset = [&](KvComponent c) { return static_cast<int64_t>(layout.ComponentOffset(c)); };
  auto stride = [&](KvComponent c) { return static_cast<int64_t>(layout.ComponentBytesPerToken(c)); };
  kernels::KvTokenView v;
  v.base = base + layer * static_cast<int64_t>(layout.SlabBytes());
  v.block_table = table;
  v.block_tokens = layout.tokens_per_block;
  v.block_stride = static_cast<int64_t>(layout.BlockBytes());
  v.latent_offset = offset(KvComponent::kLatentCodes);
  v.latent_stride = stride(KvComponent::kLatentCodes);
  v.latent_scale_offset = offset(KvComponent::kLatentScales);
  v.latent_scale_stride = stride(KvComponent::kLatentScales);
  v.kpe_offset = offset(KvComponent::kRope);
  v.kpe_stride = stride(KvComponent::kRope);
  v.idx_k_offset = offset(KvComponent::kIndexCodes);
  v.idx_k_stride = stride(KvComponent::kIndexCodes);
  v.idx_scale_offset = offset(KvComponent::kIndexScales);
  v.idx_scale_stride = stride(KvComponent::kIndexScales);
  v.latent_dim = layout.kv_lora_rank;
  v.rope_dim = layout.qk_rope_head_dim;
  v.index_dim = layout.index_head_dim;
  v.latent_format = layout.latent_format;
  v.index_format = layout.index_format;
  return v;
}

}  // namespace pdserve::model
