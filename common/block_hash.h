// The chained hash that names a full KV block (docs/prefix-cache.md, "Block identity"), as a
// pure function of the tokens: the engine names the blocks it caches with it
// (engine/block_hash.h adds the namespace of the engine's KV formats), and the router computes
// the same names for a prompt to predict each worker's cache hit (services/router/kv_index.h).
// Both must give bitwise equal names, so there is exactly one definition, here:
//
//   h(-1) = namespace
//   h(j)  = XXH3-64 of [ h(j-1) as 8 little-endian bytes | the block's B token ids as 4-byte
//           little-endian signed integers ]
//
// Thread-safety: pure functions.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace pdserve {

// h(j) from h(j - 1) and the block's tokens.
uint64_t ChainBlockHash(uint64_t parent, std::span<const int32_t> block_tokens);

// Extends *hashes (the chain of `tokens` under `ns`, already holding hashes->size() blocks) to
// n_blocks full blocks of `block_tokens`. REQUIRES: n_blocks * block_tokens <= tokens.size().
void ExtendChain(uint64_t ns, std::span<const int32_t> tokens, int64_t block_tokens, int64_t n_blocks,
                 std::vector<uint64_t>* hashes);

}  // namespace pdserve
