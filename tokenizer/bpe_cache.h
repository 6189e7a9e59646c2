// BpeCache: remembers the ids BPE produced for a pre-token (keyed by its raw bytes). Natural
// text repeats the same words constantly, so most pieces skip the merge loop entirely.
//
// The cache is split into shards, each behind its own mutex, so concurrent Encode calls on a
// shared Tokenizer rarely contend. A full shard is simply emptied: eviction order does not
// matter for correctness, and this keeps the hit path to one hash lookup.
//
// Thread-safety: all methods may be called concurrently from any thread.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace pdserve::tokenizer {

class BpeCache {
 public:
  // `capacity` entries in total (0 disables the cache); pieces longer than kMaxKeyBytes are
  // never cached (they rarely repeat).
  explicit BpeCache(size_t capacity);

  static constexpr size_t kMaxKeyBytes = 128;

  // Appends the cached ids of `key` to *out and returns true, or returns false on a miss.
  bool Lookup(std::string_view key, std::vector<int32_t>* out) const;
  void Insert(std::string_view key, const int32_t* ids, size_t n);
  void Clear();

 private:
  // Ids of one entry; up to kInline ids live inside the entry (the common case).
  struct Ids {
    static constexpr uint32_t kInline = 5;
    uint32_t n = 0;
    int32_t inline_ids[kInline];
    std::unique_ptr<int32_t[]> heap;
    const int32_t* data() const { return n <= kInline ? inline_ids : heap.get(); }
  };
  struct Hash {
    using is_transparent = void;
    size_t operator()(std::string_view s) const { return std::hash<std::string_view>()(s); }
  };
  struct Shard {
    mutable std::mutex mu;
    std::unordered_map<std::string, Ids, Hash, std::equal_to<>> map;
  };
  static constexpr size_t kShards = 16;

  Shard& ShardFor(std::string_view key, size_t* hash) const;

  size_t per_shard_capacity_;
  mutable std::array<Shard, kShards> shards_;
};

}  // namespace pdserve::tokenizer
