// Decode-side attention kernels over the MLA latent cache and the Lightning Indexer keys.
//
// The cache stores per token: the latent as fp8 e4m3 codes + one power-of-two fp32 scale per
// 128 values, the rope key part as bf16, and the indexer key as fp8 codes + one fp32 scale.
// `KvTokenView` tells the kernels where token t's records are; a contiguous cache and a paged
// block pool (blocks of B tokens addressed through a block table) are both expressible.
// Rounding points are those of the reference (docs/model-numerics.md): scores and
// probabilities are rounded to bf16 where the reference rounds them.
#pragma once

#include <cstdint>

namespace pdserve::kernels {

// Where the cache records of logical token t live: block = block_table ? block_table[t / B] : 0,
// slot = t % B (B = block_tokens; a contiguous cache uses block_table = nullptr and
// block_tokens = capacity). Addresses: base + block * block_stride + field_offset + slot * field_stride.
struct KvTokenView {
  const uint8_t* base = nullptr;
  const int32_t* block_table = nullptr;
  int64_t block_tokens = 1;
  int64_t block_stride = 0;         // bytes between blocks
  int64_t latent_offset = 0, latent_stride = 0;          // fp8 codes [Lkv]
  int64_t latent_scale_offset = 0, latent_scale_stride = 0;  // fp32 [Lkv / 128]
  int64_t kpe_offset = 0, kpe_stride = 0;                // bf16 [dr]
  int64_t idx_k_offset = 0, idx_k_stride = 0;            // fp8 codes [ID]
  int64_t idx_scale_offset = 0, idx_scale_stride = 0;    // fp32
  int64_t latent_dim = 0, rope_dim = 0, index_dim = 0;

  const uint8_t* Field(int64_t t, int64_t offset, int64_t stride) const {
    const int64_t block = block_table ? block_table[t / block_tokens] : t / block_tokens;
    return base + block * block_stride + offset + (t % block_tokens) * stride;
  }
};

// Decodes the latent (codes * scale) and the rope part of tokens sel[0..n) into
// c_out[n, latent_dim] and kpe_out[n, rope_dim] (fp32 holding exact fp8/bf16 values).
void GatherLatent(const KvTokenView& kv, const int32_t* sel, int64_t n, float* c_out, float* kpe_out);

// One head of absorbed MLA attention over n gathered tokens:
//   s_j = bf16(bf16(bf16(q_lat . c_j) + bf16(q_pe . kpe_j)) * scale);  P = bf16(softmax(s))
//   o_lat = bf16(sum_j P_j c_j)
// q_lat [latent_dim] and q_pe [rope_dim] hold bf16 values. scratch holds n floats.
// REQUIRES: n >= 1.
void AbsorbedAttentionHead(const float* q_lat, const float* q_pe, const float* c, const float* kpe,
                           int64_t n, int64_t latent_dim, int64_t rope_dim, float scale,
                           float* o_lat, float* scratch);

// Lightning Indexer scores of one query over keys [0, n_keys):
//   score[t] = ks[t] * sum_h w[h] * relu(q8[h] . k8[t])
// q_decoded [n_heads, index_dim]: the query's fp8 values as doubles (so each dot is exact);
// w [n_heads]: head weights already multiplied by the query scales and softmax scale.
void IndexerScores(const KvTokenView& kv, const double* q_decoded, const float* w, int64_t n_heads,
                   int64_t n_keys, float* scores);

}  // namespace pdserve::kernels
