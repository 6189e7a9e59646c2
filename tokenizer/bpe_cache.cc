#include "tokenizer/bpe_cache.h"

#include <immintrin.h>

#include <cstring>
#include <functional>

namespace pdserve::tokenizer {

namespace {
inline uint64_t HashKey(std::string_view key) { return std::hash<std::string_view>()(key); }
inline uint32_t TagOf(uint64_t hash) { return static_cast<uint32_t>(hash >> 32) | 1u; }
}  // namespace

BpeCache::BpeCache(size_t capacity) {
  if (capacity == 0) return;
  size_t slots = 1;
  while (slots < capacity) slots <<= 1;
  entries_.reset(new Entry[slots]);
  std::memset(static_cast<void*>(entries_.get()), 0, slots * sizeof(Entry));
  mask_ = slots - 1;
  locks_.reset(new std::atomic<uint8_t>[kLocks]);
  for (size_t i = 0; i < kLocks; ++i) locks_[i].store(0, std::memory_order_relaxed);
}

void BpeCache::Lock(size_t slot) const {
  std::atomic<uint8_t>& lock = locks_[slot % kLocks];
  while (lock.exchange(1, std::memory_order_acquire) != 0) {
    while (lock.load(std::memory_order_relaxed) != 0) _mm_pause();
  }
}

void BpeCache::Unlock(size_t slot) const { locks_[slot % kLocks].store(0, std::memory_order_release); }

bool BpeCache::Lookup(std::string_view key, std::vector<int32_t>* out) const {
  if (!entries_ || key.size() > kMaxKeyBytes) return false;
  const uint64_t hash = HashKey(key);
  const size_t slot = hash & mask_;
  const uint32_t tag = TagOf(hash);
  int32_t ids[kMaxIds];
  size_t n = 0;
  bool hit = false;
  Lock(slot);
  const Entry& e = entries_[slot];
  if (e.tag == tag && e.key_len == key.size() && std::memcmp(e.key, key.data(), key.size()) == 0) {
    n = e.num_ids;
    std::memcpy(ids, e.ids, n * sizeof(int32_t));
    hit = true;
  }
  Unlock(slot);
  if (hit) out->insert(out->end(), ids, ids + n);
  return hit;
}

void BpeCache::Insert(std::string_view key, const int32_t* ids, size_t n) {
  if (!entries_ || key.size() > kMaxKeyBytes || n > kMaxIds) return;
  const uint64_t hash = HashKey(key);
  const size_t slot = hash & mask_;
  Lock(slot);
  Entry& e = entries_[slot];
  e.tag = TagOf(hash);
  e.key_len = static_cast<uint8_t>(key.size());
  e.num_ids = static_cast<uint8_t>(n);
  std::memcpy(e.key, key.data(), key.size());
  std::memcpy(e.ids, ids, n * sizeof(int32_t));
  Unlock(slot);
}

void BpeCache::Clear() {
  for (size_t slot = 0; entries_ && slot <= mask_; ++slot) {
    Lock(slot);
    entries_[slot].tag = 0;
    Unlock(slot);
  }
}

}  // namespace pdserve::tokenizer
