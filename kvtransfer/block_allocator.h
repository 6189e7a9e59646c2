// BlockAllocator: hands out ids of fixed-size KV blocks. The engine's paged block pool
// implements it in production; FreeListBlockAllocator is kvtransfer's own simple version for
// tests and benchmarks. KvReceiver allocates a request's blocks through it and gives them back
// on abort; after KvReceiver::HandOver the blocks belong to the caller, who frees them.
//
// Thread-safety: implementations must be safe to call from any thread (KvReceiver calls them
// from its service thread and from API threads).
// Errors: Allocate returns kResourceExhausted when fewer than `count` blocks are free (and
// allocates nothing).
#pragma once

#include <cstdint>
#include <mutex>
#include <vector>

#include "common/status.h"

namespace pdserve::kvtransfer {

class BlockAllocator {
 public:
  virtual ~BlockAllocator() = default;
  // All-or-nothing allocation of `count` block ids.
  virtual Result<std::vector<uint32_t>> Allocate(uint32_t count) = 0;
  // REQUIRES: every id was allocated and not freed since.
  virtual void Free(const std::vector<uint32_t>& ids) = 0;
  virtual uint32_t num_free() const = 0;
  virtual uint32_t num_blocks() const = 0;
};

// Blocks [0, num_blocks), lowest ids first (so fresh pools hand out adjacent blocks, which
// lets whole-block writes coalesce).
class FreeListBlockAllocator final : public BlockAllocator {
 public:
  explicit FreeListBlockAllocator(uint32_t num_blocks);

  Result<std::vector<uint32_t>> Allocate(uint32_t count) override;
  void Free(const std::vector<uint32_t>& ids) override;
  uint32_t num_free() const override;
  uint32_t num_blocks() const override { return num_blocks_; }

 private:
  const uint32_t num_blocks_;
  mutable std::mutex mu_;
  std::vector<uint32_t> free_;       // a stack; back() is handed out first
  std::vector<uint8_t> allocated_;   // per id, to catch double frees
};

}  // namespace pdserve::kvtransfer
