// ImportAllocator: the BlockAllocator the decode worker's KvReceiver allocates through. The
// blocks of a request are already reserved in the engine (Engine::ReserveImport); the service
// stages exactly those ids before KvReceiver::Reserve, and Allocate hands them out. When the
// receiver gives blocks back (an aborted transfer whose quarantine ended, i.e. no writer can
// still write into them), Free calls on_free(request id) and the service aborts the engine's
// import request, which returns the blocks to the pool. After HandOver the engine owns them
// and the service calls Forget.
//
// Thread-safety: all methods may be called from any thread (one mutex, never held while
// calling on_free). Ownership: the pool must outlive the allocator.
#pragma once

#include <cstdint>
#include <functional>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "engine/block_pool.h"
#include "kvtransfer/block_allocator.h"

namespace pdserve::services::worker {

class ImportAllocator final : public kvtransfer::BlockAllocator {
 public:
  ImportAllocator(const engine::BlockPool* pool, std::function<void(uint64_t)> on_free)
      : pool_(pool), on_free_(std::move(on_free)) {}

  // The ids the next Allocate returns for `request_id` (cleared by Allocate or Unstage).
  void Stage(uint64_t request_id, std::vector<uint32_t> ids);
  void Unstage();
  // The engine took the blocks over (HandOver): a later Free of these ids is not ours.
  void Forget(uint32_t first_block);

  Result<std::vector<uint32_t>> Allocate(uint32_t count) override;
  void Free(const std::vector<uint32_t>& ids) override;
  uint32_t num_free() const override { return static_cast<uint32_t>(pool_->n_free()); }
  uint32_t num_blocks() const override { return static_cast<uint32_t>(pool_->n_blocks()); }

 private:
  const engine::BlockPool* const pool_;
  const std::function<void(uint64_t)> on_free_;
  std::mutex mu_;
  bool staged_ = false;
  uint64_t staged_request_ = 0;
  std::vector<uint32_t> staged_ids_;
  std::unordered_map<uint32_t, uint64_t> owner_;  // first block id -> request id
};

}  // namespace pdserve::services::worker
