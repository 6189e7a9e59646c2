#include "kvtransfer/block_allocator.h"

#include <algorithm>

#include <fmt/format.h>

namespace pdserve::kvtransfer {

FreeListBlockAllocator::FreeListBlockAllocator(uint32_t num_blocks)
    : num_blocks_(num_blocks), allocated_(num_blocks, 0) {
  free_.reserve(num_blocks);
  for (uint32_t i = num_blocks; i > 0; --i) free_.push_back(i - 1);
}

Result<std::vector<uint32_t>> FreeListBlockAllocator::Allocate(uint32_t count) {
  std::lock_guard<std::mutex> lock(mu_);
  if (count > free_.size()) {
    return Status::ResourceExhausted(
        fmt::format("{} KV blocks requested, {} of {} free", count, free_.size(), num_blocks_));
  }
  std::vector<uint32_t> ids(free_.end() - count, free_.end());
  std::reverse(ids.begin(), ids.end());
  free_.resize(free_.size() - count);
  for (uint32_t id : ids) allocated_[id] = 1;
  return ids;
}

void FreeListBlockAllocator::Free(const std::vector<uint32_t>& ids) {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto it = ids.rbegin(); it != ids.rend(); ++it) {
    PDSERVE_CHECK(*it < num_blocks_ && allocated_[*it], "freeing a block that is not allocated");
    allocated_[*it] = 0;
    free_.push_back(*it);
  }
}

uint32_t FreeListBlockAllocator::num_free() const {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<uint32_t>(free_.size());
}

}  // namespace pdserve::kvtransfer
