#include "engine/prefix_cache.h"

#include <algorithm>

#include "common/check.h"

namespace pdserve::engine {

// A backlog of more distinct hashes than the pool has blocks is larger than the whole set.
PrefixCache::PrefixCache(int64_t n_blocks)
    : entries_(static_cast<size_t>(n_blocks)), events_(std::max<int64_t>(n_blocks, 16)) {}

bool PrefixCache::Stale(const Entry& e) const {
  if (e.parent.block < 0) return false;  // block 0 of a chain: its root never goes away
  const Entry& p = entries_[static_cast<size_t>(e.parent.block)];
  return !p.registered || p.generation != e.parent.generation;
}

bool PrefixCache::Matches(const Entry& e, CachedBlockId parent, std::span<const int32_t> tokens) const {
  return e.parent == parent && std::equal(e.tokens.begin(), e.tokens.end(), tokens.begin(), tokens.end());
}

std::optional<CachedBlockId> PrefixCache::Find(uint64_t hash, CachedBlockId parent,
                                               std::span<const int32_t> tokens) const {
  auto it = index_.find(hash);
  if (it == index_.end()) return std::nullopt;
  const Entry& e = entries_[static_cast<size_t>(it->second)];
  if (!Matches(e, parent, tokens)) return std::nullopt;
  return id(it->second);
}

std::optional<CachedBlockId> PrefixCache::Register(int32_t block, uint64_t hash, CachedBlockId parent,
                                                   std::span<const int32_t> tokens, int32_t* dropped,
                                                   uint64_t tier_uid) {
  *dropped = -1;
  Entry& e = entries_[static_cast<size_t>(block)];
  PDSERVE_CHECK(!e.registered, "registering a block twice");
  if (auto it = index_.find(hash); it != index_.end()) {
    const Entry& other = entries_[static_cast<size_t>(it->second)];
    if (Matches(other, parent, tokens)) return id(it->second);
    if (!Stale(other)) return std::nullopt;
    *dropped = it->second;
    if (other.parked) Unpark(it->second);
    Unregister(it->second);
  }
  e.registered = true;
  e.hash = hash;
  e.generation = next_generation_++;
  e.tier_uid = tier_uid;
  e.parent = parent;
  e.tokens.assign(tokens.begin(), tokens.end());
  index_[hash] = block;
  events_.Stored(hash);
  return id(block);
}

void PrefixCache::Park(int32_t block) {
  Entry& e = entries_[static_cast<size_t>(block)];
  PDSERVE_CHECK(e.registered && !e.parked, "parking a block that is not an active cached block");
  e.parked = true;
  e.prev = lru_tail_;
  e.next = -1;
  if (lru_tail_ >= 0) entries_[static_cast<size_t>(lru_tail_)].next = block;
  else lru_head_ = block;
  lru_tail_ = block;
  ++n_parked_;
}

void PrefixCache::Unpark(int32_t block) {
  Entry& e = entries_[static_cast<size_t>(block)];
  PDSERVE_CHECK(e.parked, "unparking a block that is not parked");
  if (e.prev >= 0) entries_[static_cast<size_t>(e.prev)].next = e.next;
  else lru_head_ = e.next;
  if (e.next >= 0) entries_[static_cast<size_t>(e.next)].prev = e.prev;
  else lru_tail_ = e.prev;
  e.parked = false;
  e.prev = e.next = -1;
  --n_parked_;
}

int32_t PrefixCache::EvictOldest() {
  const int32_t block = lru_head_;
  if (block < 0) return -1;
  Unpark(block);
  Unregister(block);
  ++evictions_;
  return block;
}

void PrefixCache::Unregister(int32_t block) {
  Entry& e = entries_[static_cast<size_t>(block)];
  PDSERVE_CHECK(e.registered && !e.parked, "unregistering a block that is not an active cached block");
  index_.erase(e.hash);
  events_.Removed(e.hash);
  e.registered = false;
  e.tier_uid = 0;
  e.tokens.clear();
  e.tokens.shrink_to_fit();
}

KvEventBatch PrefixCache::TakeEvents(bool full) {
  KvEventBatch b;
  if (full || events_.overflowed()) {
    b.reset = true;
    b.stored.reserve(index_.size());
    for (const auto& [hash, block] : index_) b.stored.push_back(hash);
    events_.Clear();
  } else {
    events_.Take(&b);
  }
  return b;
}

}  // namespace pdserve::engine
