#include "tokenizer/bpe_cache.h"

#include <algorithm>

namespace pdserve::tokenizer {

BpeCache::BpeCache(size_t capacity) : per_shard_capacity_((capacity + kShards - 1) / kShards) {}

BpeCache::Shard& BpeCache::ShardFor(std::string_view key, size_t* hash) const {
  *hash = Hash()(key);
  // The high bits pick the shard; unordered_map uses the low bits for buckets.
  return shards_[(*hash >> 56) % kShards];
}

bool BpeCache::Lookup(std::string_view key, std::vector<int32_t>* out) const {
  if (per_shard_capacity_ == 0 || key.size() > kMaxKeyBytes) return false;
  size_t hash;
  Shard& shard = ShardFor(key, &hash);
  std::lock_guard<std::mutex> lock(shard.mu);
  auto it = shard.map.find(key);
  if (it == shard.map.end()) return false;
  const Ids& ids = it->second;
  out->insert(out->end(), ids.data(), ids.data() + ids.n);
  return true;
}

void BpeCache::Insert(std::string_view key, const int32_t* ids, size_t n) {
  if (per_shard_capacity_ == 0 || key.size() > kMaxKeyBytes) return;
  Ids entry;
  entry.n = static_cast<uint32_t>(n);
  if (n <= Ids::kInline) {
    std::copy(ids, ids + n, entry.inline_ids);
  } else {
    entry.heap.reset(new int32_t[n]);
    std::copy(ids, ids + n, entry.heap.get());
  }
  size_t hash;
  Shard& shard = ShardFor(key, &hash);
  std::lock_guard<std::mutex> lock(shard.mu);
  if (shard.map.size() >= per_shard_capacity_) shard.map.clear();
  shard.map.try_emplace(std::string(key), std::move(entry));
}

void BpeCache::Clear() {
  for (Shard& shard : shards_) {
    std::lock_guard<std::mutex> lock(shard.mu);
    shard.map.clear();
  }
}

}  // namespace pdserve::tokenizer
