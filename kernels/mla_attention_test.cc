// Tests of kernels/mla_attention.h: a paged view (shuffled blocks) reads exactly what the
// contiguous view reads, and the attention head / indexer scores match plain scalar loops.
#include "kernels/mla_attention.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "common/dtype.h"
#include "kernels/fp8_quant.h"

namespace pdserve::kernels {
namespace {

constexpr int64_t kLatent = 256, kRope = 64, kIndex = 128;
// Record: codes, 2 scales, kpe bf16, idx codes, idx scale.
constexpr int64_t kRecord = kLatent + 8 + kRope * 2 + kIndex + 4;

KvTokenView MakeView(const uint8_t* base, const int32_t* table, int64_t block_tokens) {
  KvTokenView v;
  v.base = base;
  v.block_table = table;
  v.block_tokens = block_tokens;
  v.block_stride = block_tokens * kRecord;
  v.latent_offset = 0;
  v.latent_scale_offset = kLatent;
  v.kpe_offset = kLatent + 8;
  v.idx_k_offset = kLatent + 8 + kRope * 2;
  v.idx_scale_offset = v.idx_k_offset + kIndex;
  v.latent_stride = v.latent_scale_stride = v.kpe_stride = v.idx_k_stride = v.idx_scale_stride = kRecord;
  v.latent_dim = kLatent;
  v.rope_dim = kRope;
  v.index_dim = kIndex;
  return v;
}

void FillRecord(uint8_t* r, std::mt19937& rng) {
  std::normal_distribution<float> nd;
  std::vector<float> lat(kLatent);
  for (auto& x : lat) x = nd(rng);
  ActQuantFp8(lat.data(), kLatent, r, reinterpret_cast<float*>(r + kLatent));
  uint16_t* kpe = reinterpret_cast<uint16_t*>(r + kLatent + 8);
  for (int i = 0; i < kRope; ++i) kpe[i] = F32ToBf16Bits(nd(rng));
  std::vector<float> k(kIndex);
  for (auto& x : k) x = nd(rng);
  ActQuantFp8(k.data(), kIndex, r + kLatent + 8 + kRope * 2, reinterpret_cast<float*>(r + kLatent + 8 + kRope * 2 + kIndex));
}

TEST(MlaAttentionTest, PagedViewEqualsContiguousAndScalarLoops) {
  std::mt19937 rng(5);
  const int64_t n_tokens = 37, block = 8, n_blocks = 5;
  std::vector<uint8_t> contiguous(static_cast<size_t>(n_tokens * kRecord));
  for (int64_t t = 0; t < n_tokens; ++t) FillRecord(&contiguous[t * kRecord], rng);
  // Paged copy with blocks stored in reverse order.
  std::vector<int32_t> table = {4, 3, 2, 1, 0};
  std::vector<uint8_t> paged(static_cast<size_t>(n_blocks * block * kRecord));
  for (int64_t t = 0; t < n_tokens; ++t)
    std::copy_n(&contiguous[t * kRecord], kRecord, &paged[(table[t / block] * block + t % block) * kRecord]);
  const KvTokenView cv = MakeView(contiguous.data(), nullptr, n_tokens);
  const KvTokenView pv = MakeView(paged.data(), table.data(), block);

  std::vector<int32_t> sel = {0, 5, 8, 9, 36};
  const int64_t n = static_cast<int64_t>(sel.size());
  std::vector<float> c1(n * kLatent), k1(n * kRope), c2(n * kLatent), k2(n * kRope);
  GatherLatent(cv, sel.data(), n, c1.data(), k1.data());
  GatherLatent(pv, sel.data(), n, c2.data(), k2.data());
  EXPECT_EQ(c1, c2);
  EXPECT_EQ(k1, k2);

  std::normal_distribution<float> nd;
  std::vector<float> q_lat(kLatent), q_pe(kRope), o(kLatent), scratch(n);
  for (auto& x : q_lat) x = RoundToBf16(nd(rng) * 0.1f);
  for (auto& x : q_pe) x = RoundToBf16(nd(rng) * 0.1f);
  AbsorbedAttentionHead(q_lat.data(), q_pe.data(), c1.data(), k1.data(), n, kLatent, kRope, 0.07f, o.data(), scratch.data());
  // Scalar: same rounding points, double accumulation for the dots.
  std::vector<double> p(n);
  double mx = -1e30;
  for (int64_t j = 0; j < n; ++j) {
    double a = 0, b = 0;
    for (int64_t i = 0; i < kLatent; ++i) a += double(q_lat[i]) * c1[j * kLatent + i];
    for (int64_t i = 0; i < kRope; ++i) b += double(q_pe[i]) * k1[j * kRope + i];
    p[j] = RoundToBf16(RoundToBf16(RoundToBf16(float(a)) + RoundToBf16(float(b))) * 0.07f);
    mx = std::max(mx, p[j]);
  }
  double z = 0;
  for (auto& v : p) z += (v = std::exp(v - mx));
  for (int64_t i = 0; i < kLatent; ++i) {
    double want = 0;
    for (int64_t j = 0; j < n; ++j) want += RoundToBf16(float(p[j] / z)) * c1[j * kLatent + i];
    EXPECT_NEAR(o[i], want, 1e-2 * (std::fabs(want) + 0.05)) << i;
  }

  // Indexer scores over both views, against a direct formula.
  std::vector<double> qd(2 * kIndex);
  std::vector<uint8_t> q8(2 * kIndex);
  for (auto& c : q8) { c = static_cast<uint8_t>(rng() & 0xff); if ((c & 0x7f) == 0x7f) c = 0; }
  for (int i = 0; i < 2 * kIndex; ++i) qd[i] = Fp8E4M3ToF32(q8[i]);
  const float w[2] = {0.3f, -0.2f};
  std::vector<float> s1(n_tokens), s2(n_tokens);
  IndexerScores(cv, qd.data(), w, 2, n_tokens, s1.data());
  IndexerScores(pv, qd.data(), w, 2, n_tokens, s2.data());
  EXPECT_EQ(s1, s2);
  for (int64_t t = 0; t < n_tokens; ++t) {
    const uint8_t* rec = &contiguous[t * kRecord];
    const uint8_t* k = rec + kLatent + 8 + kRope * 2;
    float ks;
    std::memcpy(&ks, k + kIndex, 4);
    float acc = 0;
    for (int h = 0; h < 2; ++h) acc += std::max(Fp8DotExact(&q8[h * kIndex], k, kIndex), 0.0f) * w[h];
    EXPECT_EQ(s1[t], acc * ks) << t;
  }
}

}  // namespace
}  // namespace pdserve::kernels
