// BlockPool: the paged KV memory of one worker, and BlockTable: one sequence's blocks in it.
//
// The pool is one contiguous, 4 KiB-aligned region of n_blocks blocks laid out as
// KvLayout describes ([block][layer slab][component][token]; every layer's slice of a
// block is contiguous), sized from a memory budget. The region is either owned (allocated
// here) or provided by the caller, so the KV transfer layer can register base()..size_bytes()
// as one memory region and address block b at base() + b * block_bytes().
// Blocks are handed out lowest id first from a free list (fresh pools give adjacent blocks);
// allocation is all-or-nothing.
// Sharing (the prefix cache, engine/prefix_cache.h, docs/prefix-cache.md): blocks are
// refcounted. Allocate gives a block one reference, MatchPrefix takes one more on each cached
// block it hands out, Free drops one. A block whose count reaches zero goes back to the free
// list, unless it is registered in the cache: then it stays resident, idle, in LRU order, and
// Allocate evicts the least recently used idle blocks only when the free list runs short. A
// block with a reference is never evicted. A shared block is read-only by contract: every
// holder only reads positions it did not compute (its cached prefix).
// Disk tier (engine/disk_tier.h, optional): an idle cached block that Allocate evicts is first
// copied to the tier (synchronously, under the pool's lock), and MatchPrefix, when its walk
// through the blocks in memory ends, continues it in the tier: each next block found there is
// read into a block taken as Allocate would take it, checked, registered as a cached block and
// handed out like one found in memory. A block the tier cannot give back intact ends the walk.
// Thread-safety: every method is safe from any thread (one mutex); the bytes of a block are
// written only by the holder that allocated it, before it is registered.
// Errors: Create: InvalidArgument (bad layout, budget below one block, misaligned external
// memory); Allocate: ResourceExhausted when fewer than `count` blocks are free or idle.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <vector>

#include "common/status.h"
#include "engine/disk_tier.h"
#include "engine/prefix_cache.h"
#include "model/kv_layout.h"

namespace pdserve::engine {

class BlockPool {
 public:
  static constexpr int64_t kAlignment = 4096;

  // A pool of floor(budget_bytes / layout.BlockBytes()) blocks in owned memory.
  static Result<std::unique_ptr<BlockPool>> Create(const KvLayout& layout, int64_t budget_bytes);
  // A pool over caller memory [memory, memory + bytes) (kept alive by the caller).
  // REQUIRES: memory aligned to kAlignment.
  static Result<std::unique_ptr<BlockPool>> CreateOver(const KvLayout& layout, uint8_t* memory, int64_t bytes);
  ~BlockPool();
  BlockPool(const BlockPool&) = delete;
  BlockPool& operator=(const BlockPool&) = delete;

  const KvLayout& layout() const { return layout_; }
  uint8_t* base() const { return base_; }
  int64_t size_bytes() const { return n_blocks_ * block_bytes(); }
  int64_t block_bytes() const { return static_cast<int64_t>(layout_.BlockBytes()); }
  int64_t n_blocks() const { return n_blocks_; }
  int64_t capacity_tokens() const { return n_blocks_ * layout_.tokens_per_block; }
  // Blocks Allocate can hand out: never used or freed, plus cached idle ones (evictable).
  int64_t n_free() const;
  int64_t n_used() const { return n_blocks_ - n_free(); }
  // Blocks registered in the prefix cache (idle or in use), and the idle ones among them.
  int64_t n_cached() const;
  int64_t n_cached_idle() const;
  // Cached blocks evicted to make room so far.
  int64_t evictions() const;

  // Appends `count` block ids to *out (all or nothing), each with one reference: free blocks
  // first, then idle cached blocks, least recently used first (evicting them from the cache).
  Status Allocate(int64_t count, std::vector<int32_t>* out);
  // Drops one reference of each id. The ids are taken as a sequence's blocks in order: the
  // last one is released first, so among blocks that become idle together a sequence's tail
  // is evicted before its prefix. REQUIRES: every id has a reference (a double free aborts:
  // it is a bug).
  void Free(std::span<const int32_t> ids);

  // Prefix cache. Walks the chain of `hashes` (block j's tokens are tokens[j*B, (j+1)*B)) from
  // `root` (PrefixCache::Root of the caller's namespace) for at most max_blocks blocks: each
  // block cached with that hash, the previous block as parent and those tokens gets one more
  // reference and is appended to *out; the walk stops at the first miss. Returns the number
  // appended. With a disk tier, the walk continues there (see above), unless the blocks found
  // in memory and on disk together stay below `min_blocks` (a hit the caller would not take:
  // nothing is read from disk then). REQUIRES: hashes.size() >= max_blocks, tokens cover
  // max_blocks blocks.
  int64_t MatchPrefix(CachedBlockId root, std::span<const uint64_t> hashes, std::span<const int32_t> tokens,
                      int64_t max_blocks, std::vector<CachedBlockId>* out, int64_t min_blocks = 0);
  // Registers `block` (the caller holds a reference and its KV is final) as the full block
  // `hash` after `parent` with `block_tokens`. Returns the identity that now stands for this
  // content (the block's own, or an equal block's cached earlier), or nullopt when the name is
  // taken by other content (the caller's chain ends there). See PrefixCache::Register.
  // REQUIRES: block_tokens.size() == B.
  std::optional<CachedBlockId> Register(int32_t block, uint64_t hash, CachedBlockId parent,
                                        std::span<const int32_t> block_tokens);
  // Evicts every idle cached block (blocks in use stay cached; nothing is copied to the disk
  // tier, which keeps what it holds). Returns how many.
  int64_t EvictIdle();

  // From now on, evicted blocks spill to `tier` and lookups continue in it (see above).
  // REQUIRES: tier built for this pool's layout; no tier attached yet.
  void AttachDiskTier(std::unique_ptr<DiskTier> tier);
  bool has_disk_tier() const;
  // The tier's counters (all 0 without one).
  DiskTierStats disk_tier_stats() const;
  // The prefix cache's events since the last call (PrefixCache::TakeEvents): the hashes
  // registered and unregistered, or with `full` (or after the bounded backlog overflowed) the
  // whole set with reset. With a disk tier a name counts as held while memory or the tier has
  // it (SyncTierEventsLocked), and the whole set includes the tier's names.
  KvEventBatch TakeKvEvents(bool full);
  // Times the event backlog overflowed (and a whole set was sent instead).
  int64_t kv_event_overflows() const;
  // Block files the disk tier's bound admits (0 without a tier): with the pool's blocks, the
  // most names the events can claim held.
  int64_t disk_tier_capacity_blocks() const;
  // With `on`, every block the disk tier restores is recorded, before it joins the cache, until
  // TakeRestoredBlocks: a multi-rank engine sends those blocks' bytes to its followers, whose
  // pools never read the tier. Off by default (nothing is recorded).
  void RecordRestoredBlocks(bool on);
  std::vector<int32_t> TakeRestoredBlocks();

 private:
  BlockPool(const KvLayout& layout, uint8_t* base, int64_t n_blocks, bool owned);
  // One block for the caller (one reference): a free one, else the least recently used idle
  // cached block, spilled to the disk tier first. -1 when neither exists. REQUIRES: mu_ held.
  int32_t TakeOneLocked();
  // Copies idle cached `block` to the disk tier (unless stale or already there). REQUIRES: mu_.
  void SpillLocked(int32_t block);
  // Events for the disk tier (docs/prefix-cache.md "Events"): names evicted from memory that
  // the tier holds stay stored; names whose files the tier deleted, held nowhere now, are
  // removed. REQUIRES: mu_, a tier.
  void SyncTierEventsLocked(std::span<const uint64_t> evicted_from_memory);
  // The tier uid of cached `block`, handing it one if it has none. REQUIRES: mu_, a tier.
  uint64_t TierUidLocked(int32_t block);
  // MatchPrefix's walk in the disk tier from hashes[n] on, after `parent`; returns the blocks
  // restored (appended to *out with one reference each), none when n plus the blocks the tier
  // holds stay below min_blocks. REQUIRES: mu_, a tier.
  int64_t RestoreLocked(CachedBlockId parent, std::span<const uint64_t> hashes, std::span<const int32_t> tokens,
                        int64_t n, int64_t max_blocks, int64_t min_blocks, std::vector<CachedBlockId>* out);

  const KvLayout layout_;
  uint8_t* const base_;
  const int64_t n_blocks_;
  const bool owned_;
  mutable std::mutex mu_;
  // Guarded by mu_.
  std::vector<int32_t> free_;  // stack: back() is handed out next
  std::vector<int32_t> refs_;  // per block id
  PrefixCache cache_;
  std::unique_ptr<DiskTier> tier_;  // null: no disk tier
  bool record_restores_ = false;
  std::vector<int32_t> restored_;  // RecordRestoredBlocks: restored since TakeRestoredBlocks
};

// The blocks of one sequence, in logical order: token t lives in block ids()[t / B], slot t % B.
// Thread-safety: not thread-safe (owned by one request, touched by the engine's step thread).
class BlockTable {
 public:
  const std::vector<int32_t>& ids() const { return ids_; }
  int64_t n_blocks() const { return static_cast<int64_t>(ids_.size()); }
  int64_t capacity_tokens(const KvLayout& l) const { return n_blocks() * l.tokens_per_block; }
  // Grows the table so it holds n_tokens. Errors: ResourceExhausted (table unchanged).
  Status EnsureCapacity(BlockPool* pool, int64_t n_tokens);
  // Returns every block to the pool.
  void Release(BlockPool* pool);
  // The forward pass's view of this sequence.
  model::KvSequenceRef Ref(const BlockPool& pool) const;
  // Adopts ids allocated elsewhere (KV import) or matched in the prefix cache, with their
  // references. REQUIRES: the table is empty.
  void Adopt(std::vector<int32_t> ids);

 private:
  std::vector<int32_t> ids_;
};

}  // namespace pdserve::engine
