// Decode-side attention kernels over the MLA latent cache and the Lightning Indexer keys.
//
// The cache stores per token: the MLA latent (in one of three formats, below), the rope key
// part as bf16, and the indexer key as fp8 (or int8) codes + one fp32 scale.
// `KvTokenView` tells the kernels where token t's fields are; a contiguous cache and a paged
// block pool (blocks of B tokens addressed through a block table, fields stored either per
// token record or per component array) are all expressible.
// Rounding points are those of the reference (docs/model-numerics.md): scores and
// probabilities are rounded to bf16 where the reference rounds them.
//
// Latent formats:
//   kFp8Blockwise  the reference's own form: e4m3 codes + one power-of-two fp32 scale per 128
//                  values. The model computes with exactly these values (lossless).
//   kBf16          the bf16 latent before the fp8 round trip (2 bytes per value, no scale).
//   kInt8PerToken  "C8": int8 codes + one fp32 scale per token (scale = amax / 127).
// Indexer key formats: kFp8 (the reference: e4m3 codes + fp32 scale from act_quant) or kInt8
// (int8 codes + fp32 scale = amax / 127). Only the fp8 forms reproduce the reference exactly.
// Thread-safety: pure functions; distinct outputs may be computed from different threads.
#pragma once

#include <cstdint>
#include <vector>

#include "common/aligned_vector.h"
#include "common/kv_layout.h"  // KvLatentFormat, KvIndexFormat (one definition for every module)

namespace pdserve::kernels {

// Bytes of one token's latent codes / latent scales for `dim` latent values.
int64_t LatentCodeBytes(KvLatentFormat f, int64_t dim);
int64_t LatentScaleBytes(KvLatentFormat f, int64_t dim);

// Where the cache fields of logical token t live: block = block_table ? block_table[t / B] :
// t / B, slot = t % B (B = block_tokens; a contiguous cache may use block_table = nullptr and
// block_tokens = capacity). Address: base + block * block_stride + field_offset + slot * field_stride.
struct KvTokenView {
  const uint8_t* base = nullptr;
  const int32_t* block_table = nullptr;
  int64_t block_tokens = 1;
  int64_t block_stride = 0;         // bytes between blocks
  int64_t latent_offset = 0, latent_stride = 0;              // codes (format-dependent)
  int64_t latent_scale_offset = 0, latent_scale_stride = 0;  // fp32 scales (none for bf16)
  int64_t kpe_offset = 0, kpe_stride = 0;                    // bf16 [dr]
  int64_t idx_k_offset = 0, idx_k_stride = 0;                // fp8 / int8 codes [ID]
  int64_t idx_scale_offset = 0, idx_scale_stride = 0;        // fp32
  int64_t latent_dim = 0, rope_dim = 0, index_dim = 0;
  KvLatentFormat latent_format = KvLatentFormat::kFp8Blockwise;
  KvIndexFormat index_format = KvIndexFormat::kFp8;

  const uint8_t* Field(int64_t t, int64_t offset, int64_t stride) const { return At(Locate(t), offset, stride); }

  // Token t's block start and slot, found once for all of its fields (Field divides by
  // block_tokens on every call).
  struct Slot {
    const uint8_t* block;
    int64_t slot;
  };
  Slot Locate(int64_t t) const {
    const int64_t block = block_table ? block_table[t / block_tokens] : t / block_tokens;
    return {base + block * block_stride, t % block_tokens};
  }
  // Token t's slot from token t - 1's (`prev`): a step within the block, a Locate (a division)
  // only at a block edge. For runs of consecutive tokens.
  Slot Next(const Slot& prev, int64_t t) const {
    return prev.slot + 1 < block_tokens ? Slot{prev.block, prev.slot + 1} : Locate(t);
  }
  const uint8_t* At(const Slot& s, int64_t offset, int64_t stride) const { return s.block + offset + s.slot * stride; }
};

// Quantize-on-write of one token's latent x[dim] (bf16 values) in format f: codes get
// LatentCodeBytes(f, dim) bytes, scales LatentScaleBytes(f, dim) bytes (may be null for bf16).
// REQUIRES: dim % 128 == 0 for kFp8Blockwise.
void EncodeLatent(KvLatentFormat f, const float* x, int64_t dim, uint8_t* codes, uint8_t* scales);
// Quantize-on-write of one indexer key x[dim]: codes[dim] + one fp32 scale.
void EncodeIndexKey(KvIndexFormat f, const float* x, int64_t dim, uint8_t* codes, uint8_t* scale);

// Decodes the latent and the rope part of tokens sel[0..n) into c_out[n, latent_dim] and
// kpe_out[n, rope_dim] (fp32 holding the exact stored values, dequantized).
void GatherLatent(const KvTokenView& kv, const int32_t* sel, int64_t n, float* c_out, float* kpe_out);

// One head of absorbed MLA attention over n gathered tokens:
//   s_j = bf16(bf16(bf16(q_lat . c_j) + bf16(q_pe . kpe_j)) * scale);  P = bf16(softmax(s))
//   o_lat = bf16(sum_j P_j c_j)
// q_lat [latent_dim] and q_pe [rope_dim] hold bf16 values. scratch holds n floats.
// REQUIRES: n >= 1.
void AbsorbedAttentionHead(const float* q_lat, const float* q_pe, const float* c, const float* kpe,
                           int64_t n, int64_t latent_dim, int64_t rope_dim, float scale,
                           float* o_lat, float* scratch);

// One head of the reference's expanded (non-absorbed) prefill attention for one query, over
// the selected keys sel[0..n) of a cache expanded per head:
//   s_j = bf16(bf16(DotF32(q, k_j, dn) + DotF32(q + dn, kpe_j, dr)) * scale);  P = bf16(softmax(s))
//   o = bf16(sum_j P_j v_j)   (one fma chain per element over the keys in order, from zero)
// where k_j = kv + sel[j] * kv_stride (dn values, then v_j's dv values) and
// kpe_j = kpe + sel[j] * dr. Bit for bit the DotF32 / Softmax / Axpy loop it replaces, but four
// keys' dot chains run side by side (one DotF32 alone waits on its fma latency) and the output
// stays in registers across the keys. scratch holds n floats. n == 0 gives o = 0.
void ExpandedAttentionHead(const float* q, const float* kv, int64_t kv_stride, const float* kpe, const int32_t* sel,
                           int64_t n, int64_t dn, int64_t dr, int64_t dv, float scale, float* o, float* scratch);

// Query absorption for several queries: out[r][:] = sum_d q_rows[r][d] * W[d][:] over
// d < n_d, for r < n_rows, with W rows of `dim` bf16 (w_bf16) or f32 values, w_ld elements
// apart. Bitwise what zero-filling out[r] and calling AxpyRow(q_rows[r][d], W[d], ...) for
// d = 0, 1, ... computes, but each W row is read once for all queries.
void AbsorbQueries(const float* const* q_rows, int64_t n_rows, const void* w, bool w_bf16, int64_t w_ld, int64_t n_d,
                   int64_t dim, float* const* out_rows);

// All heads of absorbed MLA attention for one query: for h < n_heads, exactly what
// AbsorbedAttentionHead(q_lat + h * q_lat_stride, q_pe + h * q_pe_stride, c, kpe, ...,
// o_lat + h * o_stride) computes, bit for bit, but reading each gathered token once per group
// of heads instead of once per head. scratch holds n_heads * n floats.
void AbsorbedAttentionHeads(const float* q_lat, int64_t q_lat_stride, const float* q_pe, int64_t q_pe_stride,
                            int64_t n_heads, const float* c, const float* kpe, int64_t n, int64_t latent_dim,
                            int64_t rope_dim, float scale, float* o_lat, int64_t o_stride, float* scratch);

// Staged sparse attention: the selected keys' records are copied once into a per-thread stage
// in a format the compute reads directly, instead of an fp32 copy of every key: bf16 for the
// fp8 and bf16 caches (whose values are exact in bf16: fp8 times a power of two), fp32 for C8.
// Every head then reads the stage (one key: latent_dim * 2 bytes). Buffers grow and are
// reused (no allocation in steady state).
//
// Paired layout (when latent_dim and rope_dim are multiples of 32, i.e. every real config):
// the bf16 values of each group of 32 are stored as 16 32-bit words, word d holding value
// 32c + d in its low half and value 32c + 16 + d in its high half. One shift and one mask then
// widen 32 values to fp32 in place; the plain layout needs a widening shuffle and a shift per 16
// values, and those uops share the two AVX-512 ports with the FMAs (one thread: score dots
// 116 -> 142 GFLOP/s, outputs 99 -> 175 with the transposed probabilities). Read single
// values with LatentBits / KpeBits.
// Thread-safety: one stage per thread; StageLatent may fill disjoint key ranges concurrently.
struct LatentStage {
  int64_t n = 0, latent_dim = 0, rope_dim = 0;
  bool bf16 = true;           // latent in c16 (else c32)
  bool paired = true;         // c16 and kpe in the paired layout (else plain row-major)
  // On cache lines (rows of a multiple of 32 bf16 values then start on lines too).
  AlignedVector<uint16_t> c16;  // [n, latent_dim] bf16 bits
  AlignedVector<float> c32;     // [n, latent_dim]
  AlignedVector<uint16_t> kpe;  // [n, rope_dim] bf16 bits (paired like c16)

  // Position of value i within a row of the paired layout.
  static int64_t PairedIndex(int64_t i) { return (i & ~int64_t{31}) + 2 * (i & 15) + ((i >> 4) & 1); }
  // bf16 bits of value i of key j (REQUIRES bf16 for LatentBits).
  uint16_t LatentBits(int64_t j, int64_t i) const {
    return c16[static_cast<size_t>(j * latent_dim + (paired ? PairedIndex(i) : i))];
  }
  uint16_t KpeBits(int64_t j, int64_t i) const {
    return kpe[static_cast<size_t>(j * rope_dim + (paired ? PairedIndex(i) : i))];
  }
};

// Sizes `stage` for n keys of kv's formats (sets n and the dims).
void PrepareLatentStage(const KvTokenView& kv, int64_t n, LatentStage* stage);
// Copies the records of keys sel[begin..end) into stage rows [begin, end).
// REQUIRES: PrepareLatentStage(kv, n >= end, stage) first.
void StageLatent(const KvTokenView& kv, const int32_t* sel, int64_t begin, int64_t end, LatentStage* stage);

namespace internal {
// Tests: turns the fp8 latent's byte-table staging (CPUs with AVX512-VBMI, power-of-two block
// scales in range) off or on, to compare it with the route it replaces; returns the previous
// setting. It is on by default.
bool TEST_SetStagingByteTables(bool on);
}  // namespace internal

// AbsorbedAttentionHeads over the staged keys, bit for bit (on every ISA): the same scores,
// softmax and output chains as over GatherLatent's fp32 copy of the same keys.
// scratch holds 2 * n_heads * stage.n floats. REQUIRES: stage.n >= 1.
void StagedAttentionHeads(const LatentStage& stage, const float* q_lat, int64_t q_lat_stride, const float* q_pe,
                          int64_t q_pe_stride, int64_t n_heads, float scale, float* o_lat, int64_t o_stride,
                          float* scratch);

// Lightning Indexer scores of one query over keys [key_begin, key_end), written to scores[t]:
//   score[t] = ks[t] * sum_h w[h] * relu(q8[h] . k8[t])   (sum over h in order, one fp32 fma each)
// q_decoded [n_heads, index_dim]: the query's fp8 values as doubles; every dot q8[h] . k8[t] is
// computed exactly (products and sums fit a double) and rounded once to fp32, so its value does
// not depend on the summation order. w [n_heads]: head weights already multiplied by the query
// scales and softmax scale. REQUIRES: index_dim % 4 == 0, index_dim <= 1024, n_heads <= 64.
void IndexerScores(const KvTokenView& kv, const double* q_decoded, const float* w, int64_t n_heads,
                   int64_t key_begin, int64_t key_end, float* scores);

}  // namespace pdserve::kernels
