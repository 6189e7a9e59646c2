#include "engine/block_pool.h"

#include <cstdlib>

namespace pdserve::engine {

Result<std::unique_ptr<BlockPool>> BlockPool::Create(const KvLayout& layout, int64_t budget_bytes) {
  PDSERVE_RETURN_IF_ERROR(layout.Validate());
  const int64_t n = budget_bytes / static_cast<int64_t>(layout.BlockBytes());
  if (n <= 0)
    return Status::InvalidArgument("KV budget of " + std::to_string(budget_bytes) + " bytes is below one block (" +
                                   std::to_string(layout.BlockBytes()) + " bytes)");
  if (n > INT32_MAX) return Status::InvalidArgument("KV budget gives more than 2^31 blocks");
  const int64_t bytes = (n * static_cast<int64_t>(layout.BlockBytes()) + kAlignment - 1) / kAlignment * kAlignment;
  void* p = std::aligned_alloc(kAlignment, static_cast<size_t>(bytes));
  if (!p) return Status::ResourceExhausted("cannot allocate " + std::to_string(bytes) + " bytes of KV pool");
  return std::unique_ptr<BlockPool>(new BlockPool(layout, static_cast<uint8_t*>(p), n, true));
}

Result<std::unique_ptr<BlockPool>> BlockPool::CreateOver(const KvLayout& layout, uint8_t* memory, int64_t bytes) {
  PDSERVE_RETURN_IF_ERROR(layout.Validate());
  if (reinterpret_cast<uintptr_t>(memory) % kAlignment != 0)
    return Status::InvalidArgument("KV pool memory must be aligned to " + std::to_string(kAlignment) + " bytes");
  const int64_t n = bytes / static_cast<int64_t>(layout.BlockBytes());
  if (n <= 0 || n > INT32_MAX)
    return Status::InvalidArgument("KV pool memory of " + std::to_string(bytes) + " bytes holds no block (" +
                                   std::to_string(layout.BlockBytes()) + " bytes each)");
  return std::unique_ptr<BlockPool>(new BlockPool(layout, memory, n, false));
}

BlockPool::BlockPool(const KvLayout& layout, uint8_t* base, int64_t n_blocks, bool owned)
    : layout_(layout),
      base_(base),
      n_blocks_(n_blocks),
      owned_(owned),
      refs_(static_cast<size_t>(n_blocks), 0),
      cache_(n_blocks) {
  free_.reserve(static_cast<size_t>(n_blocks));
  for (int64_t b = n_blocks - 1; b >= 0; --b) free_.push_back(static_cast<int32_t>(b));
}

BlockPool::~BlockPool() {
  if (owned_) std::free(base_);
}

int64_t BlockPool::n_free() const {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int64_t>(free_.size()) + cache_.n_parked();
}

int64_t BlockPool::n_cached() const {
  std::lock_guard<std::mutex> lock(mu_);
  return cache_.n_registered();
}

int64_t BlockPool::n_cached_idle() const {
  std::lock_guard<std::mutex> lock(mu_);
  return cache_.n_parked();
}

int64_t BlockPool::evictions() const {
  std::lock_guard<std::mutex> lock(mu_);
  return cache_.evictions();
}

Status BlockPool::Allocate(int64_t count, std::vector<int32_t>* out) {
  std::lock_guard<std::mutex> lock(mu_);
  const int64_t available = static_cast<int64_t>(free_.size()) + cache_.n_parked();
  if (count < 0 || count > available)
    return Status::ResourceExhausted("KV pool: " + std::to_string(count) + " blocks wanted, " +
                                     std::to_string(available) + " free");
  for (int64_t i = 0; i < count; ++i) out->push_back(TakeOneLocked());
  return Status::Ok();
}

int32_t BlockPool::TakeOneLocked() {
  int32_t id;
  if (!free_.empty()) {
    id = free_.back();
    free_.pop_back();
  } else {
    // The pool needs room: the least recently used idle block, kept on disk if there is a tier.
    id = cache_.Oldest();
    if (id < 0) return -1;
    const uint64_t hash = cache_.hash(id);
    if (tier_) SpillLocked(id);
    PDSERVE_CHECK(cache_.EvictOldest() == id, "the LRU changed under the pool's lock");
    if (tier_) SyncTierEventsLocked({&hash, 1});
  }
  refs_[static_cast<size_t>(id)] = 1;
  return id;
}

uint64_t BlockPool::TierUidLocked(int32_t block) {
  uint64_t uid = cache_.tier_uid(block);
  if (uid == 0) {
    uid = tier_->NewUid();
    cache_.set_tier_uid(block, uid);
  }
  return uid;
}

void BlockPool::SpillLocked(int32_t block) {
  // A stale entry's prefix is gone from memory: no walk from the root could reach it, on disk
  // either (its parent's tier uid is unknown).
  if (cache_.stale(block)) return;
  const CachedBlockId parent = cache_.parent(block);
  if (parent.block < 0 && parent.generation != tier_->ns()) return;  // the tier holds one namespace
  const uint64_t parent_uid = parent.block < 0 ? DiskTier::kRootUid : TierUidLocked(parent.block);
  const TierBlockId id{cache_.hash(block), TierUidLocked(block), parent_uid, cache_.tokens(block)};
  // A failed store is logged and counted by the tier; the block is then simply evicted.
  (void)tier_->Store(id, base_ + static_cast<int64_t>(block) * block_bytes());
}

int64_t BlockPool::RestoreLocked(CachedBlockId parent, std::span<const uint64_t> hashes,
                                 std::span<const int32_t> tokens, int64_t n, int64_t max_blocks, int64_t min_blocks,
                                 std::vector<CachedBlockId>* out) {
  const auto B = static_cast<size_t>(layout_.tokens_per_block);
  auto block_tokens = [&](int64_t k) { return tokens.subspan(static_cast<size_t>(k) * B, B); };
  // The chain the tier holds after `parent`, from its index alone. A parent with no tier uid
  // was never stored and never had a child stored: nothing on disk continues it.
  if (parent.block < 0 && parent.generation != tier_->ns()) return 0;  // the tier holds one namespace
  uint64_t parent_uid = parent.block < 0 ? DiskTier::kRootUid : cache_.tier_uid(parent.block);
  if (parent.block >= 0 && parent_uid == 0) return 0;
  std::vector<uint64_t> uids;
  for (int64_t k = n; k < max_blocks; ++k) {
    const std::optional<uint64_t> uid = tier_->Find(hashes[static_cast<size_t>(k)], parent_uid, block_tokens(k));
    if (!uid) break;
    uids.push_back(*uid);
    parent_uid = *uid;
  }
  if (n + static_cast<int64_t>(uids.size()) < min_blocks) return 0;
  int64_t restored = 0;
  for (const uint64_t uid : uids) {
    const int64_t k = n + restored;
    const uint64_t hash = hashes[static_cast<size_t>(k)];
    const int32_t block = TakeOneLocked();
    if (block < 0) break;  // every block is in use
    auto give_back = [&] {
      refs_[static_cast<size_t>(block)] = 0;
      free_.push_back(block);
    };
    // A damaged file is dropped by the tier (DataLoss); the block's bytes are then garbage, but
    // the block goes back to the free list unregistered, and its next holder writes it first.
    // (NotFound: the spill that freed `block` pushed this file out of the tier.)
    if (!tier_->Load(hash, uid, base_ + static_cast<int64_t>(block) * block_bytes()).ok()) {
      give_back();
      break;
    }
    if (record_restores_) restored_.push_back(block);  // before anyone can map it
    int32_t dropped = -1;
    const std::optional<CachedBlockId> id = cache_.Register(block, hash, parent, block_tokens(k), &dropped, uid);
    if (dropped >= 0 && refs_[static_cast<size_t>(dropped)] == 0) free_.push_back(dropped);
    // The walk in memory missed this name after this parent, so the name is free, stale, or
    // held by other content (a collision: a miss here too).
    if (!id || id->block != block) {
      give_back();
      break;
    }
    out->push_back(*id);
    parent = *id;
    ++restored;
  }
  return restored;
}

void BlockPool::Free(std::span<const int32_t> ids) {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto it = ids.rbegin(); it != ids.rend(); ++it) {
    const int32_t id = *it;
    PDSERVE_CHECK(id >= 0 && id < n_blocks_ && refs_[static_cast<size_t>(id)] > 0, "freeing a block that is not allocated");
    if (--refs_[static_cast<size_t>(id)] > 0) continue;
    if (cache_.registered(id)) cache_.Park(id);
    else free_.push_back(id);
  }
}

int64_t BlockPool::MatchPrefix(CachedBlockId root, std::span<const uint64_t> hashes, std::span<const int32_t> tokens,
                               int64_t max_blocks, std::vector<CachedBlockId>* out, int64_t min_blocks) {
  const auto B = static_cast<size_t>(layout_.tokens_per_block);
  PDSERVE_CHECK(static_cast<int64_t>(hashes.size()) >= max_blocks && tokens.size() >= static_cast<size_t>(max_blocks) * B,
                "prefix match past the chain");
  std::lock_guard<std::mutex> lock(mu_);
  CachedBlockId parent = root;
  int64_t n = 0;
  for (; n < max_blocks; ++n) {
    const std::optional<CachedBlockId> hit =
        cache_.Find(hashes[static_cast<size_t>(n)], parent, tokens.subspan(static_cast<size_t>(n) * B, B));
    if (!hit) break;
    if (refs_[static_cast<size_t>(hit->block)]++ == 0) cache_.Unpark(hit->block);
    out->push_back(*hit);
    parent = *hit;
  }
  if (tier_ && n < max_blocks) {
    n += RestoreLocked(parent, hashes, tokens, n, max_blocks, min_blocks, out);
    SyncTierEventsLocked({});  // damaged files it deleted
  }
  return n;
}

std::optional<CachedBlockId> BlockPool::Register(int32_t block, uint64_t hash, CachedBlockId parent,
                                                 std::span<const int32_t> block_tokens) {
  PDSERVE_CHECK(block_tokens.size() == layout_.tokens_per_block, "registering a block that is not full");
  std::lock_guard<std::mutex> lock(mu_);
  PDSERVE_CHECK(block >= 0 && block < n_blocks_ && refs_[static_cast<size_t>(block)] > 0,
                "registering a block nobody holds");
  if (cache_.registered(block)) return cache_.id(block);  // a block the caller mapped from the cache
  int32_t dropped = -1;
  const std::optional<CachedBlockId> r = cache_.Register(block, hash, parent, block_tokens, &dropped);
  // A stale entry gave up its name: idle, it is now simply free.
  if (dropped >= 0 && refs_[static_cast<size_t>(dropped)] == 0) free_.push_back(dropped);
  return r;
}

void BlockPool::RecordRestoredBlocks(bool on) {
  std::lock_guard<std::mutex> lock(mu_);
  record_restores_ = on;
  if (!on) restored_.clear();
}

std::vector<int32_t> BlockPool::TakeRestoredBlocks() {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<int32_t> out;
  out.swap(restored_);
  return out;
}

int64_t BlockPool::EvictIdle() {
  std::lock_guard<std::mutex> lock(mu_);
  int64_t n = 0;
  std::vector<uint64_t> evicted;
  for (int32_t id; (id = cache_.Oldest()) >= 0; ++n) {
    if (tier_) evicted.push_back(cache_.hash(id));
    cache_.EvictOldest();
    free_.push_back(id);
  }
  if (tier_) SyncTierEventsLocked(evicted);
  return n;
}

void BlockPool::SyncTierEventsLocked(std::span<const uint64_t> evicted_from_memory) {
  // A name is held while memory or the tier has it: eviction from memory with the block on
  // disk is no removal, and a file deleted while memory still has the name is none either.
  for (uint64_t h : evicted_from_memory)
    if (!cache_.holds(h) && tier_->Holds(h)) cache_.NoteStored(h);
  for (uint64_t h : tier_->TakeDropped())
    if (!cache_.holds(h) && !tier_->Holds(h)) cache_.NoteRemoved(h);
}

int64_t BlockPool::disk_tier_capacity_blocks() const {
  std::lock_guard<std::mutex> lock(mu_);
  return tier_ ? tier_->capacity_blocks() : 0;
}

void BlockPool::AttachDiskTier(std::unique_ptr<DiskTier> tier) {
  std::lock_guard<std::mutex> lock(mu_);
  PDSERVE_CHECK(!tier_, "a disk tier is already attached");
  tier_ = std::move(tier);
}

bool BlockPool::has_disk_tier() const {
  std::lock_guard<std::mutex> lock(mu_);
  return tier_ != nullptr;
}

DiskTierStats BlockPool::disk_tier_stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return tier_ ? tier_->stats() : DiskTierStats{};
}

KvEventBatch BlockPool::TakeKvEvents(bool full) {
  std::lock_guard<std::mutex> lock(mu_);
  KvEventBatch b = cache_.TakeEvents(full);
  if (tier_ && b.reset)
    for (uint64_t h : tier_->Hashes())
      if (!cache_.holds(h)) b.stored.push_back(h);
  return b;
}

int64_t BlockPool::kv_event_overflows() const {
  std::lock_guard<std::mutex> lock(mu_);
  return cache_.event_overflows();
}

Status BlockTable::EnsureCapacity(BlockPool* pool, int64_t n_tokens) {
  const int64_t need = static_cast<int64_t>(pool->layout().BlocksForTokens(static_cast<uint64_t>(n_tokens))) - n_blocks();
  if (need <= 0) return Status::Ok();
  return pool->Allocate(need, &ids_);
}

void BlockTable::Release(BlockPool* pool) {
  pool->Free(ids_);
  ids_.clear();
}

model::KvSequenceRef BlockTable::Ref(const BlockPool& pool) const {
  model::KvSequenceRef r;
  r.pool_base = pool.base();
  r.layout = &pool.layout();
  r.block_table = ids_.data();
  r.capacity_tokens = capacity_tokens(pool.layout());
  return r;
}

void BlockTable::Adopt(std::vector<int32_t> ids) {
  PDSERVE_CHECK(ids_.empty(), "adopting blocks into a non-empty table");
  ids_ = std::move(ids);
}

}  // namespace pdserve::engine
