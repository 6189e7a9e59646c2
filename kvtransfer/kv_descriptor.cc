#include "kvtransfer/kv_descriptor.h"

#include <algorithm>
#include <map>
#include <set>

#include <fmt/format.h>

namespace pdserve::kvtransfer {

uint64_t WriterAssignment::num_tokens() const {
  uint64_t n = 0;
  for (const TokenRange& r : ranges) n += r.size();
  return n;
}

Status ValidateWriterAssignment(uint32_t num_tokens,
                                const std::vector<WriterAssignment>& writers) {
  std::vector<TokenRange> all;
  std::set<uint32_t> ranks;
  for (const WriterAssignment& w : writers) {
    if (!ranks.insert(w.rank).second) {
      return Status::InvalidArgument(fmt::format("writer rank {} listed twice", w.rank));
    }
    uint32_t previous_end = 0;
    for (const TokenRange& r : w.ranges) {
      if (r.empty() || r.begin < previous_end) {
        return Status::InvalidArgument(fmt::format(
            "writer rank {}: ranges must be non-empty and sorted ([{}, {}))", w.rank, r.begin,
            r.end));
      }
      previous_end = r.end;
      all.push_back(r);
    }
  }
  std::sort(all.begin(), all.end(),
            [](const TokenRange& a, const TokenRange& b) { return a.begin < b.begin; });
  uint32_t next = 0;
  for (const TokenRange& r : all) {
    if (r.begin != next) {
      return Status::InvalidArgument(fmt::format(
          "writer ranges must tile [0, {}): gap or overlap at token {}", num_tokens, next));
    }
    next = r.end;
  }
  if (next != num_tokens) {
    return Status::InvalidArgument(
        fmt::format("writer ranges cover [0, {}) but the request has {} tokens", next,
                    num_tokens));
  }
  return Status::Ok();
}

Status KvDescriptor::Validate() const {
  auto bad = [&](const std::string& what) {
    return Status::InvalidArgument(fmt::format("descriptor of request {}: {}", request_id, what));
  };
  PDSERVE_RETURN_IF_ERROR(layout.Validate());
  if (num_tokens == 0) return bad("no tokens");
  if (decode_address.empty()) return bad("no decode address");
  if (block_ids.size() != block_addresses.size()) return bad("block ids/addresses differ in size");
  if (block_ids.size() != layout.BlocksForTokens(num_tokens)) {
    return bad(fmt::format("{} blocks for {} tokens of {} per block", block_ids.size(),
                           num_tokens, layout.tokens_per_block));
  }
  if (transfer_timeout_ms == 0) return bad("zero transfer timeout");
  const uint64_t block_bytes = layout.BlockBytes();
  for (size_t i = 0; i < block_addresses.size(); ++i) {
    if (!RangeWithin(block_addresses[i], block_bytes, region.base_address, region.length)) {
      return bad(fmt::format("block {} (id {}) at {:#x}+{} is outside the region {:#x}+{}", i,
                             block_ids[i], block_addresses[i], block_bytes, region.base_address,
                             region.length));
    }
  }
  std::vector<uint64_t> sorted = block_addresses;
  std::sort(sorted.begin(), sorted.end());
  for (size_t i = 1; i < sorted.size(); ++i) {
    if (sorted[i] - sorted[i - 1] < block_bytes) return bad("blocks overlap");
  }
  std::set<uint32_t> ids(block_ids.begin(), block_ids.end());
  if (ids.size() != block_ids.size()) return bad("a block id appears twice");
  Status writers_ok = ValidateWriterAssignment(num_tokens, writers);
  if (!writers_ok.ok()) return writers_ok.WithContext(fmt::format("request {}", request_id));
  return Status::Ok();
}

const WriterAssignment* KvDescriptor::FindWriter(uint32_t rank) const {
  for (const WriterAssignment& w : writers) {
    if (w.rank == rank) return &w;
  }
  return nullptr;
}

uint32_t KvDescriptor::CountBlocks(const std::vector<TokenRange>& ranges) const {
  const uint32_t b = layout.tokens_per_block;
  uint32_t count = 0;
  int64_t last_block = -1;
  for (const TokenRange& r : ranges) {
    if (r.empty()) continue;
    const int64_t first = r.begin / b;
    const int64_t last = (r.end - 1) / b;
    count += static_cast<uint32_t>(last - std::max(first, last_block + 1) + 1);
    last_block = std::max(last_block, last);
  }
  return count;
}

TokenRange ContiguousCpSlice(uint32_t num_tokens, uint32_t cp_size, uint32_t rank) {
  const uint64_t n = num_tokens;
  return TokenRange{static_cast<uint32_t>(n * rank / cp_size),
                    static_cast<uint32_t>(n * (rank + 1) / cp_size)};
}

Result<std::vector<WriterAssignment>> AssignWriters(
    uint32_t num_tokens, const std::vector<std::vector<TokenRange>>& holdings) {
  std::set<uint32_t> cuts = {0, num_tokens};
  for (size_t rank = 0; rank < holdings.size(); ++rank) {
    for (const TokenRange& r : holdings[rank]) {
      if (r.empty()) continue;
      if (r.end > num_tokens) {
        return Status::InvalidArgument(fmt::format(
            "rank {} holds [{}, {}) beyond the {} tokens of the request", rank, r.begin, r.end,
            num_tokens));
      }
      cuts.insert(r.begin);
      cuts.insert(r.end);
    }
  }
  std::map<uint32_t, WriterAssignment> by_rank;
  for (auto it = cuts.begin(); std::next(it) != cuts.end(); ++it) {
    const TokenRange piece{*it, *std::next(it)};
    int64_t writer = -1;
    for (size_t rank = 0; rank < holdings.size() && writer < 0; ++rank) {
      for (const TokenRange& r : holdings[rank]) {
        if (r.begin <= piece.begin && piece.end <= r.end) {
          writer = static_cast<int64_t>(rank);
          break;
        }
      }
    }
    if (writer < 0) {
      return Status::InvalidArgument(
          fmt::format("tokens [{}, {}) are held by no prefill rank", piece.begin, piece.end));
    }
    WriterAssignment& w = by_rank[static_cast<uint32_t>(writer)];
    w.rank = static_cast<uint32_t>(writer);
    if (!w.ranges.empty() && w.ranges.back().end == piece.begin) {
      w.ranges.back().end = piece.end;
    } else {
      w.ranges.push_back(piece);
    }
  }
  std::vector<WriterAssignment> out;
  for (auto& [rank, w] : by_rank) out.push_back(std::move(w));
  return out;
}

}  // namespace pdserve::kvtransfer
