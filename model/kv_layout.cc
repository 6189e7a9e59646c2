#include "model/kv_layout.h"

namespace pdserve::model {

namespace {
int64_t AlignUp(int64_t v, int64_t a) { return (v + a - 1) / a * a; }
}  // namespace

KvLayout KvLayout::ForConfig(const ModelConfig& c, int64_t block_tokens, KvLatentFormat latent, KvIndexFormat index) {
  KvLayout l;
  l.num_layers = c.num_hidden_layers;
  l.latent_dim = c.kv_lora_rank;
  l.rope_dim = c.qk_rope_head_dim;
  l.index_dim = c.index_head_dim;
  l.block_tokens = block_tokens;
  l.latent_format = latent;
  l.index_format = index;
  return l;
}

int64_t KvLayout::ComponentBytesPerToken(KvComponent c) const {
  switch (c) {
    case KvComponent::kLatentCodes: return kernels::LatentCodeBytes(latent_format, latent_dim);
    case KvComponent::kLatentScales: return kernels::LatentScaleBytes(latent_format, latent_dim);
    case KvComponent::kRope: return 2 * rope_dim;
    case KvComponent::kIndexCodes: return index_dim;
    case KvComponent::kIndexScales: return index_dim > 0 ? 4 : 0;
  }
  return 0;
}

int64_t KvLayout::ComponentOffset(KvComponent c) const {
  int64_t off = 0;
  for (int i = 0; i < static_cast<int>(c); ++i)
    off += AlignUp(ComponentBytesPerToken(static_cast<KvComponent>(i)) * block_tokens, kComponentAlign);
  return off;
}

int64_t KvLayout::SlabBytes() const { return ComponentOffset(KvComponent::kIndexScales) +
                                             AlignUp(ComponentBytesPerToken(KvComponent::kIndexScales) * block_tokens, kComponentAlign); }

int64_t KvLayout::TokenBytesPerLayer() const {
  int64_t s = 0;
  for (int i = 0; i < kNumKvComponents; ++i) s += ComponentBytesPerToken(static_cast<KvComponent>(i));
  return s;
}

std::string KvLayout::ToString() const {
  return "KvLayout{layers=" + std::to_string(num_layers) + ", latent=" + std::to_string(latent_dim) + " " +
         LatentFormatName(latent_format) + ", rope=" + std::to_string(rope_dim) + ", index=" + std::to_string(index_dim) +
         " " + IndexFormatName(index_format) + ", block_tokens=" + std::to_string(block_tokens) +
         ", block_bytes=" + std::to_string(BlockBytes()) + "}";
}

kernels::KvTokenView KvLayout::View(const uint8_t* base, const int32_t* table, int64_t layer) const {
  kernels::KvTokenView v;
  v.base = base + layer * SlabBytes();
  v.block_table = table;
  v.block_tokens = block_tokens;
  v.block_stride = BlockBytes();
  v.latent_offset = ComponentOffset(KvComponent::kLatentCodes);
  v.latent_stride = ComponentBytesPerToken(KvComponent::kLatentCodes);
  v.latent_scale_offset = ComponentOffset(KvComponent::kLatentScales);
  v.latent_scale_stride = ComponentBytesPerToken(KvComponent::kLatentScales);
  v.kpe_offset = ComponentOffset(KvComponent::kRope);
  v.kpe_stride = ComponentBytesPerToken(KvComponent::kRope);
  v.idx_k_offset = ComponentOffset(KvComponent::kIndexCodes);
  v.idx_k_stride = ComponentBytesPerToken(KvComponent::kIndexCodes);
  v.idx_scale_offset = ComponentOffset(KvComponent::kIndexScales);
  v.idx_scale_stride = ComponentBytesPerToken(KvComponent::kIndexScales);
  v.latent_dim = latent_dim;
  v.rope_dim = rope_dim;
  v.index_dim = index_dim;
  v.latent_format = latent_format;
  v.index_format = index_format;
  return v;
}

Result<KvLatentFormat> ParseLatentFormat(const std::string& name) {
  if (name == "fp8") return KvLatentFormat::kFp8Blockwise;
  if (name == "bf16") return KvLatentFormat::kBf16;
  if (name == "int8" || name == "c8") return KvLatentFormat::kInt8PerToken;
  return Status::InvalidArgument("unknown KV latent format '" + name + "' (fp8, bf16, int8)");
}

Result<KvIndexFormat> ParseIndexFormat(const std::string& name) {
  if (name == "fp8") return KvIndexFormat::kFp8;
  if (name == "int8") return KvIndexFormat::kInt8;
  return Status::InvalidArgument("unknown indexer key format '" + name + "' (fp8, int8)");
}

const char* LatentFormatName(KvLatentFormat f) {
  switch (f) {
    case KvLatentFormat::kFp8Blockwise: return "fp8";
    case KvLatentFormat::kBf16: return "bf16";
    case KvLatentFormat::kInt8PerToken: return "int8";
  }
  return "?";
}

const char* IndexFormatName(KvIndexFormat f) { return f == KvIndexFormat::kFp8 ? "fp8" : "int8"; }

}  // namespace pdserve::model
