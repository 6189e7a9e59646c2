// KvLayout: the byte layout of a paged MLA + indexer KV cache block, and KvSequenceRef: where
// one sequence's blocks are (a pool base plus a block table).
//
// A block holds B = block_tokens consecutive tokens of one sequence for every layer, as
//   block = slab(layer 0) | slab(layer 1) | ... | slab(layer L-1)           (SlabBytes() each)
//   slab  = latent codes [B][code bytes] | latent scales [B][scale bytes] | k_pe [B][dr x bf16]
//         | indexer codes [B][ID] | indexer scales [B][fp32]
// with every component array starting at a multiple of kComponentAlign from the slab start
// (zero padding after it otherwise). This is the byte order kvtransfer::KvLayout describes, so a
// pool in this layout can be registered and moved layer by layer without repacking: one layer's
// slab is contiguous, and adjacent blocks are adjacent in a pool.
//
// Per token and layer (DeepSeek-V3.2 dims: Lkv 512, dr 64, ID 128):
//   latent kFp8Blockwise 512 codes + 16 scale bytes, kBf16 1024, kInt8PerToken 512 + 4;
//   k_pe 128; indexer 128 codes + 4 scale bytes. FP8 (the reference): 656 + 132 bytes.
// Thread-safety: value types. KvSequenceRef points into memory it does not own.
#pragma once

#include <cstdint>
#include <string>

#include "kernels/mla_attention.h"
#include "model/config.h"

namespace pdserve::model {

using kernels::KvIndexFormat;
using kernels::KvLatentFormat;

enum class KvComponent : uint8_t { kLatentCodes = 0, kLatentScales, kRope, kIndexCodes, kIndexScales };
inline constexpr int kNumKvComponents = 5;

struct KvLayout {
  static constexpr int64_t kComponentAlign = 64;

  int64_t num_layers = 0;
  int64_t latent_dim = 0;  // Lkv
  int64_t rope_dim = 0;    // dr
  int64_t index_dim = 0;   // ID
  int64_t block_tokens = 0;
  KvLatentFormat latent_format = KvLatentFormat::kFp8Blockwise;
  KvIndexFormat index_format = KvIndexFormat::kFp8;

  static KvLayout ForConfig(const ModelConfig& c, int64_t block_tokens,
                            KvLatentFormat latent = KvLatentFormat::kFp8Blockwise,
                            KvIndexFormat index = KvIndexFormat::kFp8);

  int64_t ComponentBytesPerToken(KvComponent c) const;
  int64_t ComponentOffset(KvComponent c) const;  // within a slab
  int64_t SlabBytes() const;
  int64_t BlockBytes() const { return SlabBytes() * num_layers; }
  // Payload bytes of one token in one layer (no padding).
  int64_t TokenBytesPerLayer() const;
  int64_t BlocksForTokens(int64_t n_tokens) const { return (n_tokens + block_tokens - 1) / block_tokens; }
  std::string ToString() const;

  // The kernel view of `layer` for a sequence whose blocks are table[0..) in a pool at `base`.
  kernels::KvTokenView View(const uint8_t* base, const int32_t* table, int64_t layer) const;

  bool operator==(const KvLayout&) const = default;
};

// Parses "fp8" / "bf16" / "int8" (latent) and "fp8" / "int8" (indexer). Errors: InvalidArgument.
Result<KvLatentFormat> ParseLatentFormat(const std::string& name);
Result<KvIndexFormat> ParseIndexFormat(const std::string& name);
const char* LatentFormatName(KvLatentFormat f);
const char* IndexFormatName(KvIndexFormat f);

// One sequence's KV storage: blocks block_table[0 .. capacity / B) of a pool at pool_base.
struct KvSequenceRef {
  uint8_t* pool_base = nullptr;
  const KvLayout* layout = nullptr;
  const int32_t* block_table = nullptr;
  int64_t capacity_tokens = 0;  // tokens the table's blocks hold

  // Start of token `pos`'s `c` in `layer`. REQUIRES: pos < capacity_tokens.
  uint8_t* Field(int64_t layer, KvComponent c, int64_t pos) const {
    const int64_t b = layout->block_tokens;
    return pool_base + static_cast<int64_t>(block_table[pos / b]) * layout->BlockBytes() +
           layer * layout->SlabBytes() + layout->ComponentOffset(c) + (pos % b) * layout->ComponentBytesPerToken(c);
  }
  kernels::KvTokenView View(int64_t layer) const { return layout->View(pool_base, block_table, layer); }
};

}  // namespace pdserve::model
