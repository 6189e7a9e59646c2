// Block identity for the prefix cache (docs/prefix-cache.md): the chained hash that names a
// full KV block by everything its bytes depend on.
//
// A block of B tokens at block index j holds the KV of positions [jB, (j+1)B). Those bytes are
// a function of the tokens at positions [0, (j+1)B) and of how the KV was made (the model's
// weights and config, the KV formats, the block size, the extent of the first prefill chunk,
// the parallel plan). So a block is named by a chain:
//
//   h(-1) = namespace
//   h(j)  = XXH3-64 of [ h(j-1) as 8 little-endian bytes | the block's B token ids as 4-byte
//           little-endian signed integers ]
//
// and the namespace (KvNamespace) hashes the "how it was made" part, so only blocks whose bytes
// are interchangeable can ever share a name. The hash is an index key, not the proof: the pool
// also compares the parent block and the tokens before it hands out a cached block
// (engine/prefix_cache.h), so a 64-bit collision costs a miss, never a wrong token.
// The chain itself (ChainBlockHash, ExtendChain) is defined once in common/block_hash.h, which
// the router uses too; this header adds the engine's namespace.
// Thread-safety: pure functions.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "common/block_hash.h"
#include "common/kv_layout.h"
#include "model/config.h"

namespace pdserve::engine {

// What a cache namespace is made of. Every field changes the KV bytes of some block.
struct KvNamespaceInputs {
  uint64_t model_identity = 0;     // the weights (model::WeightsFingerprint); 0: unknown, config only
  const model::ModelConfig* config = nullptr;  // REQUIRES non-null
  KvLayout layout;                 // formats (latent fp8 / BF16 / C8, index keys) and block size
  int64_t first_chunk_tokens = 0;  // prefill chunk C: positions < C are computed in the prefill form
  int cp = 1, tp = 1, ep = 1;      // the instance's parallel plan (the DP size does not matter)
};

// The namespace: XXH3-64 of a canonical text of the inputs (never 0).
uint64_t KvNamespace(const KvNamespaceInputs& in);

// h(j) from h(j - 1) and the block's tokens; the chain of a sequence (common/block_hash.h).
using ::pdserve::ChainBlockHash;
using ::pdserve::ExtendChain;

}  // namespace pdserve::engine
