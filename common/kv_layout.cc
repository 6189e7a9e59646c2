#include "common/kv_layout.h"

#include <fmt/format.h>

namespace pdserve {

namespace {
uint64_t AlignUp(uint64_t value, uint64_t align) { return (value + align - 1) / align * align; }
}  // namespace

std::string_view KvComponentName(KvComponent component) {
  switch (component) {
    case KvComponent::kLatentCodes: return "latent_codes";
    case KvComponent::kLatentScales: return "latent_scales";
    case KvComponent::kRope: return "rope";
    case KvComponent::kIndexCodes: return "index_codes";
    case KvComponent::kIndexScales: return "index_scales";
  }
  return "?";
}

std::string_view LatentFormatName(KvLatentFormat format) {
  switch (format) {
    case KvLatentFormat::kFp8Blockwise: return "fp8";
    case KvLatentFormat::kBf16: return "bf16";
    case KvLatentFormat::kInt8PerToken: return "int8";
  }
  return "?";
}

std::string_view IndexFormatName(KvIndexFormat format) {
  switch (format) {
    case KvIndexFormat::kFp8: return "fp8";
    case KvIndexFormat::kInt8: return "int8";
  }
  return "?";
}

Result<KvLatentFormat> ParseLatentFormat(std::string_view name) {
  if (name == "fp8") return KvLatentFormat::kFp8Blockwise;
  if (name == "bf16") return KvLatentFormat::kBf16;
  if (name == "int8" || name == "c8") return KvLatentFormat::kInt8PerToken;
  return Status::InvalidArgument(fmt::format("unknown KV latent format '{}' (fp8, bf16, int8)", name));
}

Result<KvIndexFormat> ParseIndexFormat(std::string_view name) {
  if (name == "fp8") return KvIndexFormat::kFp8;
  if (name == "int8") return KvIndexFormat::kInt8;
  return Status::InvalidArgument(fmt::format("unknown indexer key format '{}' (fp8, int8)", name));
}

KvLayout KvLayout::DeepSeekV32(uint32_t num_layers, uint32_t tokens_per_block) {
  KvLayout layout;
  layout.num_layers = num_layers;
  layout.kv_lora_rank = 512;
  layout.qk_rope_head_dim = 64;
  layout.index_head_dim = 128;
  layout.tokens_per_block = tokens_per_block;
  layout.latent_format = KvLatentFormat::kFp8Blockwise;
  layout.index_format = KvIndexFormat::kFp8;
  layout.latent_scale_group = 128;
  return layout;
}

Status KvLayout::Validate() const {
  auto bad = [&](std::string_view what) {
    return Status::InvalidArgument(fmt::format("KvLayout {}: {}", ToString(), what));
  };
  if (num_layers == 0 || num_layers > kMaxLayers) return bad("num_layers out of range");
  if (kv_lora_rank == 0 || kv_lora_rank > kMaxDim) return bad("kv_lora_rank out of range");
  if (qk_rope_head_dim > kMaxDim) return bad("qk_rope_head_dim out of range");
  if (index_head_dim > kMaxDim) return bad("index_head_dim out of range");
  if (tokens_per_block == 0 || tokens_per_block > kMaxTokensPerBlock) {
    return bad("tokens_per_block out of range");
  }
  switch (latent_format) {
    case KvLatentFormat::kBf16:
    case KvLatentFormat::kInt8PerToken:
      break;
    case KvLatentFormat::kFp8Blockwise:
      if (latent_scale_group == 0 || kv_lora_rank % latent_scale_group != 0) {
        return bad("kv_lora_rank must be a multiple of latent_scale_group");
      }
      break;
    default:
      return bad("unknown latent format");
  }
  if (index_format != KvIndexFormat::kFp8 && index_format != KvIndexFormat::kInt8) {
    return bad("unknown indexer format");
  }
  return Status::Ok();
}

uint64_t KvLayout::ComponentBytesPerToken(KvComponent component) const {
  switch (component) {
    case KvComponent::kLatentCodes:
      return latent_format == KvLatentFormat::kBf16 ? 2ull * kv_lora_rank : kv_lora_rank;
    case KvComponent::kLatentScales:
      if (latent_format == KvLatentFormat::kFp8Blockwise) {
        return latent_scale_group == 0 ? 0 : 4ull * (kv_lora_rank / latent_scale_group);
      }
      return latent_format == KvLatentFormat::kInt8PerToken ? 4 : 0;
    case KvComponent::kRope:
      return 2ull * qk_rope_head_dim;
    case KvComponent::kIndexCodes:
      return index_head_dim;
    case KvComponent::kIndexScales:
      return index_head_dim == 0 ? 0 : 4;
  }
  return 0;
}

uint64_t KvLayout::TokenBytesPerLayer() const {
  uint64_t total = 0;
  for (KvComponent c : kAllKvComponents) total += ComponentBytesPerToken(c);
  return total;
}

uint64_t KvLayout::ComponentOffset(KvComponent component) const {
  uint64_t offset = 0;
  for (KvComponent c : kAllKvComponents) {
    if (c == component) return offset;
    offset += AlignUp(ComponentBytesPerToken(c) * tokens_per_block, kComponentAlign);
  }
  return offset;
}

uint64_t KvLayout::SlabBytes() const {
  uint64_t total = 0;
  for (KvComponent c : kAllKvComponents) {
    total += AlignUp(ComponentBytesPerToken(c) * tokens_per_block, kComponentAlign);
  }
  return total;
}

bool KvLayout::SameTokenFormat(const KvLayout& other) const {
  return WithTokensPerBlock(other.tokens_per_block) == other;
}

std::string KvLayout::ToString() const {
  return fmt::format("{{layers={} lora={} rope={} index={} B={} latent={} indexer={} group={} block_bytes={}}}",
                     num_layers, kv_lora_rank, qk_rope_head_dim, index_head_dim, tokens_per_block,
                     LatentFormatName(latent_format), IndexFormatName(index_format),
                     latent_scale_group, BlockBytes());
}

}  // namespace pdserve
