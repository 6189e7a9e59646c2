#include "services/worker/import_allocator.h"

#include <string>

namespace pdserve::services::worker {

void ImportAllocator::Stage(uint64_t request_id, std::vector<uint32_t> ids) {
  std::lock_guard<std::mutex> lock(mu_);
  staged_ = true;
  staged_request_ = request_id;
  staged_ids_ = std::move(ids);
}

void ImportAllocator::Unstage() {
  std::lock_guard<std::mutex> lock(mu_);
  staged_ = false;
  staged_ids_.clear();
}

void ImportAllocator::Forget(uint32_t first_block) {
  std::lock_guard<std::mutex> lock(mu_);
  owner_.erase(first_block);
}

Result<std::vector<uint32_t>> ImportAllocator::Allocate(uint32_t count) {
  std::lock_guard<std::mutex> lock(mu_);
  // Only the staged reservation can be "allocated": the engine already holds the blocks.
  if (!staged_ || staged_ids_.size() != count || count == 0)
    return Status::ResourceExhausted("no staged engine reservation of " + std::to_string(count) + " blocks");
  staged_ = false;
  owner_[staged_ids_.front()] = staged_request_;
  return std::move(staged_ids_);
}

void ImportAllocator::Free(const std::vector<uint32_t>& ids) {
  if (ids.empty()) return;
  uint64_t request_id = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = owner_.find(ids.front());
    if (it == owner_.end()) return;
    request_id = it->second;
    owner_.erase(it);
  }
  on_free_(request_id);
}

}  // namespace pdserve::services::worker
