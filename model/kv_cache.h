// SequenceKvCache: a growable cache for one sequence, used by the single-sequence
// Model::Forward (tests, tools, `pdserve generate`). It stores the same paged KvLayout the
// engine's block pool uses, in a private run of blocks with the identity block table, so both
// go through exactly the same read and write code.
// Thread-safety: not thread-safe; owned by the sequence's forward pass. Resize invalidates
// views and refs.
#pragma once

#include <cstdint>
#include <vector>

#include "model/config.h"
#include "model/kv_layout.h"

namespace pdserve::model {

class SequenceKvCache {
 public:
  // REQUIRES: block_tokens >= 1.
  explicit SequenceKvCache(const ModelConfig& config, int64_t block_tokens = 64,
                           KvLatentFormat latent = KvLatentFormat::kFp8Blockwise,
                           KvIndexFormat index = KvIndexFormat::kFp8);

  int64_t n_tokens() const { return n_tokens_; }
  // Grows (new records zeroed) or shrinks to n tokens; capacity grows by whole blocks.
  void Resize(int64_t n);
  const KvLayout& layout() const { return layout_; }

  // Read/write access for the forward pass (valid until the next Resize).
  KvSequenceRef Ref();
  // A kernel view of one layer (valid until the next Resize).
  kernels::KvTokenView View(int64_t layer) const;

 private:
  KvLayout layout_;
  int64_t n_tokens_ = 0;
  std::vector<uint8_t> storage_;  // n_blocks * BlockBytes()
  std::vector<int32_t> table_;    // 0, 1, 2, ...
};

}  // namespace pdserve::model
