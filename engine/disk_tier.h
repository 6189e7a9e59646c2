// DiskTier: the prefix cache's second tier (docs/prefix-cache.md, "Disk tier"). When the
// BlockPool evicts an idle cached block to make room, it may copy the block here first; a later
// lookup that runs out of cached blocks in memory continues its walk here and reads the next
// blocks back into the pool.
//
// The tier is a directory of one file per block, bounded by max_bytes and kept in its own LRU
// order (a store that would pass the bound first deletes the least recently used files). The
// index (which block each file holds) lives in memory; the files hold the bytes, and each file
// also repeats everything the index says about it, so a load can check that the file is the
// one the index expects. The tier does not survive its process: Create deletes the block
// files an earlier tier left in the directory, the destructor deletes its own. One tier per
// directory: Create takes an exclusive lock on "<dir>/LOCK" for the tier's lifetime.
//
// Identity. A stored block is named by its chained hash (engine/block_hash.h), but, as in
// PrefixCache::Find, the hash is only the index key. Each stored block also has a uid, a
// 64-bit number this tier hands out once (NewUid) and that stands for one content: the KV of
// one exact token prefix. A block records its own uid, its parent's uid (kRootUid for the first
// block of a chain) and its tokens. Find accepts a block only as the continuation of the parent
// uid the caller has already matched, with equal tokens; by induction from the root, a found
// block holds the KV of exactly the prefix asked for, and a 64-bit collision costs a miss. The
// pool keeps each cached block's uid (PrefixCache::tier_uid): a block restored from the tier
// keeps the uid it had there, and a block whose child is stored gets one then.
//
// File "<dir>/<hash as 16 hex digits>.kvblock", every integer little-endian:
//
//   offset  size  field
//   0       8     magic "PDKVTIER"
//   8       4     format version (1)
//   12      4     header bytes (kHeaderBytes)
//   16      8     namespace (the engine's KvNamespace)
//   24      8     hash
//   32      8     uid
//   40      8     parent uid
//   48      24    KvLayout: num_layers, kv_lora_rank, qk_rope_head_dim, index_head_dim,
//                 tokens_per_block, latent_scale_group (uint32 each)
//   72      1     latent format      73  1  index format      74  6  zero
//   80      4     tokens (B)         84  4  zero
//   88      8     KV bytes (KvLayout::BlockBytes)
//   96      8     checksum: XXH3-64 of the whole file with these 8 bytes zeroed
//   104     24    zero
//   128     4*B   the block's token ids (int32)
//   ...           the block's KV bytes, as the pool holds them (KvLayout order)
//
// Writes are atomic: the file is written as "<name>.tmp" and renamed over its name, so a
// reader never sees half a file from this process. No fsync: the tier is a cache that a
// restart discards anyway. A load checks the size, every header field, the tokens and the
// checksum; a file that fails any check (or cannot be read) is logged, counted (corrupt),
// deleted and dropped from the index, and the load returns DataLoss: the caller treats the
// block as a miss and computes it.
//
// Thread-safety: not thread-safe; the owning BlockPool calls it under its mutex. I/O is
// synchronous on the caller's thread.
#pragma once

#include <cstdint>
#include <list>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "common/kv_layout.h"
#include "common/status.h"

namespace pdserve::engine {

struct DiskTierOptions {
  // The tier's own directory (created if missing); empty: no disk tier.
  std::string dir;
  // Bound on the bytes of the files it holds (header + tokens + KV per block). Larger keeps
  // more evicted prefixes at the cost of disk space; a restore costs one file read of about
  // KvLayout::BlockBytes() per block instead of the block's share of a prefill.
  int64_t max_bytes = 0;
};

struct DiskTierStats {
  int64_t blocks = 0, bytes = 0;                // held now
  int64_t stored_blocks = 0, stored_bytes = 0;  // files written so far
  int64_t restored_blocks = 0;                  // blocks loaded back and verified
  int64_t evictions = 0;                        // files the tier's LRU deleted to stay in bounds
  int64_t corrupt = 0;                          // damaged or unreadable files found (and deleted)
  int64_t write_errors = 0;                     // stores that failed (the block was not kept)
};

// What names a stored block (see "Identity" above).
struct TierBlockId {
  uint64_t hash = 0;
  uint64_t uid = 0;
  uint64_t parent_uid = 0;
  std::span<const int32_t> tokens;  // B token ids
};

class DiskTier {
 public:
  static constexpr uint64_t kRootUid = 0;  // the parent of every chain's first block
  static constexpr size_t kHeaderBytes = 128;
  static constexpr uint32_t kVersion = 1;

  // A tier for blocks of `layout` in namespace `ns`, in options.dir.
  // Errors: InvalidArgument (empty dir, max_bytes below one block file, invalid layout),
  // Internal (cannot create or list the directory), FailedPrecondition (another tier holds
  // the directory's lock).
  static Result<std::unique_ptr<DiskTier>> Create(const DiskTierOptions& options, const KvLayout& layout, uint64_t ns);
  // Deletes the tier's files and releases the lock.
  ~DiskTier();
  DiskTier(const DiskTier&) = delete;
  DiskTier& operator=(const DiskTier&) = delete;

  // A uid no block of this tier had before (never kRootUid).
  uint64_t NewUid() { return next_uid_++; }

  // Whether the tier holds `hash` as `uid`; if so it becomes the most recently used file.
  bool Touch(uint64_t hash, uint64_t uid);
  // Writes the block (REQUIRES: id.tokens.size() == B, kv holds layout.BlockBytes() bytes) and
  // indexes it as the most recently used file, deleting the least recently used files first
  // while the bound would be passed. A block already held under id.hash with another uid is
  // replaced; with the same uid nothing is written (Touch). Errors: Internal (I/O; counted in
  // write_errors, nothing is kept).
  Status Store(const TierBlockId& id, const uint8_t* kv);
  // The uid of the block stored as `hash` whose parent is `parent_uid` and whose tokens are
  // `tokens`, if held (it becomes the most recently used file).
  std::optional<uint64_t> Find(uint64_t hash, uint64_t parent_uid, std::span<const int32_t> tokens);
  // Reads the block held as (hash, uid) into kv (layout.BlockBytes() bytes) and verifies it.
  // Errors: NotFound (not held, or held under another uid now: nothing changes), DataLoss (the
  // file failed a check: logged, counted in corrupt, deleted and dropped; kv holds garbage).
  Status Load(uint64_t hash, uint64_t uid, uint8_t* kv);

  // The names held now, and whether one is (for the cluster's index: docs/prefix-cache.md
  // "Events").
  bool Holds(uint64_t hash) const { return index_.count(hash) > 0; }
  std::vector<uint64_t> Hashes() const;
  // The names whose files were deleted since the last call (LRU, damage, replacement).
  std::vector<uint64_t> TakeDropped() { return std::exchange(dropped_, {}); }
  // How many block files the bound admits.
  int64_t capacity_blocks() const { return max_bytes_ / file_bytes_; }

  DiskTierStats stats() const { return stats_; }
  uint64_t ns() const { return ns_; }
  const std::string& dir() const { return dir_; }
  int64_t max_bytes() const { return max_bytes_; }
  // The size of one block's file, and its path (for tests and logs).
  int64_t file_bytes() const { return file_bytes_; }
  std::string PathOf(uint64_t hash) const;
  static std::string FileName(uint64_t hash);

 private:
  // An owned file descriptor, closed by its destructor (move-only).
  class Fd {
   public:
    explicit Fd(int fd = -1) : fd_(fd) {}
    ~Fd();
    Fd(Fd&& other) noexcept : fd_(other.fd_) { other.fd_ = -1; }
    Fd(const Fd&) = delete;
    Fd& operator=(const Fd&) = delete;
    Fd& operator=(Fd&&) = delete;
    int get() const { return fd_; }
    bool valid() const { return fd_ >= 0; }

   private:
    int fd_;
  };
  struct Entry {
    uint64_t uid = 0, parent_uid = 0;
    std::vector<int32_t> tokens;
    std::list<uint64_t>::iterator lru;  // position in lru_
  };
  DiskTier(const DiskTierOptions& options, const KvLayout& layout, uint64_t ns, Fd lock);
  // Deletes the entry's file and index entry.
  void Drop(uint64_t hash);
  void MakeMostRecent(Entry* e);
  // The header of a block's file (checksum field zero).
  void FillHeader(const TierBlockId& id, uint8_t* header) const;
  Status WriteFile(const TierBlockId& id, const uint8_t* kv);
  Status ReadAndCheck(uint64_t hash, const Entry& e, uint8_t* kv) const;

  // Immutable after construction.
  const std::string dir_;
  const int64_t max_bytes_;
  const KvLayout layout_;
  const uint64_t ns_;
  const int64_t kv_bytes_;
  const int64_t file_bytes_;
  const Fd lock_;  // holds the flock on <dir>/LOCK until the tier is gone

  // Mutable state (guarded by the owner's mutex).
  std::unordered_map<uint64_t, Entry> index_;  // by hash
  std::list<uint64_t> lru_;                    // hashes, least recently used first
  uint64_t next_uid_ = 1;
  DiskTierStats stats_;
  std::vector<uint64_t> dropped_;  // names deleted since TakeDropped
};

}  // namespace pdserve::engine
