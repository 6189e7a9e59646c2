// KvDescriptor: where the KV of one request goes. The decode worker builds it when it reserves
// blocks (KvReceiver::Reserve) and sends it over the control plane to every prefill rank that
// may write; a prefill rank writes only through the addresses it carries.
//
// Token t of the request lives in block_ids[t / B] at slot t % B (B = layout.tokens_per_block,
// the decode side's block size), i.e. at block_addresses[t / B] + layout.Offset(layer, c,
// t % B). `writers` says which prefill rank writes which tokens: exactly one rank per token,
// so context-parallel slices and replicated copies are both written once.
//
// Validate() is what a writer runs before its first write: every block must lie inside the
// advertised region (overflow-safe), blocks must not overlap, the writer ranges must tile
// [0, num_tokens). A bad descriptor gives kInvalidArgument and nothing is written.
//
// Thread-safety: value types.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"
#include "common/kv_layout.h"
#include "kvtransfer/memory_region.h"

namespace pdserve::kvtransfer {

// Tokens [begin, end) of a sequence.
struct TokenRange {
  uint32_t begin = 0;
  uint32_t end = 0;

  uint32_t size() const { return end > begin ? end - begin : 0; }
  bool empty() const { return end <= begin; }
  bool operator==(const TokenRange&) const = default;
};

// The tokens one prefill rank writes (sorted, disjoint ranges).
struct WriterAssignment {
  uint32_t rank = 0;
  std::vector<TokenRange> ranges;

  uint64_t num_tokens() const;
  bool operator==(const WriterAssignment&) const = default;
};

struct KvDescriptor {
  uint64_t request_id = 0;
  std::string decode_address;  // transport address of the decode worker
  KvLayout layout;             // decode-side layout
  RemoteRegionDesc region;     // all blocks are inside it
  uint32_t num_tokens = 0;
  std::vector<uint32_t> block_ids;
  std::vector<uint64_t> block_addresses;  // parallel to block_ids
  std::vector<WriterAssignment> writers;
  uint32_t transfer_timeout_ms = 0;  // from a writer's begin to the decode's ack
  int64_t lease_expiry_unix_ms = 0;  // wall clock; writers must not begin after it
  bool verify_digest = true;

  // kInvalidArgument with the first problem found (see the file comment).
  Status Validate() const;
  // The assignment of `rank`, or nullptr when that rank writes nothing.
  const WriterAssignment* FindWriter(uint32_t rank) const;
  // Number of distinct blocks holding tokens of `ranges`.
  uint32_t CountBlocks(const std::vector<TokenRange>& ranges) const;

  bool operator==(const KvDescriptor&) const = default;
};

// kInvalidArgument unless the ranges of `writers` are sorted, non-empty, disjoint, and together
// cover exactly [0, num_tokens), and no rank appears twice.
Status ValidateWriterAssignment(uint32_t num_tokens, const std::vector<WriterAssignment>& writers);

// The contiguous context-parallel slice of `rank` among `cp_size` ranks (sizes differ by at
// most one token; the last ranks may be empty for tiny sequences).
TokenRange ContiguousCpSlice(uint32_t num_tokens, uint32_t cp_size, uint32_t rank);

// Elects exactly one writer per token from what each rank holds (holdings[r] = ranges rank r
// has computed). Where several ranks hold the same tokens (replicated latent), the lowest rank
// writes them. kInvalidArgument if a token is held by nobody or a range is out of bounds.
Result<std::vector<WriterAssignment>> AssignWriters(
    uint32_t num_tokens, const std::vector<std::vector<TokenRange>>& holdings);

}  // namespace pdserve::kvtransfer
