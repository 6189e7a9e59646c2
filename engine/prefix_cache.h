// PrefixCache: the index of a BlockPool's cached blocks (docs/prefix-cache.md) and the LRU order
// of the idle ones. The BlockPool owns it and calls it under its own mutex; the pool keeps the
// reference counts and decides when a block is idle.
//
// An entry says "block b holds the KV of the full block named `hash`, whose parent (the block
// before it in its sequence) is the entry `parent`, and whose tokens are `tokens`". Entries form
// chains from a root per namespace (Root(ns)). An entry's identity is its block id plus the
// generation of its registration (CachedBlockId): a block that is evicted and registered again
// gets a new generation, so an entry whose parent was evicted no longer matches anything (it is
// "stale") even if the parent's block id comes back with other content. Find compares the
// parent identity and the tokens, never only the hash: by induction from the root, a found
// entry holds exactly the KV of the whole token prefix the caller asked for.
//
// LRU: idle entries (no reference) are parked, oldest first; EvictOldest takes the oldest. The
// pool parks a released sequence's blocks last block first, so a sequence's tail is evicted
// before the prefix others are more likely to share.
//
// Events (engine/kv_event_log.h): every entry registered and every entry unregistered (evicted,
// replaced as stale, unregistered) is logged by its hash, for the cluster's index of cached
// blocks; TakeEvents hands them out.
// Thread-safety: not thread-safe (guarded by the owning BlockPool's mutex).
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <unordered_map>
#include <vector>

#include "engine/kv_event_log.h"

namespace pdserve::engine {

struct CachedBlockId {
  int32_t block = -1;       // -1: the root of a namespace
  uint64_t generation = 0;  // of the registration; the namespace for a root
  bool operator==(const CachedBlockId&) const = default;
};

class PrefixCache {
 public:
  explicit PrefixCache(int64_t n_blocks);

  // The parent of every chain's block 0 in namespace `ns`.
  static CachedBlockId Root(uint64_t ns) { return {-1, ns}; }

  // The entry named `hash` with this parent and these tokens, if cached (live or stale parents
  // alike: a caller walking from the root only ever passes live parents).
  std::optional<CachedBlockId> Find(uint64_t hash, CachedBlockId parent, std::span<const int32_t> tokens) const;

  // Registers `block` (REQUIRES: not registered) as `hash` under `parent` with `tokens`.
  // Returns the identity that now stands for this content:
  //   * the hash is free: `block`'s new identity;
  //   * an equal entry (same parent, same tokens) holds it: that entry (`block` stays private);
  //   * a stale entry holds it: that entry is unregistered (its block in *dropped, -1 if none;
  //     the caller frees it if it was parked) and `block` takes the name;
  //   * a live, different entry holds it (a 64-bit collision): nullopt, nothing changes.
  // `tier_uid`: the block's identity in the disk tier (DiskTier), when it was read back from
  // there; 0 otherwise.
  std::optional<CachedBlockId> Register(int32_t block, uint64_t hash, CachedBlockId parent,
                                        std::span<const int32_t> tokens, int32_t* dropped, uint64_t tier_uid = 0);

  bool registered(int32_t block) const { return entries_[static_cast<size_t>(block)].registered; }
  CachedBlockId id(int32_t block) const { return {block, entries_[static_cast<size_t>(block)].generation}; }
  bool parked(int32_t block) const { return entries_[static_cast<size_t>(block)].parked; }

  // REQUIRES: registered and not parked. Becomes the most recently used idle entry.
  void Park(int32_t block);
  // REQUIRES: parked.
  void Unpark(int32_t block);
  // The least recently parked entry's block (-1 when none is parked): EvictOldest's next victim.
  int32_t Oldest() const { return lru_head_; }
  // Unregisters the least recently parked entry and returns its block (-1 when none is parked).
  int32_t EvictOldest();
  // REQUIRES: registered and not parked. Unregisters it (it stays the caller's block).
  void Unregister(int32_t block);

  // A registered entry's name, parent and tokens, and whether its parent is gone (a stale
  // entry: nothing can reach it). REQUIRES: registered.
  uint64_t hash(int32_t block) const { return entries_[static_cast<size_t>(block)].hash; }
  CachedBlockId parent(int32_t block) const { return entries_[static_cast<size_t>(block)].parent; }
  std::span<const int32_t> tokens(int32_t block) const { return entries_[static_cast<size_t>(block)].tokens; }
  bool stale(int32_t block) const { return Stale(entries_[static_cast<size_t>(block)]); }
  // The entry's uid in the disk tier (DiskTier, "Identity"; 0: none yet). Cleared when the entry
  // is unregistered. REQUIRES: registered.
  uint64_t tier_uid(int32_t block) const { return entries_[static_cast<size_t>(block)].tier_uid; }
  void set_tier_uid(int32_t block, uint64_t uid) { entries_[static_cast<size_t>(block)].tier_uid = uid; }

  // The events since the last call: the net changes, or (reset) the hash of every registered
  // entry when `full` or when the log overflowed (kv_event_log.h).
  KvEventBatch TakeEvents(bool full);
  int64_t event_overflows() const { return events_.overflows(); }
  // Whether an entry is registered under `hash`; and events the owner logs for names it holds
  // elsewhere (BlockPool: its disk tier).
  bool holds(uint64_t hash) const { return index_.count(hash) > 0; }
  void NoteStored(uint64_t hash) { events_.Stored(hash); }
  void NoteRemoved(uint64_t hash) { events_.Removed(hash); }

  int64_t n_registered() const { return static_cast<int64_t>(index_.size()); }
  int64_t n_parked() const { return n_parked_; }
  int64_t evictions() const { return evictions_; }

 private:
  struct Entry {
    bool registered = false;
    bool parked = false;
    uint64_t hash = 0;
    uint64_t generation = 0;
    uint64_t tier_uid = 0;
    CachedBlockId parent;
    std::vector<int32_t> tokens;
    int32_t prev = -1, next = -1;  // LRU links while parked
  };
  bool Stale(const Entry& e) const;
  bool Matches(const Entry& e, CachedBlockId parent, std::span<const int32_t> tokens) const;

  std::vector<Entry> entries_;                   // by block id
  std::unordered_map<uint64_t, int32_t> index_;  // hash -> block
  int32_t lru_head_ = -1, lru_tail_ = -1;        // oldest, newest parked
  int64_t n_parked_ = 0;
  uint64_t next_generation_ = 1;
  int64_t evictions_ = 0;
  KvEventLog events_;
};

}  // namespace pdserve::engine
