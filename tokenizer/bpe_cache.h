// BpeCache: remembers the ids BPE produced for a pre-token (keyed by its raw bytes). Natural
// text repeats the same words constantly, so most pieces skip the merge loop entirely.
//
// A fixed-size, direct-mapped table of 64-byte entries that hold the key and the ids inline:
// a lookup touches one cache line and nothing is ever allocated after construction, so a miss
// (the insert) costs almost nothing either. A new key simply overwrites whatever shared its
// slot; eviction order does not affect correctness. Keys longer than kMaxKeyBytes and results
// longer than kMaxIds are not cached (such pieces rarely repeat).
//
// Thread-safety: all methods may be called concurrently from any thread. Slots are guarded by
// striped spin locks (critical sections are a 64-byte copy, so spinning is cheaper than a mutex).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string_view>
#include <vector>

namespace pdserve::tokenizer {

class BpeCache {
 public:
  static constexpr size_t kMaxKeyBytes = 30;
  static constexpr size_t kMaxIds = 7;

  // About `capacity` entries (rounded up to a power of two; 0 disables the cache).
  explicit BpeCache(size_t capacity);

  // Appends the cached ids of `key` to *out and returns true, or returns false on a miss.
  bool Lookup(std::string_view key, std::vector<int32_t>* out) const;
  void Insert(std::string_view key, const int32_t* ids, size_t n);
  void Clear();

 private:
  struct alignas(64) Entry {
    uint32_t tag;  // high hash bits | 1; 0 marks an empty slot
    uint8_t key_len;
    uint8_t num_ids;
    char key[kMaxKeyBytes];
    int32_t ids[kMaxIds];
  };
  static_assert(sizeof(Entry) == 64, "one cache line per entry");
  static constexpr size_t kLocks = 256;

  void Lock(size_t slot) const;
  void Unlock(size_t slot) const;

  std::unique_ptr<Entry[]> entries_;
  size_t mask_ = 0;
  mutable std::unique_ptr<std::atomic<uint8_t>[]> locks_;
};

}  // namespace pdserve::tokenizer
