// Token bitmasks applied to logits: the step between a matcher's mask and the sampler.
//
// A mask has one bit per token id (bit i of word i / 32), words = ceil(vocab / 32). Applying it
// sets every logit whose bit is clear to -inf and leaves the others untouched, so softmax,
// top-k/top-p and greedy argmax see only allowed tokens. Rows of a batch that have no
// constraint are never read or written (ApplyTokenBitmaskRows takes the constrained rows).
//
// ApplyTokenBitmask uses AVX2 with a scalar tail; ApplyTokenBitmaskScalar is the reference
// it is tested against. Whole-word fast paths: an all-ones word writes nothing, an all-zero
// word writes 32 -inf without reading the logits.
//
// Thread-safety: pure functions over the caller's buffers.
#pragma once

#include <cstdint>
#include <span>

namespace pdserve::grammar {

inline bool MaskAllows(const uint32_t* mask, int32_t id) { return (mask[id >> 5] >> (id & 31)) & 1u; }
inline void MaskSet(uint32_t* mask, int32_t id) { mask[id >> 5] |= 1u << (id & 31); }
inline int64_t MaskWords(int64_t vocab) { return (vocab + 31) / 32; }

// Allowed ids in [0, vocab).
int64_t CountAllowed(const uint32_t* mask, int64_t vocab);

// logits[i] = -inf where the bit of i is clear, for i in [0, vocab).
// REQUIRES: mask has MaskWords(vocab) words.
void ApplyTokenBitmask(float* logits, int64_t vocab, const uint32_t* mask);
void ApplyTokenBitmaskScalar(float* logits, int64_t vocab, const uint32_t* mask);

// For each k, masks row rows[k] of `logits` (at logits + rows[k] * logits_stride) with the
// mask at masks + k * mask_stride_words. Other rows are untouched.
void ApplyTokenBitmaskRows(float* logits, int64_t logits_stride, int64_t vocab, const uint32_t* masks,
                           int64_t mask_stride_words, std::span<const int32_t> rows);

}  // namespace pdserve::grammar
