// Lightning Indexer selection at fp32 speed with the exact scores' top-k.
//
// The exact score of key t for one query (kernels/mla_attention.h, IndexerScores):
//   score[t] = fl(acc * ks[t]),  acc = fma chain over heads h of max(D_h, 0) * w[h],
//   D_h = fl32(q8[h] . k8[t])   (the dot computed exactly, rounded once)
// is order-independent, which is what keeps the selections equal to the reference's; computing
// it exactly costs double precision for every key. The selection below needs it only for keys
// near the cut:
//   1. IndexerScoresApprox: every dot in plain fp32 (products of fp8 values are exact in fp32;
//      only the sums round), plus a certified bound per key: |approx[t] - score[t]| <= bound[t].
//      The bound comes from the fp32 summation error (n u sum|q_i k_i|, with sum|q_i k_i| <=
//      ||q||_1 max|k_i|), the rounding of D_h, relu being 1-Lipschitz and the two fma chains'
//      own roundings (see indexer.cc for the derivation); it is about 1e-4 of the score's scale.
//      On CPUs with AVX512-VNNI and VBMI, fp8 keys take a coarse pass instead: every fp8 value
//      rounded to int16 (value * 2^3 at dim 128: exact from 1 up), the dots as exact int32 sums
//      of int16 pair products (twice the multiply-adds per instruction of fp32 FMAs), and a
//      bound that adds the rounding's effect, per key from its count of small values (indexer.cc).
//   2. IndexerTopK: with T / T' the k-th / (k+1)-th largest approximation and B the largest
//      bound, a key whose interval lies above T' + B is certainly selected, one below T - B
//      certainly not; only the keys in between are scored exactly, and the rest of the k
//      places go to the best of them (ties to the lower index). After the coarse pass, more
//      than a few keys in between first take the fp32 pass and the same step again. The result
//      equals TopKIndices over the exact scores, bit for bit, whatever the data (ties, zero keys).
// Thread-safety: pure functions; distinct outputs may be computed from different threads.
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/mla_attention.h"

namespace pdserve::kernels {

// One indexer query (one row of one layer), decoded once for scoring any number of keys.
struct IndexerQuery {
  int64_t n_heads = 0, dim = 0;
  std::vector<float> q;      // [n_heads * dim]: the fp8 values (exact)
  std::vector<double> qd;    // the same as doubles (exact scoring)
  std::vector<float> w;      // [n_heads]: head weights (query scale and softmax scale folded in)
  std::vector<float> l1;     // [n_heads]: an upper bound of ||q[h]||_1 = sum_i |q[h][i]|
  // The coarse pass's form (indexer.cc; empty where it does not apply): the values times 2^s
  // rounded to int16, two per int32 in the keys' pair order, and per head the two factors of
  // its error bound E_h (each times 1 + u, with room for E_h's own roundings).
  std::vector<int32_t> qp;             // [n_heads * dim / 2]
  std::vector<float> coarse_off;       // [n_heads]: ||q[h] - its rounded values||_1
  std::vector<float> coarse_half_max;  // [n_heads]: max_i |q[h][i]| * 2^-(s+1)
};

// Decodes q8 [n_heads, dim] (e4m3 codes) and copies w [n_heads].
// REQUIRES: dim % 16 == 0, dim <= 1024, n_heads <= 64.
void PrepareIndexerQuery(const uint8_t* q8, const float* w, int64_t n_heads, int64_t dim, IndexerQuery* q);

// Approximate scores of keys [key_begin, key_end) with certified bounds (above), written to
// approx[t - key_begin] and bound[t - key_begin]. Either key format.
void IndexerScoresApprox(const KvTokenView& kv, const IndexerQuery& q, int64_t key_begin, int64_t key_end,
                         float* approx, float* bound);

// IndexerScoresApprox of several queries over the same keys [key_begin, key_end) of one cache
// (a prefill's rows of one sequence): query r's values go to approx[r][t - key_begin] and
// bound[r][t - key_begin], bit for bit what IndexerScoresApprox(kv, *queries[r], key_begin,
// key_end, approx[r], bound[r]) writes, but each block of keys is decoded once for all queries
// (at 16 heads x 128 dims the decoding is ~40% of one query's work).
void IndexerScoresApproxRows(const KvTokenView& kv, const IndexerQuery* const* queries, int64_t n_queries,
                             int64_t key_begin, int64_t key_end, float* const* approx, float* const* bound);

// The exact scores of keys sel[0..n) (IndexerScores' values), written to scores[0..n).
void IndexerScoresExactAt(const KvTokenView& kv, const IndexerQuery& q, const int32_t* sel, int64_t n, float* scores);

// The k keys of [0, n) with the largest exact scores, ties to the lower index, ascending in
// out[0..min(k, n)) (what TopKIndices over the exact scores returns), from approx / bound of
// every key. Returns the number written; *n_exact (may be null) receives how many keys were
// scored exactly.
int64_t IndexerTopK(const KvTokenView& kv, const IndexerQuery& q, const float* approx, const float* bound, int64_t n,
                    int64_t k, int32_t* out, int64_t* n_exact = nullptr);

namespace internal {
// Tests: turns the fp8 keys' byte-table decode (CPUs with AVX512-VBMI) off or on, to compare it
// with the route it replaces; returns the previous setting. It is on by default.
bool TEST_SetIndexerByteLut(bool on);
// Tests and benchmarks: turns the coarse pass (int16 dots on CPUs with AVX512-VNNI and VBMI, fp8
// keys: 2x the fp32 pass's multiply-adds per instruction) off or on; returns the previous
// setting. It is on by default.
bool TEST_SetIndexerCoarse(bool on);
// Whether the coarse pass can run here (the CPU and the active kernel level allow it).
bool IndexerCoarseAvailable();

// The k-th and (k + 1)-th largest of v[0..n) (values as nth_element over a copy with
// std::greater finds them; +0 and -0 count as equal). IndexerTopK's thresholds, exposed for
// tests. REQUIRES: 1 <= k < n, no NaN.
struct KthLargestPair {
  float kth = 0.0f, next = 0.0f;
};
KthLargestPair KthAndNextLargest(const float* v, int64_t n, int64_t k);
}  // namespace internal

}  // namespace pdserve::kernels
