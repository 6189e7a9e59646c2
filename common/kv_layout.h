// KvLayout: the byte layout of one paged MLA + indexer KV block, and the storage formats of its
// components. One definition for every module: the kernels read the formats, the model and the
// engine's block pool (which owns the memory) store blocks in this layout, and kvtransfer
// describes and moves the same bytes without repacking. It lives in common/ because kernels/
// and kvtransfer/ both need it and may use nothing else in common.
//
// A block holds B = tokens_per_block consecutive tokens of one sequence, for every layer.
// Byte order inside a block, [layer][component][token]:
//
//   block  = slab(layer 0) | slab(layer 1) | ... | slab(layer L-1)        (each slab_bytes)
//   slab   = latent codes  [B][latent_code_bytes]      kv_lora_rank values (BF16 / FP8 / INT8)
//          | latent scales [B][latent_scale_bytes]     fp32: kv_lora_rank/group (FP8), 1 (INT8),
//                                                      absent (BF16)
//          | rope          [B][2 * qk_rope_head_dim]   BF16
//          | index codes   [B][index_head_dim]         FP8 E4M3 or INT8 (absent if dim == 0)
//          | index scales  [B][4]                      fp32, one per token (absent if dim == 0)
//
// Every component array starts at a multiple of kComponentAlign bytes from the slab start
// (zero padding after an array whose size is not a multiple; none for B a multiple of 16 with
// the DeepSeek dimensions). One layer's slab is contiguous, so the KV of a layer can be
// written as soon as that layer is computed; consecutive blocks are contiguous in a pool, so
// whole-block writes of adjacent blocks coalesce. Padding bytes are never transferred.
//
// DeepSeek-V3.2 FP8 form (kv_lora_rank 512, rope 64, index 128, group 128): 656 bytes of
// latent+rope and 132 bytes of indexer keys per token per layer.
//
// Thread-safety: a value type; const methods may be called from any thread.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>

#include "common/status.h"

namespace pdserve {

// How the latent is stored (kernels/mla_attention.h says how each is encoded). The values are
// not a wire format: proto/ has its own enum, mapped in kvtransfer/kv_wire.cc.
enum class KvLatentFormat : uint8_t {
  kFp8Blockwise = 0,  // kv_lora_rank FP8 E4M3 codes + one fp32 scale per latent_scale_group
  kBf16 = 1,          // kv_lora_rank BF16 values
  kInt8PerToken = 2,  // kv_lora_rank INT8 codes + one fp32 scale per token ("C8")
};

enum class KvIndexFormat : uint8_t {
  kFp8 = 0,   // index_head_dim FP8 E4M3 codes + one fp32 scale per token
  kInt8 = 1,  // index_head_dim INT8 codes + one fp32 scale per token
};

enum class KvComponent : uint8_t {
  kLatentCodes = 0,
  kLatentScales = 1,
  kRope = 2,
  kIndexCodes = 3,
  kIndexScales = 4,
};
inline constexpr int kNumKvComponents = 5;
inline constexpr std::array<KvComponent, kNumKvComponents> kAllKvComponents = {
    KvComponent::kLatentCodes, KvComponent::kLatentScales, KvComponent::kRope,
    KvComponent::kIndexCodes, KvComponent::kIndexScales};

std::string_view KvComponentName(KvComponent component);
std::string_view LatentFormatName(KvLatentFormat format);  // "fp8", "bf16", "int8"
std::string_view IndexFormatName(KvIndexFormat format);    // "fp8", "int8"
// Parse the names above ("c8" is also accepted for kInt8PerToken). Errors: InvalidArgument.
Result<KvLatentFormat> ParseLatentFormat(std::string_view name);
Result<KvIndexFormat> ParseIndexFormat(std::string_view name);

struct KvLayout {
  static constexpr uint64_t kComponentAlign = 64;
  // Limits that keep every offset far below 2^63 (checked by Validate).
  static constexpr uint32_t kMaxLayers = 1024;
  static constexpr uint32_t kMaxDim = 16384;
  static constexpr uint32_t kMaxTokensPerBlock = 4096;

  uint32_t num_layers = 0;
  uint32_t kv_lora_rank = 0;
  uint32_t qk_rope_head_dim = 0;
  uint32_t index_head_dim = 0;  // 0: no indexer keys
  uint32_t tokens_per_block = 0;
  KvLatentFormat latent_format = KvLatentFormat::kFp8Blockwise;
  KvIndexFormat index_format = KvIndexFormat::kFp8;
  uint32_t latent_scale_group = 128;  // values per scale, kFp8Blockwise only

  // The DeepSeek-V3.2 cache (FP8 latent, FP8 indexer) with `num_layers` layers.
  static KvLayout DeepSeekV32(uint32_t num_layers, uint32_t tokens_per_block);

  // kInvalidArgument when a field is zero where it must not be, exceeds a limit, or
  // kv_lora_rank is not a multiple of latent_scale_group for kFp8Blockwise.
  Status Validate() const;

  // Bytes of one token's `component` in one layer (0 when the component is absent).
  uint64_t ComponentBytesPerToken(KvComponent component) const;
  // Sum over components: the bytes one token occupies in one layer (no padding).
  uint64_t TokenBytesPerLayer() const;
  // Offset of the component array within a layer slab.
  uint64_t ComponentOffset(KvComponent component) const;
  uint64_t SlabBytes() const;
  uint64_t BlockBytes() const { return SlabBytes() * num_layers; }
  // Offset within a block of token `slot`'s `component` in `layer`.
  uint64_t Offset(uint32_t layer, KvComponent component, uint32_t slot) const {
    return static_cast<uint64_t>(layer) * SlabBytes() + ComponentOffset(component) +
           static_cast<uint64_t>(slot) * ComponentBytesPerToken(component);
  }
  // Blocks needed for `num_tokens` tokens.
  uint64_t BlocksForTokens(uint64_t num_tokens) const {
    return (num_tokens + tokens_per_block - 1) / tokens_per_block;
  }
  // True when both describe the same per-token bytes (block sizes may differ).
  bool SameTokenFormat(const KvLayout& other) const;
  KvLayout WithTokensPerBlock(uint32_t tokens) const {
    KvLayout copy = *this;
    copy.tokens_per_block = tokens;
    return copy;
  }
  std::string ToString() const;

  bool operator==(const KvLayout&) const = default;
};

}  // namespace pdserve
