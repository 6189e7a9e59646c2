#include "kernels/indexer.h"

#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <type_traits>
#include <vector>

#include "common/check.h"
#include "common/dtype.h"
#include "kernels/fp8_quant.h"
#include "kernels/isa.h"
#include "kernels/kernel_table.h"

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq")
#include "kernels/avx512_transpose.h"  // its one inline function, compiled for AVX-512
#pragma GCC pop_options

// GCC 12 flags the deliberately undefined upper lanes inside its own AVX-512 intrinsics
// (_mm512_undefined_*) as (maybe-)uninitialized.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"

namespace pdserve::kernels {

namespace internal {
std::atomic<bool> indexer_byte_lut{true};
bool TEST_SetIndexerByteLut(bool on) { return indexer_byte_lut.exchange(on); }
std::atomic<bool> indexer_coarse{true};
bool TEST_SetIndexerCoarse(bool on) { return indexer_coarse.exchange(on); }

namespace {
// The float's bits mapped so that unsigned order is numeric order (-0 just below +0).
inline uint32_t OrderKey(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}
}  // namespace

// A radix step first: a histogram of each value's top 11 order-key bits (sign, exponent, two
// significand bits: bins ~19% wide) finds the bin holding rank k and, when that bin ends at
// rank k, the next non-empty bin below (rank k + 1); nth_element then runs over those bins'
// values alone. Every value outside them is strictly above or below both ranks, so the result
// is nth_element's over all n. Four histograms break the store-to-load chains of runs of equal
// bins. 8192 approximations: a few hundred candidates instead of 8192.
KthLargestPair KthAndNextLargest(const float* v, int64_t n, int64_t k) {
  PDSERVE_DCHECK(k >= 1 && k < n);
  constexpr int kShift = 21, kBins = 1 << (32 - kShift);
  thread_local std::vector<uint32_t> hist;
  hist.assign(4 * kBins, 0);
  uint32_t* h0 = hist.data();
  int64_t i = 0;
  for (; i + 4 <= n; i += 4) {
    ++h0[OrderKey(v[i]) >> kShift];
    ++h0[kBins + (OrderKey(v[i + 1]) >> kShift)];
    ++h0[2 * kBins + (OrderKey(v[i + 2]) >> kShift)];
    ++h0[3 * kBins + (OrderKey(v[i + 3]) >> kShift)];
  }
  for (; i < n; ++i) ++h0[OrderKey(v[i]) >> kShift];
  auto count = [&](int b) -> int64_t { return int64_t{h0[b]} + h0[kBins + b] + h0[2 * kBins + b] + h0[3 * kBins + b]; };
  int64_t above = 0;  // values in bins above b
  int b = kBins - 1;
  while (above + count(b) < k) above += count(b--);
  const uint32_t hi_bin = static_cast<uint32_t>(b);
  uint32_t lo_bin = hi_bin;
  if (above + count(b) == k) {  // rank k + 1 is the largest value of the next non-empty bin (k < n)
    int c = b - 1;
    while (count(c) == 0) --c;
    lo_bin = static_cast<uint32_t>(c);
  }
  thread_local std::vector<float> cand;
  cand.clear();
  for (int64_t t = 0; t < n; ++t) {
    const uint32_t bin = OrderKey(v[t]) >> kShift;
    if (bin <= hi_bin && bin >= lo_bin) cand.push_back(v[t]);
  }
  const int64_t r = k - above;  // rank k among the candidates
  std::nth_element(cand.begin(), cand.begin() + (r - 1), cand.end(), std::greater<float>());
  return {cand[static_cast<size_t>(r - 1)], *std::max_element(cand.begin() + r, cand.end())};
}
}  // namespace internal

// The bound (per key; u = 2^-24, n = dim, H = n_heads):
//   a_h   approximate dot: fp32 sums of exact products, any order: |a_h - d_h| <= E_h with
//         E_h = gamma_n * sum_i |q_hi k_i| <= gamma_n ||q_h||_1 max_i |k_i|,  gamma_n = n u / (1 - n u)
//         (about twice the Cauchy-Schwarz bound ||q_h||_2 ||k||_2 on typical keys, at most
//         sqrt(n) times it; the key's largest magnitude is one byte max over its codes, where
//         its 2-norm took a chain of n FMAs: a third of the key decode)
//   D_h   = fl32(d_h): |D_h - d_h| <= u |d_h| <= u (|a_h| + E_h), so with r = max(., 0)
//         |r(D_h) - r(a_h)| <= delta_h = E_h (1 + u) + u |a_h|, and delta_h = 0 when
//         a_h + E_h <= 0 (then d_h <= 0, so both relus are 0)
//   acc   exact fma chain over r(D_h) w_h, acc' any fp32 evaluation of sum r(a_h) w_h: each is
//         within 1.01 H u M of its real sum (M = sum |w_h| r(.)), and M <= M' + S with
//         S = sum |w_h| delta_h, so |acc - acc'| <= S (1 + 1.01 H u) + 2.02 H u M'
//   score = fl(acc ks): |score - score'| <= |ks| (|acc - acc'| (1 + u) + 2 u |acc'|)
// The bound adds 2% to that for its own fp32 evaluation (a few dozen roundings of 2^-24 each).
// A bound of 0 means the approximation is the exact score (every head's relu is certainly 0).
namespace {

constexpr float kU = 0x1p-24f;
constexpr float kNormSlack = 1.0f + 1e-5f;  // a double 1-norm rounded to fp32, rounded up

#if defined(__AVX2__)
inline float HSum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
  return _mm_cvtss_f32(s);
}
#endif

// The weighted sums over heads of one key: acc' = sum w r(a), M' = sum |w| r(a), S = sum |w| delta.
struct KeyTerms {
  float acc = 0.0f, m = 0.0f, s = 0.0f;
};

// g[h] = (1 + u) gamma_n ||q_h||_1: E_h (1 + u) = g[h] * kn, kn = max_i |k_i|.
// a[h] holds the dot times `a_mul`; the sums use a[h] / a_mul (exact: a power of two).
KeyTerms HeadTerms(const float* a, float a_mul, const float* w, const float* g, float kn, int64_t n_heads) {
  KeyTerms t;
  int64_t h = 0;
#if defined(__AVX2__)
  const __m256 sign = _mm256_set1_ps(-0.0f), zero = _mm256_setzero_ps(), u = _mm256_set1_ps(kU);
  const __m256 back = _mm256_set1_ps(1.0f / a_mul), knv = _mm256_set1_ps(kn);
  __m256 acc = zero, m = zero, sd = zero;
  for (; h + 8 <= n_heads; h += 8) {
    const __m256 av = _mm256_mul_ps(_mm256_loadu_ps(a + h), back), wv = _mm256_loadu_ps(w + h);
    const __m256 wa = _mm256_andnot_ps(sign, wv), e = _mm256_mul_ps(_mm256_loadu_ps(g + h), knv);
    const __m256 r = _mm256_max_ps(av, zero);
    const __m256 live = _mm256_cmp_ps(_mm256_add_ps(av, e), zero, _CMP_GT_OQ);
    const __m256 delta = _mm256_and_ps(live, _mm256_fmadd_ps(u, _mm256_andnot_ps(sign, av), e));
    acc = _mm256_fmadd_ps(r, wv, acc);
    m = _mm256_fmadd_ps(r, wa, m);
    sd = _mm256_fmadd_ps(delta, wa, sd);
  }
  t.acc = HSum(acc);
  t.m = HSum(m);
  t.s = HSum(sd);
#endif
  for (; h < n_heads; ++h) {
    const float av = a[h] / a_mul;
    const float e = g[h] * kn, r = std::max(av, 0.0f), wa = std::fabs(w[h]);
    const float delta = av + e <= 0.0f ? 0.0f : e + kU * std::fabs(av);
    t.acc += r * w[h];
    t.m += r * wa;
    t.s += delta * wa;
  }
  return t;
}

inline void Finish(const KeyTerms& t, float h_u, float ks, float* approx, float* bound) {
  const float diff = t.s * (1.0f + 1.01f * h_u) + 2.02f * h_u * t.m;
  *approx = t.acc * ks;
  *bound = 1.02f * std::fabs(ks) * (diff * (1.0f + kU) + 2.0f * kU * std::fabs(t.acc));
}

float LoadF32(const uint8_t* p) {
  float v;
  std::memcpy(&v, p, 4);
  return v;
}

// Per-query constants of the bound: g[h] (above) and H u.
struct QueryConsts {
  float g[64];
  float h_u;
};
QueryConsts Consts(const IndexerQuery& q) {
  QueryConsts c;
  const double n = static_cast<double>(q.dim);
  const double gamma = n * kU / (1.0 - n * kU) * 1.01;
  for (int64_t h = 0; h < q.n_heads; ++h) c.g[h] = static_cast<float>(gamma * (1.0 + kU) * 1.0001 * q.l1[h]);
  c.h_u = static_cast<float>(static_cast<double>(q.n_heads) * kU);
  return c;
}

#if defined(__AVX2__)
// 16 e4m3 codes -> values / 256 (see mla_attention.cc: exact for every code the quantizers write).
inline void Fp8x16Div256(const uint8_t* codes, __m256* lo, __m256* hi) {
  const __m256i x = _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(codes)));
  const __m256i h = _mm256_or_si256(_mm256_slli_epi16(_mm256_and_si256(x, _mm256_set1_epi16(0x80)), 8),
                                    _mm256_slli_epi16(_mm256_and_si256(x, _mm256_set1_epi16(0x7f)), 7));
  *lo = _mm256_cvtph_ps(_mm256_castsi256_si128(h));
  *hi = _mm256_cvtph_ps(_mm256_extracti128_si256(h, 1));
}

// Decodes one key to fp32 values times `mul` (1/256 for fp8, 1 for int8: either way exact) and
// returns the largest magnitude of the stored values.
inline float DecodeKey(const uint8_t* code, KvIndexFormat f, int64_t dim, float* out) {
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  __m256 mx = _mm256_setzero_ps();
  for (int64_t i = 0; i < dim; i += 16) {
    __m256 lo, hi;
    if (f == KvIndexFormat::kFp8) {
      Fp8x16Div256(code + i, &lo, &hi);
    } else {
      const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(code + i));
      lo = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b));
      hi = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(b, 8)));
    }
    _mm256_storeu_ps(out + i, lo);
    _mm256_storeu_ps(out + i + 8, hi);
    mx = _mm256_max_ps(mx, _mm256_max_ps(_mm256_and_ps(lo, abs_mask), _mm256_and_ps(hi, abs_mask)));
  }
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, mx);
  return *std::max_element(lanes, lanes + 8);
}

// dots[k * n_heads + h0 + h] = fp32 (q[h] . key[k]) for KB keys and 4 heads (HB = 4) or 1.
template <int KB, int HB>
inline void ApproxDots(const float* q, int64_t dim, const float* keys, int64_t h0, int64_t n_heads, float* dots) {
  __m256 acc[KB][HB];
  for (int k = 0; k < KB; ++k)
    for (int h = 0; h < HB; ++h) acc[k][h] = _mm256_setzero_ps();
  for (int64_t i = 0; i < dim; i += 8) {
    __m256 kv[KB];
    for (int k = 0; k < KB; ++k) kv[k] = _mm256_loadu_ps(keys + k * dim + i);
    for (int h = 0; h < HB; ++h) {
      const __m256 qv = _mm256_loadu_ps(q + h * dim + i);
      for (int k = 0; k < KB; ++k) acc[k][h] = _mm256_fmadd_ps(qv, kv[k], acc[k][h]);
    }
  }
  for (int k = 0; k < KB; ++k) {
    if constexpr (HB == 4) {
      const __m256 t0 = _mm256_hadd_ps(acc[k][0], acc[k][1]), t1 = _mm256_hadd_ps(acc[k][2], acc[k][3]);
      const __m256 t2 = _mm256_hadd_ps(t0, t1);
      _mm_storeu_ps(dots + k * n_heads + h0, _mm_add_ps(_mm256_castps256_ps128(t2), _mm256_extractf128_ps(t2, 1)));
    } else {
      for (int h = 0; h < HB; ++h) dots[k * n_heads + h0 + h] = HSum(acc[k][h]);
    }
  }
}

template <int KB>
inline void ApproxDotsAllHeads(const float* q, int64_t dim, const float* keys, int64_t n_heads, float* dots) {
  int64_t h = 0;
  for (; h + 4 <= n_heads; h += 4) ApproxDots<KB, 4>(q + h * dim, dim, keys, h, n_heads, dots);
  for (; h < n_heads; ++h) ApproxDots<KB, 1>(q + h * dim, dim, keys, h, n_heads, dots);
}
#endif

// One block of nk <= 3 keys: decoded (value * kmul) into kd, their largest magnitudes (times
// kmul) in kmax, and dots[k * n_heads + h] (times kmul).
void ApproxBlockAvx2(const float* q, int64_t dim, int64_t n_heads, const uint8_t* const* codes, int nk, KvIndexFormat f,
                     float* kd, float* kmax, float* dots) {
  for (int k = 0; k < nk; ++k) kmax[k] = DecodeKey(codes[k], f, dim, kd + k * dim);
  if (nk == 3) ApproxDotsAllHeads<3>(q, dim, kd, n_heads, dots);
  else if (nk == 2) ApproxDotsAllHeads<2>(q, dim, kd, n_heads, dots);
  else ApproxDotsAllHeads<1>(q, dim, kd, n_heads, dots);
}

// The AVX-512 variants run when the active kernel table's level (kernels/isa.h: the CPU, or
// PDSERVE_ISA forced lower; tests switch it with TEST_SetActiveIsa) includes AVX-512
// (internal::ActiveIsaHasAvx512).

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq")

// 32 codes -> 32 values (/256 for fp8, as DecodeKey) in two zmm.
inline void Decode32(const uint8_t* code, KvIndexFormat f, __m512* lo, __m512* hi) {
  if (f == KvIndexFormat::kFp8) {
    const __m512i x = _mm512_cvtepu8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(code)));
    const __m512i h = _mm512_or_si512(_mm512_slli_epi16(_mm512_and_si512(x, _mm512_set1_epi16(0x80)), 8),
                                      _mm512_slli_epi16(_mm512_and_si512(x, _mm512_set1_epi16(0x7f)), 7));
    *lo = _mm512_cvtph_ps(_mm512_castsi512_si256(h));
    *hi = _mm512_cvtph_ps(_mm512_extracti64x4_epi64(h, 1));
  } else {
    const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(code));
    *lo = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm256_castsi256_si128(b)));
    *hi = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm256_extracti128_si256(b, 1)));
  }
}

template <int KB, int HB>
inline void ApproxDots512(const float* q, int64_t dim, const float* keys, int64_t h0, int64_t n_heads, float* dots) {
  __m512 acc[KB][HB];
  for (int k = 0; k < KB; ++k)
    for (int h = 0; h < HB; ++h) acc[k][h] = _mm512_setzero_ps();
  for (int64_t i = 0; i < dim; i += 16) {
    __m512 kv[KB];
    for (int k = 0; k < KB; ++k) kv[k] = _mm512_loadu_ps(keys + k * dim + i);
    for (int h = 0; h < HB; ++h) {
      const __m512 qv = _mm512_loadu_ps(q + h * dim + i);
      for (int k = 0; k < KB; ++k) acc[k][h] = _mm512_fmadd_ps(qv, kv[k], acc[k][h]);
    }
  }
  for (int k = 0; k < KB; ++k) {
    // Fold each accumulator to 8 lanes, then (4 heads) the hadd tree of the AVX2 kernel.
    __m256 f[HB];
    for (int h = 0; h < HB; ++h)
      f[h] = _mm256_add_ps(_mm512_castps512_ps256(acc[k][h]), _mm512_extractf32x8_ps(acc[k][h], 1));
    if constexpr (HB == 4) {
      const __m256 t0 = _mm256_hadd_ps(f[0], f[1]), t1 = _mm256_hadd_ps(f[2], f[3]);
      const __m256 t2 = _mm256_hadd_ps(t0, t1);
      _mm_storeu_ps(dots + k * n_heads + h0, _mm_add_ps(_mm256_castps256_ps128(t2), _mm256_extractf128_ps(t2, 1)));
    } else {
      for (int h = 0; h < HB; ++h) dots[k * n_heads + h0 + h] = HSum(f[h]);
    }
  }
}

template <int KB>
inline void ApproxDotsAllHeads512(const float* q, int64_t dim, const float* keys, int64_t n_heads, float* dots) {
  int64_t h = 0;
  for (; h + 4 <= n_heads; h += 4) ApproxDots512<KB, 4>(q + h * dim, dim, keys, h, n_heads, dots);
  for (; h < n_heads; ++h) ApproxDots512<KB, 1>(q + h * dim, dim, keys, h, n_heads, dots);
}

// ApproxBlockAvx2 for nk <= 4 keys with zmm registers (REQUIRES dim % 32 == 0).
void ApproxBlock512(const float* q, int64_t dim, int64_t n_heads, const uint8_t* const* codes, int nk, KvIndexFormat f,
                    float* kd, float* kmax, float* dots) {
  for (int k = 0; k < nk; ++k) {
    __m512 mx = _mm512_setzero_ps();
    for (int64_t i = 0; i < dim; i += 32) {
      __m512 lo, hi;
      Decode32(codes[k] + i, f, &lo, &hi);
      _mm512_storeu_ps(kd + k * dim + i, lo);
      _mm512_storeu_ps(kd + k * dim + i + 16, hi);
      mx = _mm512_max_ps(mx, _mm512_max_ps(_mm512_abs_ps(lo), _mm512_abs_ps(hi)));
    }
    kmax[k] = _mm512_reduce_max_ps(mx);
  }
  switch (nk) {
    case 4: ApproxDotsAllHeads512<4>(q, dim, kd, n_heads, dots); break;
    case 3: ApproxDotsAllHeads512<3>(q, dim, kd, n_heads, dots); break;
    case 2: ApproxDotsAllHeads512<2>(q, dim, kd, n_heads, dots); break;
    default: ApproxDotsAllHeads512<1>(q, dim, kd, n_heads, dots); break;
  }
}

// Keys in lanes: 16 keys scored at once, every head's dot accumulated across the 16 lanes
// (no horizontal sums: at dim 128 those cost as much as the FMAs), then the bound's terms per
// head in the same lanes. The dots sum in d order, another order than ApproxDots512's; any
// order is inside the bound (the derivation above). REQUIRES dim % 32 == 0, dim <= 256.
constexpr int64_t kLaneKeysMaxDim = 256;

// 16 keys decoded once for any number of queries: their values transposed to kt [d][key]
// (value * kmul, exact), their largest magnitudes in true key units and their scales, in lanes.
struct KeyBlock16 {
  alignas(64) float kt[kLaneKeysMaxDim * 16];
  __m512 kn;  // max_i |k_i| per key (exact)
  __m512 ks;  // the keys' fp32 scales
};

// a[j * NB + b] = sum over d ascending of q[j * dim + d] * kb[b].kt[d][:] for j < HB, b < NB:
// HB heads' dots with the 16 keys of each of NB blocks, in the lanes. Every lane is one fma
// chain over d from zero, whatever HB and NB: the blocking changes no bit. With NB = 1 each
// FMA takes a load of its own (HB broadcasts + 1 key row per HB FMAs: the load ports bound
// it at ~65% of the FMA peak); with NB = 2 a broadcast feeds two FMAs (HB + 2 loads per 2 HB).
template <int HB, int NB>
inline void LaneDots512(const float* q, int64_t dim, const KeyBlock16* kb, __m512* a) {
  for (int i = 0; i < HB * NB; ++i) a[i] = _mm512_setzero_ps();
  for (int64_t d = 0; d < dim; ++d) {
    __m512 kv[NB];
    for (int b = 0; b < NB; ++b) kv[b] = _mm512_load_ps(kb[b].kt + d * 16);
    for (int j = 0; j < HB; ++j) {
      const __m512 qv = _mm512_set1_ps(q[j * dim + d]);
      for (int b = 0; b < NB; ++b) a[j * NB + b] = _mm512_fmadd_ps(qv, kv[b], a[j * NB + b]);
    }
  }
}

// A decoded block's magnitudes and scales: kn = max_i |k_i| in true key units from the largest
// decoded magnitude per lane (value * kmul; kmul a power of two, so exact), as every route
// computes it: the max does not depend on the order.
inline void FinishKeyBlock(__m512 decoded_max, const float* ks, float kmul, KeyBlock16* kb) {
  kb->kn = _mm512_div_ps(decoded_max, _mm512_set1_ps(kmul));
  kb->ks = _mm512_loadu_ps(ks);
}

void DecodeKeyBlock16(const uint8_t* const* codes, const float* ks, int64_t dim, KvIndexFormat f, float kmul,
                      KeyBlock16* kb) {
  __m512 mx = _mm512_setzero_ps();
  for (int64_t i = 0; i < dim; i += 32) {
    __m512i lo[16], hi[16];
    for (int k = 0; k < 16; ++k) {
      __m512 a, b;
      Decode32(codes[k] + i, f, &a, &b);
      lo[k] = _mm512_castps_si512(a);
      hi[k] = _mm512_castps_si512(b);
    }
    Transpose16(lo);
    Transpose16(hi);
    for (int d = 0; d < 16; ++d) {
      const __m512 a = _mm512_castsi512_ps(lo[d]), b = _mm512_castsi512_ps(hi[d]);
      _mm512_store_ps(kb->kt + (i + d) * 16, a);
      _mm512_store_ps(kb->kt + (i + 16 + d) * 16, b);
      mx = _mm512_max_ps(mx, _mm512_max_ps(_mm512_abs_ps(a), _mm512_abs_ps(b)));
    }
  }
  FinishKeyBlock(mx, ks, kmul, kb);
}

#pragma GCC pop_options

// DecodeKeyBlock16 for fp8 keys on CPUs with AVX512-VBMI (byte permutes): the codes are
// transposed as bytes first, then decoded by table lookup, 64 at a time. The same kt, kn and
// ks bits as DecodeKeyBlock16 (same values; the largest magnitude is the value of the largest
// magnitude code, e4m3 magnitudes being ordered as their 7-bit codes), for ~0.25 shuffle-port
// operations per value instead of ~0.6 (a 16x16 fp32 transpose per 256 values plus the fp16
// route per 32). One query over 8192 keys, one thread: the decode 2.3x faster (perf samples),
// the approximate pass 499 -> 368 us with the keys in L2.
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512vbmi")

// In each 128-bit lane, a 16x16 byte transpose of r[0..16): afterwards lane L of r[m] holds
// byte 16L + m of the 16 inputs (input k at byte k). Four rounds of unpacks; the pairing of
// each round keeps the output index equal to the byte index.
inline void TransposeBytes16(__m512i r[16]) {
  __m512i a[16], b[16];
  for (int i = 0; i < 8; ++i) {  // a[2i + h]: 16-bit pairs (k = 2i, 2i + 1) of bytes 8h + w
    a[2 * i] = _mm512_unpacklo_epi8(r[2 * i], r[2 * i + 1]);
    a[2 * i + 1] = _mm512_unpackhi_epi8(r[2 * i], r[2 * i + 1]);
  }
  for (int j = 0; j < 4; ++j)  // b[4j + 2h + g]: keys 4j.. of bytes 8h + 4g + d
    for (int h = 0; h < 2; ++h) {
      b[4 * j + 2 * h] = _mm512_unpacklo_epi16(a[4 * j + h], a[4 * j + 2 + h]);
      b[4 * j + 2 * h + 1] = _mm512_unpackhi_epi16(a[4 * j + h], a[4 * j + 2 + h]);
    }
  for (int p = 0; p < 2; ++p)  // a[8p + 4h + 2g + f]: keys 8p.. of bytes 8h + 4g + 2f + e
    for (int hg = 0; hg < 4; ++hg) {
      a[8 * p + 2 * hg] = _mm512_unpacklo_epi32(b[8 * p + hg], b[8 * p + 4 + hg]);
      a[8 * p + 2 * hg + 1] = _mm512_unpackhi_epi32(b[8 * p + hg], b[8 * p + 4 + hg]);
    }
  for (int hgf = 0; hgf < 8; ++hgf) {  // r[2 hgf + z]: all 16 keys of byte 2 hgf + z
    r[2 * hgf] = _mm512_unpacklo_epi64(a[hgf], a[8 + hgf]);
    r[2 * hgf + 1] = _mm512_unpackhi_epi64(a[hgf], a[8 + hgf]);
  }
}

// The 128 magnitudes' values / 256 as bf16 (exact; DecodeKey's values): high bytes and low
// bytes, 64 per register; and the picks pairing them into dwords (PairedWordPicks): dword k of
// pick[0] / pick[1] = (bf16 of key k in lane 0 / 2) | (bf16 of key k in lane 1 / 3) << 16.
struct Fp8ByteTables {
  __m512i hi[2], lo[2], pick[2];
};
Fp8ByteTables MakeFp8ByteTables() {
  alignas(64) uint8_t hi[128], lo[128], pick[2][64];
  Fp8MagnitudeBf16Bytes(1.0f, hi, lo);
  PairedWordPicks(pick);
  Fp8ByteTables t;
  for (int i = 0; i < 2; ++i) {
    t.hi[i] = _mm512_load_si512(hi + 64 * i);
    t.lo[i] = _mm512_load_si512(lo + 64 * i);
    t.pick[i] = _mm512_load_si512(pick[i]);
  }
  return t;
}

void DecodeKeyBlock16Vbmi(const uint8_t* const* codes, const float* ks, int64_t dim, float kmul, KeyBlock16* kb) {
  static const Fp8ByteTables tables = MakeFp8ByteTables();
  const __m512i sign = _mm512_set1_epi8(static_cast<char>(0x80));
  const __m512i pick0 = tables.pick[0], pick1 = tables.pick[1];
  const __m512i high_half = _mm512_set1_epi32(static_cast<int>(0xffff0000u));
  const __m512i magnitude = _mm512_set1_epi8(0x7f);
  __m512i max_code = _mm512_setzero_si512();  // byte 16L + k: key k's largest magnitude code so far
  for (int64_t c0 = 0; c0 < dim; c0 += 64) {
    __m512i r[16];
    for (int k = 0; k < 16; ++k) r[k] = _mm512_loadu_si512(codes[k] + c0);
    TransposeBytes16(r);  // lane L of r[m]: the keys' codes of dim c0 + 16L + m
    for (int m = 0; m < 16; ++m) {
      const __m512i x = r[m];
      max_code = _mm512_max_epu8(max_code, _mm512_and_si512(x, magnitude));
      const __m512i hi = _mm512_ternarylogic_epi32(_mm512_permutex2var_epi8(tables.hi[0], x, tables.hi[1]), x, sign, 0xF8);
      const __m512i lo = _mm512_permutex2var_epi8(tables.lo[0], x, tables.lo[1]);
      const __m512i p0 = _mm512_permutex2var_epi8(lo, pick0, hi), p1 = _mm512_permutex2var_epi8(lo, pick1, hi);
      const int64_t d = c0 + m;
      const __m512 v[4] = {_mm512_castsi512_ps(_mm512_slli_epi32(p0, 16)), _mm512_castsi512_ps(_mm512_and_si512(p0, high_half)),
                           _mm512_castsi512_ps(_mm512_slli_epi32(p1, 16)), _mm512_castsi512_ps(_mm512_and_si512(p1, high_half))};
      for (int q = 0; q < 4; ++q) _mm512_store_ps(kb->kt + (d + 16 * q) * 16, v[q]);  // dim d + 16q
    }
  }
  // The four lanes' maxima folded into lane 0, then key k's code decoded (DecodeKey's fp16 route).
  max_code = _mm512_max_epu8(max_code, _mm512_shuffle_i64x2(max_code, max_code, _MM_SHUFFLE(1, 0, 3, 2)));
  max_code = _mm512_max_epu8(max_code, _mm512_shuffle_i64x2(max_code, max_code, _MM_SHUFFLE(2, 3, 0, 1)));
  const __m256i half_bits = _mm256_slli_epi16(_mm256_cvtepu8_epi16(_mm512_castsi512_si128(max_code)), 7);
  FinishKeyBlock(_mm512_cvtph_ps(half_bits), ks, kmul, kb);
}

// ---- The coarse pass (CPUs with AVX512-VNNI and VBMI) ----------------------------------------
//
// Every fp8 value v of keys and queries is taken as the int16 round(v * 2^s) (s = CoarseShift:
// 3 at dim <= 128, 2 up to 256), and the dots run as int16 pair products summed in int32
// (vpdpwssd: 32 multiply-adds per instruction, twice the fp32 FMA's 16 at the same rate). The
// sums are exact integers: |round(v 2^s)| <= 480 * 2^s, so |sum| <= dim (480 * 2^s)^2 < 2^31.
// Only the rounding to int16 differs from the fp8 values, and only for |v| < 2^(3-s) (an e4m3
// value (1 + m/8) 2^E is a multiple of 2^(E-3), so those of 2^(3-s) and above are multiples of
// 2^-s: at s = 3 every value from 1 up), by at most 2^-(s+1). So with q' and k' the rounded
// values, c_k the number of key values that may be off (nonzero codes below 2^(3-s)) and
// max|k'_i| <= max|k_i| + 2^-(s+1), both counted in the key decode:
//   |q . k - q' . k'| <= sum |q_i - q'_i| |k'_i| + sum |q_i| |k_i - k'_i|
//                     <= ||q - q'||_1 max|k'_i| + max|q_i| c_k 2^-(s+1)   =: E_hk
// (||q - q'||_1 measured when the query is prepared). The int32 sum converts to fp32 with one
// rounding (u |a|); the rest is the fp32 pass's bound (above) with E_hk in place of
// gamma_n ||q_h||_1 max|k_i|. On Gaussian-like keys, where few values fall below 2^(3-s), E_hk
// is about the fp32 pass's bound; its worst case (every value small) is far wider, and
// IndexerTopK then narrows the unsure keys with the fp32 pass.
int CoarseShift(int64_t dim) { return dim <= 128 ? 3 : 2; }
constexpr float kCoarseMaxValue = 480.0f;  // the largest e4m3 magnitude the fp16 route decodes (code 0x7f)

// 16 keys' rounded values in pairs: kp[P * 16 + k] holds key k's values of dims
// (c + 32j + m, c + 32j + 16 + m) in its low / high int16 for pair P = c / 2 + 2m + j (c a
// multiple of 64, m < 16, j < 2): the order the byte-table decode produces them in
// (PairedWordPicks); the query's pairs follow it (PrepareIndexerQuery).
struct KeyPairs16 {
  alignas(64) int32_t kp[kLaneKeysMaxDim / 2 * 16];
  __m512 ks;         // the keys' fp32 scales
  __m512 max_value;  // max_i |k'_i| <= max_i |k_i| + 2^-(s+1)
  __m512 inexact;    // how many values may be off: nonzero codes below 2^(3-s)
};

// Byte tables of the rounded values' int16 (two's complement) by 7-bit magnitude code: low and
// high bytes for a positive and a negative sign, 64 entries per register.
struct PairTables {
  __m512i lo_pos[2], hi_pos[2], lo_neg[2], hi_neg[2], pick[2];
};
PairTables MakePairTables(int shift) {
  alignas(64) uint8_t bytes[4][128], pick[2][64];
  for (int c = 0; c < 128; ++c) {
    const float v = _cvtsh_ss(static_cast<unsigned short>(c << 7)) * 256.0f;  // the fp16 route's value
    const auto r = static_cast<int32_t>(std::nearbyint(std::ldexp(v, shift)));
    const auto pos = static_cast<uint16_t>(r), neg = static_cast<uint16_t>(-r);
    bytes[0][c] = static_cast<uint8_t>(pos), bytes[1][c] = static_cast<uint8_t>(pos >> 8);
    bytes[2][c] = static_cast<uint8_t>(neg), bytes[3][c] = static_cast<uint8_t>(neg >> 8);
  }
  PairedWordPicks(pick);
  PairTables t;
  for (int i = 0; i < 2; ++i) {
    t.lo_pos[i] = _mm512_load_si512(bytes[0] + 64 * i);
    t.hi_pos[i] = _mm512_load_si512(bytes[1] + 64 * i);
    t.lo_neg[i] = _mm512_load_si512(bytes[2] + 64 * i);
    t.hi_neg[i] = _mm512_load_si512(bytes[3] + 64 * i);
    t.pick[i] = _mm512_load_si512(pick[i]);
  }
  return t;
}

// 16 keys' codes -> KeyPairs16: the byte transpose of DecodeKeyBlock16Vbmi, then per 64 codes
// four table lookups (both signs' low and high bytes), two sign blends and the two picks.
void DecodeKeyPairs16(const uint8_t* const* codes, const float* ks, int64_t dim, KeyPairs16* kb) {
  static const PairTables tables[2] = {MakePairTables(2), MakePairTables(3)};
  const int shift = CoarseShift(dim);
  const PairTables& t = tables[shift - 2];
  // Codes of 2^(3-s) and up (magnitude code (10 - s) << 3 and up) are exact; the nonzero ones below
  // are counted: (code - 1) < (threshold - 1) unsigned.
  const __m512i magnitude = _mm512_set1_epi8(0x7f), one = _mm512_set1_epi8(1);
  const __m512i below = _mm512_set1_epi8(static_cast<char>(((10 - shift) << 3) - 1));
  __m512i max_code = _mm512_setzero_si512();  // byte 16L + k: key k's largest magnitude code so far
  __m512i inexact = _mm512_setzero_si512();   // byte 16L + k: key k's count in lane L (<= dim / 4 <= 64)
  for (int64_t c0 = 0; c0 < dim; c0 += 64) {
    __m512i r[16];
    for (int k = 0; k < 16; ++k) r[k] = _mm512_loadu_si512(codes[k] + c0);
    TransposeBytes16(r);  // lane L of r[m]: the keys' codes of dim c0 + 16L + m
    for (int m = 0; m < 16; ++m) {
      const __m512i x = r[m];
      const __m512i mag = _mm512_and_si512(x, magnitude);
      max_code = _mm512_max_epu8(max_code, mag);
      inexact = _mm512_mask_add_epi8(inexact, _mm512_cmplt_epu8_mask(_mm512_sub_epi8(mag, one), below), inexact, one);
      const __mmask64 negative = _mm512_movepi8_mask(x);
      const __m512i lo = _mm512_mask_blend_epi8(negative, _mm512_permutex2var_epi8(t.lo_pos[0], x, t.lo_pos[1]),
                                                _mm512_permutex2var_epi8(t.lo_neg[0], x, t.lo_neg[1]));
      const __m512i hi = _mm512_mask_blend_epi8(negative, _mm512_permutex2var_epi8(t.hi_pos[0], x, t.hi_pos[1]),
                                                _mm512_permutex2var_epi8(t.hi_neg[0], x, t.hi_neg[1]));
      int32_t* out = kb->kp + (c0 / 2 + 2 * m) * 16;
      _mm512_store_si512(out, _mm512_permutex2var_epi8(lo, t.pick[0], hi));
      _mm512_store_si512(out + 16, _mm512_permutex2var_epi8(lo, t.pick[1], hi));
    }
  }
  // The four lanes folded per key: maxima as bytes, counts as 16-bit words (up to dim).
  max_code = _mm512_max_epu8(max_code, _mm512_shuffle_i64x2(max_code, max_code, _MM_SHUFFLE(1, 0, 3, 2)));
  max_code = _mm512_max_epu8(max_code, _mm512_shuffle_i64x2(max_code, max_code, _MM_SHUFFLE(2, 3, 0, 1)));
  const __m256i half_bits = _mm256_slli_epi16(_mm256_cvtepu8_epi16(_mm512_castsi512_si128(max_code)), 7);
  const float half_step = std::ldexp(1.0f, -(shift + 1));
  kb->max_value = _mm512_add_ps(_mm512_mul_ps(_mm512_cvtph_ps(half_bits), _mm512_set1_ps(256.0f)), _mm512_set1_ps(half_step));
  __m256i count = _mm256_setzero_si256();
  for (int lane = 0; lane < 4; ++lane) {
    const __m128i bytes = lane == 0 ? _mm512_castsi512_si128(inexact)
                        : lane == 1 ? _mm512_extracti32x4_epi32(inexact, 1)
                        : lane == 2 ? _mm512_extracti32x4_epi32(inexact, 2)
                                    : _mm512_extracti32x4_epi32(inexact, 3);
    count = _mm256_add_epi16(count, _mm256_cvtepu8_epi16(bytes));
  }
  kb->inexact = _mm512_cvtepi32_ps(_mm512_cvtepu16_epi32(count));
  kb->ks = _mm512_loadu_ps(ks);
}

#pragma GCC pop_options
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq")

bool UseByteLut() {
  static const bool cpu = __builtin_cpu_supports("avx512vbmi");
  return cpu && internal::indexer_byte_lut.load(std::memory_order_relaxed);
}

// The coarse pass applies: the CPU has the byte permutes (the avx512 level has VNNI), fp8 keys,
// and a query prepared for it (dim % 64 == 0, dim <= 256, finite values).
bool UseCoarse(const KvTokenView& kv, const IndexerQuery& q) {
  return internal::indexer_coarse.load(std::memory_order_relaxed) && internal::IndexerCoarseAvailable() &&
         kv.index_format == KvIndexFormat::kFp8 && !q.qp.empty() && kv.index_dim == q.dim;
}

}  // namespace

bool internal::IndexerCoarseAvailable() {
  static const bool cpu = __builtin_cpu_supports("avx512vbmi");  // the avx512 level has VNNI
  return cpu && internal::ActiveIsaHasAvx512();
}

namespace {

// The key decode for a block: the byte-table route where it applies (fp8, dim % 64 == 0).
void DecodeKeys16(const uint8_t* const* codes, const float* ks, int64_t dim, KvIndexFormat f, float kmul,
                  KeyBlock16* kb) {
  if (f == KvIndexFormat::kFp8 && dim % 64 == 0 && UseByteLut()) DecodeKeyBlock16Vbmi(codes, ks, dim, kmul, kb);
  else DecodeKeyBlock16(codes, ks, dim, f, kmul, kb);
}

// The bound's sums over heads for NB blocks of 16 keys, in lanes (HeadTerms / Finish of 16 keys
// at once): Add takes head h's dot approximations av[b] (code-value units) and their error
// bounds e[b] (E_h (1 + u), as g[h] * kn is), Store writes approx[16 b + k] and bound[16 b + k].
template <int NB>
struct LaneTerms {
  __m512 acc[NB], m[NB], sd[NB];
  LaneTerms() {
    for (int b = 0; b < NB; ++b) acc[b] = m[b] = sd[b] = _mm512_setzero_ps();
  }
  void Add(const __m512* av, const __m512* e, float w) {
    const __m512 zero = _mm512_setzero_ps(), u = _mm512_set1_ps(kU);
    const __m512 wv = _mm512_set1_ps(w), wa = _mm512_set1_ps(std::fabs(w));
    for (int b = 0; b < NB; ++b) {
      const __m512 r = _mm512_max_ps(av[b], zero);
      const __mmask16 live = _mm512_cmp_ps_mask(_mm512_add_ps(av[b], e[b]), zero, _CMP_GT_OQ);
      const __m512 delta = _mm512_maskz_mov_ps(live, _mm512_fmadd_ps(u, _mm512_abs_ps(av[b]), e[b]));
      acc[b] = _mm512_fmadd_ps(r, wv, acc[b]);
      m[b] = _mm512_fmadd_ps(r, wa, m[b]);
      sd[b] = _mm512_fmadd_ps(delta, wa, sd[b]);
    }
  }
  // kb[0..NB): the scored blocks (their scales ks).
  template <typename Block>
  void Store(float h_u, const Block* kb, float* approx, float* bound) const {
    for (int b = 0; b < NB; ++b) {
      const __m512 ks = kb[b].ks;
      const __m512 diff = _mm512_add_ps(_mm512_mul_ps(sd[b], _mm512_set1_ps(1.0f + 1.01f * h_u)),
                                        _mm512_mul_ps(_mm512_set1_ps(2.02f * h_u), m[b]));
      _mm512_storeu_ps(approx + 16 * b, _mm512_mul_ps(acc[b], ks));
      const __m512 inner = _mm512_add_ps(_mm512_mul_ps(diff, _mm512_set1_ps(1.0f + kU)),
                                         _mm512_mul_ps(_mm512_set1_ps(2.0f * kU), _mm512_abs_ps(acc[b])));
      _mm512_storeu_ps(bound + 16 * b, _mm512_mul_ps(_mm512_mul_ps(_mm512_set1_ps(1.02f), _mm512_abs_ps(ks)), inner));
    }
  }
};

// The heads of one query in passes: dots(std::integral_constant<int, HB>, h, a) fills
// a[j * NB + b] for heads h..h+HB and blocks b < NB, then terms(a + j * NB, h + j) per head.
// 16 accumulators per pass (16 heads of one block or 8 heads of two: independent chains enough
// to hide the FMA latency), then 8-head passes of one block, then single heads.
template <int NB, typename Vec, typename DotsFn, typename TermsFn>
inline void HeadPasses(int64_t H, const DotsFn& dots, const TermsFn& terms) {
  constexpr int kPassHeads = NB == 1 ? 16 : 8;
  int64_t h = 0;
  for (; h + kPassHeads <= H; h += kPassHeads) {
    Vec a[kPassHeads * NB];
    dots(std::integral_constant<int, kPassHeads>{}, h, a);
    for (int j = 0; j < kPassHeads; ++j) terms(a + j * NB, h + j);
  }
  if constexpr (NB == 1) {
    for (; h + 8 <= H; h += 8) {
      Vec a[8];
      dots(std::integral_constant<int, 8>{}, h, a);
      for (int j = 0; j < 8; ++j) terms(a + j, h + j);
    }
  }
  for (; h < H; ++h) {
    Vec a[NB];
    dots(std::integral_constant<int, 1>{}, h, a);
    terms(a, h);
  }
}

// One query's approximations and bounds of NB decoded blocks of 16 keys (kb[0..NB), keys
// consecutive): approx[16 b + k] and bound[16 b + k] for key k of block b. The same bits for
// NB = 1 and 2 (LaneDots512); with 2, one query's pass over 8192 keys went from ~500 to ~430 us
// (one thread; perf: the score kernel at ~84% of the thread's FMA peak).
template <int NB>
void ScoreKeyBlocks(const IndexerQuery& q, const QueryConsts& qc, const KeyBlock16* kb, float kmul, float* approx,
                    float* bound) {
  const int64_t dim = q.dim, H = q.n_heads;
  const __m512 back = _mm512_set1_ps(1.0f / kmul);
  LaneTerms<NB> sums;
  auto terms = [&](const __m512* dots, int64_t h) {  // dots[b]: head h's dots with block b
    const __m512 g = _mm512_set1_ps(qc.g[h]);
    __m512 av[NB], e[NB];
    for (int b = 0; b < NB; ++b) {
      av[b] = _mm512_mul_ps(dots[b], back);
      e[b] = _mm512_mul_ps(g, kb[b].kn);
    }
    sums.Add(av, e, q.w[h]);
  };
  const float* qv = q.q.data();
  HeadPasses<NB, __m512>(H, [&](auto hb, int64_t h, __m512* a) { LaneDots512<hb, NB>(qv + h * dim, dim, kb, a); },
                         terms);
  sums.Store(qc.h_u, kb, approx, bound);
}

// The fp32 lane kernels' block decode for kv's keys.
auto Fp32Decoder(const KvTokenView& kv, float kmul) {
  return [&kv, kmul](const uint8_t* const* codes, const float* ks, KeyBlock16* kb) {
    DecodeKeys16(codes, ks, kv.index_dim, kv.index_format, kmul, kb);
  };
}

#pragma GCC pop_options
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni")

// acc + the int16 pair products of a and b per dword. In asm for the reason of gemm_avx512.cc's
// Dpbusd (GCC 12 sends each accumulator of the intrinsic through the stack).
inline __m512i Dpwssd(__m512i acc, __m512i a, __m512i b) {
  __asm__("vpdpwssd %2, %1, %0" : "+v"(acc) : "v"(a), "v"(b));
  return acc;
}

// a[j * NB + b] = the int32 sums over pairs P of qp[j * pairs + P] . kb[b].kp[P][:] for j < HB
// (LaneDots512's blocking; exact, so the blocking changes nothing).
template <int HB, int NB>
inline void LanePairDots(const int32_t* qp, int64_t pairs, const KeyPairs16* kb, __m512i* a) {
  for (int i = 0; i < HB * NB; ++i) a[i] = _mm512_setzero_si512();
  for (int64_t p = 0; p < pairs; ++p) {
    __m512i kv[NB];
    for (int b = 0; b < NB; ++b) kv[b] = _mm512_load_si512(kb[b].kp + p * 16);
    for (int j = 0; j < HB; ++j) {
      const __m512i qv = _mm512_set1_epi32(qp[j * pairs + p]);
      for (int b = 0; b < NB; ++b) a[j * NB + b] = Dpwssd(a[j * NB + b], kv[b], qv);
    }
  }
}

// ScoreKeyBlocks for the coarse pass: dots a = sum * 2^-2s (the int32 sum rounded once to
// fp32), error bounds e = E_hk (1 + u) + 2.02 u |a| (E_hk from the query's and the key's
// factors, the second term the conversion's rounding with room to spare); the rest is LaneTerms.
template <int NB>
void ScoreKeyPairs(const IndexerQuery& q, const QueryConsts& qc, const KeyPairs16* kb, float* approx, float* bound) {
  const int64_t pairs = q.dim / 2, H = q.n_heads;
  const __m512 back = _mm512_set1_ps(std::ldexp(1.0f, -2 * CoarseShift(q.dim)));
  const __m512 u2 = _mm512_set1_ps(2.02f * kU);
  LaneTerms<NB> sums;
  auto terms = [&](const __m512i* dots, int64_t h) {
    const __m512 off = _mm512_set1_ps(q.coarse_off[h]), half_max = _mm512_set1_ps(q.coarse_half_max[h]);
    __m512 av[NB], e[NB];
    for (int b = 0; b < NB; ++b) {
      av[b] = _mm512_mul_ps(_mm512_cvtepi32_ps(dots[b]), back);
      const __m512 eh = _mm512_fmadd_ps(half_max, kb[b].inexact, _mm512_mul_ps(off, kb[b].max_value));
      e[b] = _mm512_fmadd_ps(u2, _mm512_abs_ps(av[b]), eh);
    }
    sums.Add(av, e, q.w[h]);
  };
  const int32_t* qp = q.qp.data();
  HeadPasses<NB, __m512i>(H, [&](auto hb, int64_t h, __m512i* a) { LanePairDots<hb, NB>(qp + h * pairs, pairs, kb, a); },
                          terms);
  sums.Store(qc.h_u, kb, approx, bound);
}

#pragma GCC pop_options
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq")

// Decodes keys [t0, t0 + 16 NB) of the cache into kb[0..NB): decode(codes, ks, &kb[b]).
template <int NB, typename Block, typename DecodeFn>
void DecodeKeyRun(const KvTokenView& kv, int64_t t0, const DecodeFn& decode, Block* kb) {
  for (int b = 0; b < NB; ++b) {
    const uint8_t* codes[16];
    float ks[16];
    KvTokenView::Slot at = kv.Locate(t0 + 16 * b);
    for (int k = 0; k < 16; ++k) {
      if (k > 0) at = kv.Next(at, t0 + 16 * b + k);
      codes[k] = kv.At(at, kv.idx_k_offset, kv.idx_k_stride);
      ks[k] = LoadF32(kv.At(at, kv.idx_scale_offset, kv.idx_scale_stride));
    }
    decode(codes, ks, &kb[b]);
  }
}

// How far ahead of the keys being decoded LaneKeyBlocks prefetches (keys).
constexpr int64_t kIndexPrefetchKeys = 64;

// The lane kernels over keys [t0, end) while whole blocks remain, 32 keys at a time and a last
// 16; decode(codes, ks, Block*) decodes a block, score(nb, kb, t) scores nb decoded blocks
// holding keys from t on. Returns where the blocks end.
template <typename Block, typename DecodeFn, typename ScoreFn>
int64_t LaneKeyBlocks(const KvTokenView& kv, int64_t t0, int64_t end, const DecodeFn& decode, const ScoreFn& score) {
  Block kb[2];
  for (; t0 + 32 <= end; t0 += 32) {
    // The keys kIndexPrefetchKeys ahead start their way in now: a cache block's keys stream,
    // but each next block (elsewhere in the pool) began with a wait on memory.
    const int64_t ahead_end = std::min(end, t0 + kIndexPrefetchKeys + 32);
    if (t0 + kIndexPrefetchKeys < ahead_end) {
      KvTokenView::Slot at = kv.Locate(t0 + kIndexPrefetchKeys);
      for (int64_t t = t0 + kIndexPrefetchKeys; t < ahead_end; ++t) {
        if (t > t0 + kIndexPrefetchKeys) at = kv.Next(at, t);
        const uint8_t* codes = kv.At(at, kv.idx_k_offset, kv.idx_k_stride);
        for (int64_t b = 0; b < kv.index_dim; b += 64) _mm_prefetch(reinterpret_cast<const char*>(codes + b), _MM_HINT_T0);
        if ((at.slot & 15) == 0 || t == t0 + kIndexPrefetchKeys)
          _mm_prefetch(reinterpret_cast<const char*>(kv.At(at, kv.idx_scale_offset, kv.idx_scale_stride)), _MM_HINT_T0);
      }
    }
    DecodeKeyRun<2>(kv, t0, decode, kb);
    score(std::integral_constant<int, 2>{}, kb, t0);
  }
  if (t0 + 16 <= end) {
    DecodeKeyRun<1>(kv, t0, decode, kb);
    score(std::integral_constant<int, 1>{}, kb, t0);
    t0 += 16;
  }
  return t0;
}

// IndexerScoresApproxRows' lane blocks from key_begin: each decoded once, then scored for every
// query. Returns where the blocks end.
int64_t ApproxRows512(const KvTokenView& kv, const IndexerQuery* const* queries, const QueryConsts* qc, int64_t n_queries,
                      int64_t key_begin, int64_t key_end, float* const* approx, float* const* bound) {
  const float kmul = kv.index_format == KvIndexFormat::kFp8 ? 1.0f / 256 : 1.0f;
  return LaneKeyBlocks<KeyBlock16>(kv, key_begin, key_end, Fp32Decoder(kv, kmul),
                                   [&](auto nb, const KeyBlock16* kb, int64_t t0) {
    for (int64_t r = 0; r < n_queries; ++r)
      ScoreKeyBlocks<nb>(*queries[r], qc[r], kb, kmul, approx[r] + (t0 - key_begin), bound[r] + (t0 - key_begin));
  });
}

// ApproxRows512 with the coarse pass: each block of keys decoded to pairs once, then scored for
// every query (all prepared for it: UseCoarse).
int64_t CoarseRows512(const KvTokenView& kv, const IndexerQuery* const* queries, const QueryConsts* qc,
                      int64_t n_queries, int64_t key_begin, int64_t key_end, float* const* approx, float* const* bound) {
  const int64_t dim = kv.index_dim;
  auto decode = [dim](const uint8_t* const* codes, const float* ks, KeyPairs16* kb) { DecodeKeyPairs16(codes, ks, dim, kb); };
  return LaneKeyBlocks<KeyPairs16>(kv, key_begin, key_end, decode, [&](auto nb, const KeyPairs16* kb, int64_t t0) {
    for (int64_t r = 0; r < n_queries; ++r)
      ScoreKeyPairs<nb>(*queries[r], qc[r], kb, approx[r] + (t0 - key_begin), bound[r] + (t0 - key_begin));
  });
}

#pragma GCC pop_options

}  // namespace

namespace {

// The query's side of the coarse pass (see CoarseShift): its values rounded to int16 and paired
// as DecodeKeyPairs16 pairs the keys', and per head the query's factors of E_hk.
// Left empty (the fp32 pass then runs) for shapes the pass does not take or values beyond e4m3's.
void PrepareCoarse(IndexerQuery* q) {
  q->qp.clear();
  q->coarse_off.clear();
  q->coarse_half_max.clear();
  const int64_t dim = q->dim, H = q->n_heads;
  if (dim % 64 != 0 || dim > kLaneKeysMaxDim) return;
  for (float v : q->q)
    if (!(std::fabs(v) <= kCoarseMaxValue)) return;
  const int s = CoarseShift(dim);
  const int64_t pairs = dim / 2;
  q->qp.resize(static_cast<size_t>(H * pairs));
  q->coarse_off.resize(static_cast<size_t>(H));
  q->coarse_half_max.resize(static_cast<size_t>(H));
  alignas(32) int32_t rounded[kLaneKeysMaxDim];
  const __m256 up = _mm256_set1_ps(std::ldexp(1.0f, s)), down = _mm256_set1_ps(std::ldexp(1.0f, -s));
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  for (int64_t h = 0; h < H; ++h) {
    const float* v = &q->q[static_cast<size_t>(h * dim)];
    // ||q - q'||_1 in fp32, exactly: every term is a multiple of 2^-9 below 2^-(s+1) (the
    // difference of an e4m3 value and a multiple of 2^-s), so the sum needs under 20 bits.
    __m256 off = _mm256_setzero_ps(), largest = _mm256_setzero_ps();
    for (int64_t i = 0; i < dim; i += 8) {
      const __m256 x = _mm256_loadu_ps(v + i);
      largest = _mm256_max_ps(largest, _mm256_and_ps(x, abs_mask));
      const __m256 r = _mm256_round_ps(_mm256_mul_ps(x, up), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
      _mm256_store_si256(reinterpret_cast<__m256i*>(rounded + i), _mm256_cvtps_epi32(r));
      off = _mm256_add_ps(off, _mm256_and_ps(_mm256_sub_ps(x, _mm256_mul_ps(r, down)), abs_mask));
    }
    alignas(32) float lanes[8], maxima[8];
    _mm256_store_ps(lanes, off);
    _mm256_store_ps(maxima, largest);
    double off_sum = 0.0;
    float q_max = 0.0f;
    for (int l = 0; l < 8; ++l) off_sum += lanes[l], q_max = std::max(q_max, maxima[l]);
    for (int64_t c = 0; c < dim; c += 64)
      for (int64_t m = 0; m < 16; ++m)
        for (int64_t j = 0; j < 2; ++j) {
          const int64_t d = c + 32 * j + m;
          const auto low = static_cast<uint16_t>(rounded[d]);
          const auto high = static_cast<uint16_t>(rounded[d + 16]);
          q->qp[static_cast<size_t>(h * pairs + c / 2 + 2 * m + j)] =
              static_cast<int32_t>(static_cast<uint32_t>(low) | static_cast<uint32_t>(high) << 16);
        }
    // E_h's factors with (1 + u) and room for E_h's own fp32 evaluation (two roundings).
    q->coarse_off[static_cast<size_t>(h)] = static_cast<float>(off_sum * (1.0 + kU) * 1.0001);
    q->coarse_half_max[static_cast<size_t>(h)] = static_cast<float>(std::ldexp(static_cast<double>(q_max), -(s + 1)) * (1.0 + kU) * 1.0001);
  }
}

}  // namespace

void PrepareIndexerQuery(const uint8_t* q8, const float* w, int64_t n_heads, int64_t dim, IndexerQuery* q) {
  PDSERVE_CHECK(dim % 16 == 0 && dim <= 1024 && n_heads <= 64);
  const float* table = Fp8E4M3DecodeTable();
  q->n_heads = n_heads;
  q->dim = dim;
  q->q.resize(static_cast<size_t>(n_heads * dim));
  q->qd.resize(q->q.size());
  q->w.assign(w, w + n_heads);
  q->l1.resize(static_cast<size_t>(n_heads));
  for (int64_t i = 0; i < n_heads * dim; ++i) q->q[static_cast<size_t>(i)] = table[q8[i]];
  // The doubles and the 1-norms 4 values a step (the norm only bounds: any order will do).
  const __m256d abs_mask = _mm256_castsi256_pd(_mm256_set1_epi64x(0x7fffffffffffffff));
  for (int64_t h = 0; h < n_heads; ++h) {
    __m256d l1 = _mm256_setzero_pd();
    for (int64_t i = h * dim; i < (h + 1) * dim; i += 4) {
      const __m256d v = _mm256_cvtps_pd(_mm_loadu_ps(&q->q[static_cast<size_t>(i)]));
      _mm256_storeu_pd(&q->qd[static_cast<size_t>(i)], v);
      l1 = _mm256_add_pd(l1, _mm256_and_pd(v, abs_mask));
    }
    alignas(32) double lanes[4];
    _mm256_store_pd(lanes, l1);
    q->l1[static_cast<size_t>(h)] = static_cast<float>((lanes[0] + lanes[1]) + (lanes[2] + lanes[3])) * kNormSlack;
  }
  PrepareCoarse(q);
}

void IndexerScoresApprox(const KvTokenView& kv, const IndexerQuery& q, int64_t key_begin, int64_t key_end,
                         float* approx, float* bound) {
  const int64_t dim = kv.index_dim, H = q.n_heads;
  PDSERVE_DCHECK(dim == q.dim);
  const QueryConsts qc = Consts(q);
  // Key values are decoded to code value * kmul (exact); dots and norms scale back by 1 / kmul.
  const float kmul = kv.index_format == KvIndexFormat::kFp8 ? 1.0f / 256 : 1.0f;
  constexpr int kMaxKeys = 4;
  alignas(64) float kd[kMaxKeys * 1024];
  float dots[kMaxKeys * 64];
  float kmax[kMaxKeys];
  const bool wide = internal::ActiveIsaHasAvx512() && dim % 32 == 0;
  int64_t t0 = key_begin;
  if (UseCoarse(kv, q)) {
    const IndexerQuery* one = &q;
    t0 = CoarseRows512(kv, &one, &qc, 1, key_begin, key_end, &approx, &bound);
  } else if (wide && dim <= kLaneKeysMaxDim) {
    t0 = LaneKeyBlocks<KeyBlock16>(kv, key_begin, key_end, Fp32Decoder(kv, kmul),
                                   [&](auto nb, const KeyBlock16* kb, int64_t t) {
      ScoreKeyBlocks<nb>(q, qc, kb, kmul, approx + (t - key_begin), bound + (t - key_begin));
    });
  }
  const int block = wide ? 4 : 3;  // keys per block: 4 x 4 zmm or 3 x 4 ymm accumulators
  for (; t0 < key_end; t0 += block) {
    const int nk = static_cast<int>(std::min<int64_t>(block, key_end - t0));
    const uint8_t* codes[kMaxKeys];
    float ks[kMaxKeys];
    for (int k = 0; k < nk; ++k) {
      codes[k] = kv.Field(t0 + k, kv.idx_k_offset, kv.idx_k_stride);
      ks[k] = LoadF32(kv.Field(t0 + k, kv.idx_scale_offset, kv.idx_scale_stride));
    }
    if (wide) {
      ApproxBlock512(q.q.data(), dim, H, codes, nk, kv.index_format, kd, kmax, dots);
    } else {
      ApproxBlockAvx2(q.q.data(), dim, H, codes, nk, kv.index_format, kd, kmax, dots);
    }
    for (int k = 0; k < nk; ++k) {
      const int64_t t = t0 + k;
      const float kn = kmax[k] / kmul;
      Finish(HeadTerms(dots + k * H, kmul, q.w.data(), qc.g, kn, H), qc.h_u, ks[k], approx + (t - key_begin),
             bound + (t - key_begin));
    }
  }
}

void IndexerScoresApproxRows(const KvTokenView& kv, const IndexerQuery* const* queries, int64_t n_queries,
                             int64_t key_begin, int64_t key_end, float* const* approx, float* const* bound) {
  const int64_t dim = kv.index_dim;
  int64_t t0 = key_begin;
  if (n_queries > 1 && internal::ActiveIsaHasAvx512() && dim % 32 == 0 && dim <= kLaneKeysMaxDim) {
    thread_local std::vector<QueryConsts> qc;
    qc.resize(static_cast<size_t>(n_queries));
    for (int64_t r = 0; r < n_queries; ++r) {
      PDSERVE_DCHECK(queries[r]->dim == dim);
      qc[static_cast<size_t>(r)] = Consts(*queries[r]);
    }
    bool coarse = true;
    for (int64_t r = 0; r < n_queries; ++r) coarse = coarse && UseCoarse(kv, *queries[r]);
    t0 = coarse ? CoarseRows512(kv, queries, qc.data(), n_queries, key_begin, key_end, approx, bound)
                : ApproxRows512(kv, queries, qc.data(), n_queries, key_begin, key_end, approx, bound);
  }
  // The rest (fewer than 16 keys, or every key where the lane kernel does not apply), query by
  // query: the blocks IndexerScoresApprox over [key_begin, key_end) would use there too.
  if (t0 < key_end) {
    for (int64_t r = 0; r < n_queries; ++r)
      IndexerScoresApprox(kv, *queries[r], t0, key_end, approx[r] + (t0 - key_begin), bound[r] + (t0 - key_begin));
  }
}

void IndexerScoresExactAt(const KvTokenView& kv, const IndexerQuery& q, const int32_t* sel, int64_t n,
                          float* scores) {
  // IndexerScores writes key t's score at its argument's [t].
  for (int64_t j = 0; j < n; ++j)
    IndexerScores(kv, q.qd.data(), q.w.data(), q.n_heads, sel[j], sel[j] + 1, scores + j - sel[j]);
}

namespace {

// max(bound[0..n)), n >= 1. The bounds are finite, so the grouping of the comparisons does not
// matter; four chains of 8 lanes instead of std::max_element's serial maxss chain (4 cycles a
// key: a third of IndexerTopK's time at 8K-32K keys).
float MaxOfBounds(const float* bound, int64_t n) {
  __m256 m0 = _mm256_set1_ps(-INFINITY), m1 = m0, m2 = m0, m3 = m0;
  int64_t t = 0;
  for (; t + 32 <= n; t += 32) {
    m0 = _mm256_max_ps(m0, _mm256_loadu_ps(bound + t));
    m1 = _mm256_max_ps(m1, _mm256_loadu_ps(bound + t + 8));
    m2 = _mm256_max_ps(m2, _mm256_loadu_ps(bound + t + 16));
    m3 = _mm256_max_ps(m3, _mm256_loadu_ps(bound + t + 24));
  }
  __m256 m = _mm256_max_ps(_mm256_max_ps(m0, m1), _mm256_max_ps(m2, m3));
  for (; t + 8 <= n; t += 8) m = _mm256_max_ps(m, _mm256_loadu_ps(bound + t));
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, m);
  float r = lanes[0];
  for (int l = 1; l < 8; ++l) r = std::max(r, lanes[l]);
  for (; t < n; ++t) r = std::max(r, bound[t]);
  return r;
}

// Keys t with approx[t] - bound[t] > in_above into *sure, else those with approx[t] +
// bound[t] >= out_below into *unsure, both ascending; the sums in double as the scalar loop
// does them (8 keys per step; most keys are neither, so a step is usually two compares).
void ClassifyKeys(const float* approx, const float* bound, int64_t n, double in_above, double out_below,
                  std::vector<int32_t>* sure, std::vector<int32_t>* unsure) {
  sure->clear();
  unsure->clear();
  const __m256d vin = _mm256_set1_pd(in_above), vout = _mm256_set1_pd(out_below);
  int64_t t = 0;
  for (; t + 8 <= n; t += 8) {
    const __m256 a8 = _mm256_loadu_ps(approx + t), b8 = _mm256_loadu_ps(bound + t);
    const __m256d a0 = _mm256_cvtps_pd(_mm256_castps256_ps128(a8)), a1 = _mm256_cvtps_pd(_mm256_extractf128_ps(a8, 1));
    const __m256d b0 = _mm256_cvtps_pd(_mm256_castps256_ps128(b8)), b1 = _mm256_cvtps_pd(_mm256_extractf128_ps(b8, 1));
    const unsigned in = static_cast<unsigned>(_mm256_movemask_pd(_mm256_cmp_pd(_mm256_sub_pd(a0, b0), vin, _CMP_GT_OQ))) |
                        static_cast<unsigned>(_mm256_movemask_pd(_mm256_cmp_pd(_mm256_sub_pd(a1, b1), vin, _CMP_GT_OQ)))
                            << 4;
    const unsigned near =
        (static_cast<unsigned>(_mm256_movemask_pd(_mm256_cmp_pd(_mm256_add_pd(a0, b0), vout, _CMP_GE_OQ))) |
         static_cast<unsigned>(_mm256_movemask_pd(_mm256_cmp_pd(_mm256_add_pd(a1, b1), vout, _CMP_GE_OQ))) << 4) &
        ~in;
    for (unsigned m = in; m != 0; m &= m - 1) sure->push_back(static_cast<int32_t>(t + __builtin_ctz(m)));
    for (unsigned m = near; m != 0; m &= m - 1) unsure->push_back(static_cast<int32_t>(t + __builtin_ctz(m)));
  }
  for (; t < n; ++t) {
    const double a = approx[t], b = bound[t];
    if (a - b > in_above) sure->push_back(static_cast<int32_t>(t));
    else if (a + b >= out_below) unsure->push_back(static_cast<int32_t>(t));
  }
}

}  // namespace

namespace {

// Working vectors of one level of SelectTopK (the refinement nests one level).
struct TopKScratch {
  std::vector<int32_t> sure, unsure, order, ids, picked;
  std::vector<float> exact, approx, bound, values;
  std::vector<float> fine;  // the fp32 pass's approximations, then its bounds, of the refined keys
};

// The fp32 pass's approximations and bounds of keys sel[0..n) (any keys, ascending or not):
// blocks of 16 through the lane kernel, the rest key by key.
void FineApproxAt(const KvTokenView& kv, const IndexerQuery& q, const int32_t* sel, int64_t n, float* approx,
                  float* bound) {
  const int64_t dim = kv.index_dim;
  int64_t j = 0;
  if (internal::ActiveIsaHasAvx512() && dim % 32 == 0 && dim <= kLaneKeysMaxDim) {
    const QueryConsts qc = Consts(q);
    const float kmul = kv.index_format == KvIndexFormat::kFp8 ? 1.0f / 256 : 1.0f;
    KeyBlock16 kb;
    for (; j + 16 <= n; j += 16) {
      const uint8_t* codes[16];
      float ks[16];
      for (int k = 0; k < 16; ++k) {
        const KvTokenView::Slot at = kv.Locate(sel[j + k]);
        codes[k] = kv.At(at, kv.idx_k_offset, kv.idx_k_stride);
        ks[k] = LoadF32(kv.At(at, kv.idx_scale_offset, kv.idx_scale_stride));
      }
      DecodeKeys16(codes, ks, dim, kv.index_format, kmul, &kb);
      ScoreKeyBlocks<1>(q, qc, &kb, kmul, approx + j, bound + j);
    }
  }
  // Single keys: fewer than the lane kernels' 16, so the fp32 block path, coarse pass or not.
  for (; j < n; ++j) IndexerScoresApprox(kv, q, sel[j], sel[j] + 1, approx + j, bound + j);
}

// Unsure keys with a nonzero coarse bound are this many or fewer: scored exactly at once (an
// exact score costs ~5 fp32 ones); more, and the fp32 pass narrows them first.
constexpr size_t kRefineMinKeys = 16;

// The k keys of ids[0..n) (key ids, ascending; null: 0..n) with the largest exact scores, ties
// to the lower id, ascending in out, from certified approximations and bounds (IndexerTopK).
// `refine`: the bounds may be the coarse pass's, so the unsure keys go through the fp32 pass
// (one nested call) before any exact score.
int64_t SelectTopK(const KvTokenView& kv, const IndexerQuery& q, const int32_t* ids, const float* approx,
                   const float* bound, int64_t n, int64_t k, bool refine, int32_t* out, int64_t* n_exact) {
  thread_local TopKScratch levels[2];
  TopKScratch& s = levels[refine ? 0 : 1];
  auto id = [ids](int32_t i) { return ids ? ids[i] : i; };
  if (k >= n) {
    for (int64_t t = 0; t < n; ++t) out[t] = id(static_cast<int32_t>(t));
    return n;
  }
  // T, T': the k-th and (k+1)-th largest approximations; B: the largest bound.
  const internal::KthLargestPair kth = internal::KthAndNextLargest(approx, n, k);
  const double t_k = kth.kth, t_k1 = kth.next;
  const double b_max = MaxOfBounds(bound, n);
  // At least k keys have exact scores >= T - B, so a key whose upper end is below is out; at
  // most k keys have upper ends above T' + B, so a key whose lower end is above is in (no key
  // beats it but those). The margin covers the double roundings of the comparisons themselves.
  const double margin = 1e-12 * (std::fabs(t_k) + std::fabs(t_k1) + b_max);
  const double out_below = t_k - b_max - margin, in_above = t_k1 + b_max + margin;
  ClassifyKeys(approx, bound, n, in_above, out_below, &s.sure, &s.unsure);
  const int64_t n_sure = static_cast<int64_t>(s.sure.size()), rest = k - n_sure;
  PDSERVE_CHECK(rest >= 0 && rest <= static_cast<int64_t>(s.unsure.size()));
  for (int32_t& i : s.sure) i = id(i);
  for (int32_t& i : s.unsure) i = id(i);
  if (rest == 0) {
    std::copy(s.sure.begin(), s.sure.end(), out);
    return k;
  }
  // A bound of 0 is an exact score already (every head's relu certainly 0): where most scores
  // are 0, most unsure keys are such ties, and only the others need a better bound.
  size_t open_keys = 0;
  if (refine)
    for (int32_t t : s.unsure) open_keys += bound[t] != 0.0f;  // ids is null here: key = position
  if (open_keys > kRefineMinKeys) {
    // The best `rest` of the unsure keys: the same problem over them, with fp32 bounds.
    PDSERVE_DCHECK(ids == nullptr);
    const int64_t m = static_cast<int64_t>(s.unsure.size());
    s.approx.resize(s.unsure.size());
    s.bound.resize(s.unsure.size());
    s.ids.clear();
    s.order.clear();
    for (int64_t i = 0; i < m; ++i) {
      const int32_t t = s.unsure[static_cast<size_t>(i)];
      s.approx[static_cast<size_t>(i)] = approx[t];
      s.bound[static_cast<size_t>(i)] = bound[t];
      if (bound[t] != 0.0f) {
        s.ids.push_back(t);
        s.order.push_back(static_cast<int32_t>(i));
      }
    }
    const int64_t n_fine = static_cast<int64_t>(s.ids.size());
    s.fine.resize(s.ids.size() * 2);
    FineApproxAt(kv, q, s.ids.data(), n_fine, s.fine.data(), s.fine.data() + n_fine);
    for (int64_t j = 0; j < n_fine; ++j) {
      s.approx[static_cast<size_t>(s.order[static_cast<size_t>(j)])] = s.fine[static_cast<size_t>(j)];
      s.bound[static_cast<size_t>(s.order[static_cast<size_t>(j)])] = s.fine[static_cast<size_t>(n_fine + j)];
    }
    s.picked.resize(static_cast<size_t>(rest));
    SelectTopK(kv, q, s.unsure.data(), s.approx.data(), s.bound.data(), m, rest, false, s.picked.data(), n_exact);
    std::merge(s.sure.begin(), s.sure.end(), s.picked.begin(), s.picked.end(), out);
    return k;
  }
  // The best `rest` of the unsure keys by exact score, ties to the lower index.
  // (A bound of 0 is an exact score already: found by position, so unmapped.)
  s.exact.resize(s.unsure.size());
  int64_t rescored = 0;
  for (size_t i = 0, j = 0; i < s.unsure.size(); ++i) {
    while (id(static_cast<int32_t>(j)) != s.unsure[i]) ++j;  // the key's position (both ascending)
    if (bound[j] == 0.0f) {
      s.exact[i] = approx[j];
    } else {
      IndexerScoresExactAt(kv, q, &s.unsure[i], 1, &s.exact[i]);
      ++rescored;
    }
  }
  if (n_exact) *n_exact += rescored;
  // v: the rest-th largest of their exact scores. Every unsure key above v is in, and the ties
  // at v fill the places left in key order (unsure is ascending): what sorting by (score
  // descending, key ascending) picks, found with one nth_element over the scores and a pass,
  // already ascending. (Where most scores are 0, ~1000 ties: nth_element and sort over the
  // keys with that comparator were most of the call.)
  s.order.clear();
  if (rest < static_cast<int64_t>(s.unsure.size())) {
    s.values.assign(s.exact.begin(), s.exact.end());
    std::nth_element(s.values.begin(), s.values.begin() + (rest - 1), s.values.end(), std::greater<float>());
    const float v = s.values[static_cast<size_t>(rest - 1)];
    int64_t ties = rest;
    for (float e : s.exact) ties -= e > v;
    for (size_t i = 0; i < s.unsure.size(); ++i) {
      if (s.exact[i] > v || (s.exact[i] == v && ties-- > 0)) s.order.push_back(s.unsure[i]);
    }
  } else {
    s.order.assign(s.unsure.begin(), s.unsure.end());
  }
  PDSERVE_CHECK(static_cast<int64_t>(s.order.size()) == rest);
  std::merge(s.sure.begin(), s.sure.end(), s.order.begin(), s.order.end(), out);
  return k;
}

}  // namespace

int64_t IndexerTopK(const KvTokenView& kv, const IndexerQuery& q, const float* approx, const float* bound, int64_t n,
                    int64_t k, int32_t* out, int64_t* n_exact) {
  if (n_exact) *n_exact = 0;
  if (k <= 0 || n <= 0) return 0;
  return SelectTopK(kv, q, nullptr, approx, bound, n, k, UseCoarse(kv, q), out, n_exact);
}

}  // namespace pdserve::kernels
