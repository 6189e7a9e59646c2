#include "common/block_hash.h"

#include <xxhash.h>

#include "common/check.h"

namespace pdserve {

namespace {

void PutLe64(uint64_t v, uint8_t* out) {
  for (int i = 0; i < 8; ++i) out[i] = static_cast<uint8_t>(v >> (8 * i));
}

}  // namespace

uint64_t ChainBlockHash(uint64_t parent, std::span<const int32_t> block_tokens) {
  // A small fixed buffer covers the usual block sizes; larger blocks stream.
  constexpr size_t kInline = 256;
  if (block_tokens.size() <= kInline) {
    uint8_t buf[8 + 4 * kInline];
    PutLe64(parent, buf);
    uint8_t* p = buf + 8;
    for (int32_t t : block_tokens) {
      const auto u = static_cast<uint32_t>(t);
      for (int i = 0; i < 4; ++i) *p++ = static_cast<uint8_t>(u >> (8 * i));
    }
    return XXH3_64bits(buf, static_cast<size_t>(p - buf));
  }
  XXH3_state_t* st = XXH3_createState();
  PDSERVE_CHECK(st != nullptr, "XXH3_createState");
  XXH3_64bits_reset(st);
  uint8_t head[8];
  PutLe64(parent, head);
  XXH3_64bits_update(st, head, sizeof(head));
  for (int32_t t : block_tokens) {
    const auto u = static_cast<uint32_t>(t);
    const uint8_t le[4] = {static_cast<uint8_t>(u), static_cast<uint8_t>(u >> 8), static_cast<uint8_t>(u >> 16),
                           static_cast<uint8_t>(u >> 24)};
    XXH3_64bits_update(st, le, sizeof(le));
  }
  const uint64_t h = XXH3_64bits_digest(st);
  XXH3_freeState(st);
  return h;
}

void ExtendChain(uint64_t ns, std::span<const int32_t> tokens, int64_t block_tokens, int64_t n_blocks,
                 std::vector<uint64_t>* hashes) {
  PDSERVE_CHECK(n_blocks * block_tokens <= static_cast<int64_t>(tokens.size()), "chain past the tokens");
  for (auto j = static_cast<int64_t>(hashes->size()); j < n_blocks; ++j) {
    const uint64_t parent = j == 0 ? ns : (*hashes)[static_cast<size_t>(j - 1)];
    hashes->push_back(ChainBlockHash(parent, tokens.subspan(static_cast<size_t>(j * block_tokens),
                                                            static_cast<size_t>(block_tokens))));
  }
}

}  // namespace pdserve
