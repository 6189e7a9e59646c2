// KvEventLog: what changed in a PrefixCache (engine/prefix_cache.h) since it was last read, for
// the cluster's index of cached blocks (docs/prefix-cache.md, "Events"). The cache reports each
// entry it registers (stored) and each it unregisters (evicted, replaced as stale, cleared);
// the log keeps only the net change per block hash, so its size is bounded by the distinct
// hashes touched, whatever the churn. A hash names at most one entry of a cache at a time, so
// its events alternate stored / removed and the last one is its state.
//
// Bounded memory: past `max_pending` distinct hashes the log drops what it holds and only
// remembers that it overflowed ("resync needed"); whoever reads it then sends the cache's whole
// set instead (PrefixCache::TakeEvents). The owner sizes it to the pool's block count: a backlog
// larger than the pool is already more than the whole set.
// Thread-safety: not thread-safe (guarded by the owning BlockPool's mutex, like PrefixCache).
#pragma once

#include <cstdint>
#include <unordered_map>
#include <vector>

namespace pdserve::engine {

// A batch of prefix-cache events. reset: `stored` is the cache's whole set, and what the
// reader knew before is to be forgotten (removed is then empty). Otherwise the net change
// since the previous batch: hashes now cached, hashes no longer cached (disjoint; a hash that
// came and went within the batch may be listed as removed although the reader never saw it).
struct KvEventBatch {
  bool reset = false;
  std::vector<uint64_t> stored;
  std::vector<uint64_t> removed;
  bool empty() const { return !reset && stored.empty() && removed.empty(); }
};

class KvEventLog {
 public:
  // REQUIRES: max_pending >= 1.
  explicit KvEventLog(int64_t max_pending) : max_pending_(max_pending) {}

  void Stored(uint64_t hash) { Note(hash, true); }
  void Removed(uint64_t hash) { Note(hash, false); }

  // The pending events were dropped: the reader needs the whole set.
  bool overflowed() const { return overflowed_; }
  // Times the log overflowed so far.
  int64_t overflows() const { return overflows_; }
  // Moves the net changes into *out (stored / removed; out->reset untouched) and clears the
  // log. REQUIRES: !overflowed() (the caller sends the whole set then, and calls Clear).
  void Take(KvEventBatch* out);
  // Forgets the pending events and the overflow (the reader is sent the whole set).
  void Clear();

 private:
  void Note(uint64_t hash, bool stored);

  const int64_t max_pending_;
  std::unordered_map<uint64_t, bool> pending_;  // hash -> cached now (the last event wins)
  bool overflowed_ = false;
  int64_t overflows_ = 0;
};

}  // namespace pdserve::engine
