// The model's side of the paged KV cache: the KvLayout (common/kv_layout.h) of a model config,
// the kernel view of one layer of it, and KvSequenceRef: where one sequence's blocks are (a pool
// base plus a block table).
//
// The bytes of a block are those common/kv_layout.h describes (layer slabs of component
// arrays), so a pool in this layout is registered and moved by kvtransfer layer by layer
// without repacking.
//
// Per token and layer (DeepSeek-V3.2 dims: Lkv 512, dr 64, ID 128):
//   latent kFp8Blockwise 512 codes + 16 scale bytes, kBf16 1024, kInt8PerToken 512 + 4;
//   k_pe 128; indexer 128 codes + 4 scale bytes. FP8 (the reference): 656 + 132 bytes.
// Thread-safety: value types and pure functions. KvSequenceRef points into memory it does not own.
#pragma once

#include <cstdint>

#include "common/kv_layout.h"
#include "kernels/mla_attention.h"
#include "model/config.h"

namespace pdserve::model {

// The layout of `c`'s cache in blocks of `block_tokens` tokens (the kernels' FP8 latent scale
// group of 128 values). REQUIRES: block_tokens >= 1.
KvLayout KvLayoutFor(const ModelConfig& c, int64_t block_tokens,
                     KvLatentFormat latent = KvLatentFormat::kFp8Blockwise,
                     KvIndexFormat index = KvIndexFormat::kFp8);

// The kernel view of `layer` for a sequence whose blocks are table[0..) in a pool at `base`.
kernels::KvTokenView KvView(const KvLayout& layout, const uint8_t* base, const int32_t* table, int64_t layer);

// One sequence's KV storage: blocks block_table[0 .. capacity / B) of a pool at pool_base.
struct KvSequenceRef {
  uint8_t* pool_base = nullptr;
  const KvLayout* layout = nullptr;
  const int32_t* block_table = nullptr;
  int64_t capacity_tokens = 0;  // tokens the table's blocks hold

  // Start of token `pos`'s `c` in `layer`. REQUIRES: pos < capacity_tokens.
  uint8_t* Field(int64_t layer, KvComponent c, int64_t pos) const {
    const int64_t b = layout->tokens_per_block;
    return pool_base + static_cast<int64_t>(block_table[pos / b]) * static_cast<int64_t>(layout->BlockBytes()) +
           layer * static_cast<int64_t>(layout->SlabBytes()) + static_cast<int64_t>(layout->ComponentOffset(c)) +
           (pos % b) * static_cast<int64_t>(layout->ComponentBytesPerToken(c));
  }
  kernels::KvTokenView View(int64_t layer) const { return KvView(*layout, pool_base, block_table, layer); }
};

}  // namespace pdserve::model
