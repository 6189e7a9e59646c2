// Test and benchmark helpers (library pdserve_kvtransfer_testing, never linked into servers):
// deterministic KV contents and a prefill-side KV cache built from them.
//
// PatternBytes gives every (seed, request, layer, component, token) its own pseudo-random
// bytes, so both processes of a transfer test can compute what the decode blocks must hold
// without exchanging data, and any misplaced, torn or missing byte is caught.
//
// Thread-safety: PatternBytes and CheckDestination are pure; a SourceCache is used by one
// thread at a time (KvSender only reads it).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"
#include "kvtransfer/kv_descriptor.h"
#include "common/kv_layout.h"
#include "kvtransfer/transfer_plan.h"

namespace pdserve::kvtransfer::testing {

// Fills out[0, n) with the pattern of one token's component.
void PatternBytes(uint64_t seed, uint64_t request_id, uint32_t layer, KvComponent component,
                  uint32_t token, uint8_t* out, uint64_t n);

// A prefill rank's KV: one run per held range, in `layout` blocks (its own block size),
// filled with the pattern. The memory is one contiguous allocation (blocks in order) so that
// it can be registered with a transport in one piece.
class SourceCache {
 public:
  SourceCache(const KvLayout& layout, std::vector<TokenRange> held, uint64_t seed,
              uint64_t request_id, bool fill = true);
  const KvSource& source() const { return source_; }
  uint8_t* data() const { return storage_.get(); }
  uint64_t size() const { return size_; }

 private:
  KvSource source_;
  std::unique_ptr<uint8_t[]> storage_;
  uint64_t size_ = 0;
};

// kDataLoss naming the first byte of `ranges` (all layers) in the decode blocks of `d` that
// differs from the pattern. `region_data` is the local mapping of d.region.base_address.
Status CheckDestination(const KvDescriptor& d, const uint8_t* region_data,
                        const std::vector<TokenRange>& ranges, uint64_t seed);

}  // namespace pdserve::kvtransfer::testing
