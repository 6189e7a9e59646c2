// BlockPool: the paged KV memory of one worker, and BlockTable: one sequence's blocks in it.
//
// The pool is one contiguous, 4 KiB-aligned region of n_blocks blocks laid out as
// KvLayout describes ([block][layer slab][component][token]; every layer's slice of a
// block is contiguous), sized from a memory budget. The region is either owned (allocated
// here) or provided by the caller, so the KV transfer layer can register base()..size_bytes()
// as one memory region and address block b at base() + b * block_bytes().
// Blocks are handed out lowest id first from a free list (fresh pools give adjacent blocks);
// allocation is all-or-nothing. Ownership is simple: a block belongs to exactly one holder
// (no sharing, no refcounts) until freed.
// Thread-safety: Allocate/Free/counters are safe from any thread (one mutex); the bytes of a
// block are owned by whoever allocated it.
// Errors: Create: InvalidArgument (bad layout, budget below one block, misaligned external
// memory); Allocate: ResourceExhausted when fewer than `count` blocks are free.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <vector>

#include "common/status.h"
#include "model/kv_layout.h"

namespace pdserve::engine {

class BlockPool {
 public:
  static constexpr int64_t kAlignment = 4096;

  // A pool of floor(budget_bytes / layout.BlockBytes()) blocks in owned memory.
  static Result<std::unique_ptr<BlockPool>> Create(const KvLayout& layout, int64_t budget_bytes);
  // A pool over caller memory [memory, memory + bytes) (kept alive by the caller).
  // REQUIRES: memory aligned to kAlignment.
  static Result<std::unique_ptr<BlockPool>> CreateOver(const KvLayout& layout, uint8_t* memory, int64_t bytes);
  ~BlockPool();
  BlockPool(const BlockPool&) = delete;
  BlockPool& operator=(const BlockPool&) = delete;

  const KvLayout& layout() const { return layout_; }
  uint8_t* base() const { return base_; }
  int64_t size_bytes() const { return n_blocks_ * block_bytes(); }
  int64_t block_bytes() const { return static_cast<int64_t>(layout_.BlockBytes()); }
  int64_t n_blocks() const { return n_blocks_; }
  int64_t capacity_tokens() const { return n_blocks_ * layout_.tokens_per_block; }
  int64_t n_free() const;
  int64_t n_used() const { return n_blocks_ - n_free(); }

  // Appends `count` block ids to *out (all or nothing).
  Status Allocate(int64_t count, std::vector<int32_t>* out);
  // REQUIRES: every id is allocated (a double free aborts: it is a bug).
  void Free(std::span<const int32_t> ids);

 private:
  BlockPool(const KvLayout& layout, uint8_t* base, int64_t n_blocks, bool owned);

  const KvLayout layout_;
  uint8_t* const base_;
  const int64_t n_blocks_;
  const bool owned_;
  mutable std::mutex mu_;
  std::vector<int32_t> free_;       // stack: back() is handed out next
  std::vector<uint8_t> allocated_;  // per block id
};

// The blocks of one sequence, in logical order: token t lives in block ids()[t / B], slot t % B.
// Thread-safety: not thread-safe (owned by one request, touched by the engine's step thread).
class BlockTable {
 public:
  const std::vector<int32_t>& ids() const { return ids_; }
  int64_t n_blocks() const { return static_cast<int64_t>(ids_.size()); }
  int64_t capacity_tokens(const KvLayout& l) const { return n_blocks() * l.tokens_per_block; }
  // Grows the table so it holds n_tokens. Errors: ResourceExhausted (table unchanged).
  Status EnsureCapacity(BlockPool* pool, int64_t n_tokens);
  // Returns every block to the pool.
  void Release(BlockPool* pool);
  // The forward pass's view of this sequence.
  model::KvSequenceRef Ref(const BlockPool& pool) const;
  // Adopts ids allocated elsewhere (KV import). REQUIRES: the table is empty.
  void Adopt(std::vector<int32_t> ids);

 private:
  std::vector<int32_t> ids_;
};

}  // namespace pdserve::engine
