// Tests of kernels/mla_attention.h: for every cache format and random block sizes, a paged view
// (shuffled blocks, one array per component) reads exactly what a contiguous record view reads;
// the encoders round-trip as documented; the attention head and indexer scores match plain
// scalar loops.
#include "kernels/mla_attention.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <tuple>
#include <random>
#include <vector>

#include "common/dtype.h"
#include "kernels/elementwise.h"
#include "common/thread_pool.h"
#include "kernels/fp8_quant.h"
#include "kernels/gemm.h"
#include "kernels/isa_test_util.h"
#include "kernels/kernel_table.h"

namespace pdserve::kernels {
namespace {

constexpr int64_t kLatent = 256, kRope = 64, kIndex = 128;

struct Fields {
  int64_t code, scale, kpe, idx, idx_scale;  // bytes per token of each component
  int64_t Record() const { return code + scale + kpe + idx + idx_scale; }
};
Fields FieldsFor(KvLatentFormat f) {
  return {LatentCodeBytes(f, kLatent), LatentScaleBytes(f, kLatent), kRope * 2, kIndex, 4};
}

// Records back to back (one token's fields together), no block table.
KvTokenView RecordView(const uint8_t* base, KvLatentFormat lf, KvIndexFormat xf, int64_t n_tokens) {
  const Fields f = FieldsFor(lf);
  KvTokenView v;
  v.base = base;
  v.block_tokens = n_tokens;
  v.latent_offset = 0;
  v.latent_scale_offset = f.code;
  v.kpe_offset = f.code + f.scale;
  v.idx_k_offset = v.kpe_offset + f.kpe;
  v.idx_scale_offset = v.idx_k_offset + f.idx;
  v.latent_stride = v.latent_scale_stride = v.kpe_stride = v.idx_k_stride = v.idx_scale_stride = f.Record();
  v.latent_dim = kLatent;
  v.rope_dim = kRope;
  v.index_dim = kIndex;
  v.latent_format = lf;
  v.index_format = xf;
  return v;
}

// Blocks of B tokens; inside a block one array per component ([component][token]).
KvTokenView PagedView(const uint8_t* base, const int32_t* table, int64_t B, KvLatentFormat lf, KvIndexFormat xf) {
  const Fields f = FieldsFor(lf);
  KvTokenView v = RecordView(base, lf, xf, 1);
  v.block_table = table;
  v.block_tokens = B;
  v.block_stride = B * f.Record();
  v.latent_offset = 0;
  v.latent_scale_offset = B * f.code;
  v.kpe_offset = B * (f.code + f.scale);
  v.idx_k_offset = v.kpe_offset + B * f.kpe;
  v.idx_scale_offset = v.idx_k_offset + B * f.idx;
  v.latent_stride = f.code;
  v.latent_scale_stride = f.scale;
  v.kpe_stride = f.kpe;
  v.idx_k_stride = f.idx;
  v.idx_scale_stride = f.idx_scale;
  return v;
}

void FillRecord(uint8_t* r, KvLatentFormat lf, KvIndexFormat xf, std::mt19937& rng) {
  const Fields f = FieldsFor(lf);
  std::normal_distribution<float> nd;
  std::vector<float> lat(kLatent);
  for (auto& x : lat) x = RoundToBf16(nd(rng));
  EncodeLatent(lf, lat.data(), kLatent, r, r + f.code);
  for (int i = 0; i < kRope; ++i) {
    const uint16_t b = F32ToBf16Bits(nd(rng));
    std::memcpy(r + f.code + f.scale + 2 * i, &b, 2);
  }
  std::vector<float> k(kIndex);
  for (auto& x : k) x = RoundToBf16(nd(rng));
  EncodeIndexKey(xf, k.data(), kIndex, r + f.code + f.scale + f.kpe, r + f.code + f.scale + f.kpe + f.idx);
}

// Copies token t's record fields into its paged place.
void Scatter(const uint8_t* rec, const KvTokenView& pv, int64_t t, const Fields& f) {
  auto put = [&](int64_t off, int64_t stride, int64_t src, int64_t n) {
    std::memcpy(const_cast<uint8_t*>(pv.Field(t, off, stride)), rec + src, static_cast<size_t>(n));
  };
  put(pv.latent_offset, pv.latent_stride, 0, f.code);
  put(pv.latent_scale_offset, pv.latent_scale_stride, f.code, f.scale);
  put(pv.kpe_offset, pv.kpe_stride, f.code + f.scale, f.kpe);
  put(pv.idx_k_offset, pv.idx_k_stride, f.code + f.scale + f.kpe, f.idx);
  put(pv.idx_scale_offset, pv.idx_scale_stride, f.code + f.scale + f.kpe + f.idx, f.idx_scale);
}

TEST(MlaAttentionTest, PagedEqualsContiguousForEveryFormatAndBlockSize) {
  std::mt19937 rng(5);
  for (auto lf : {KvLatentFormat::kFp8Blockwise, KvLatentFormat::kBf16, KvLatentFormat::kInt8PerToken}) {
    for (auto xf : {KvIndexFormat::kFp8, KvIndexFormat::kInt8}) {
      for (int trial = 0; trial < 4; ++trial) {
        const int64_t n_tokens = 1 + static_cast<int64_t>(rng() % 90);
        const int64_t B = 1 + static_cast<int64_t>(rng() % 20);
        const int64_t n_blocks = (n_tokens + B - 1) / B;
        const Fields f = FieldsFor(lf);
        std::vector<uint8_t> contiguous(static_cast<size_t>(n_tokens * f.Record()));
        for (int64_t t = 0; t < n_tokens; ++t) FillRecord(&contiguous[t * f.Record()], lf, xf, rng);
        std::vector<int32_t> table(static_cast<size_t>(n_blocks));
        std::iota(table.begin(), table.end(), 0);
        std::shuffle(table.begin(), table.end(), rng);
        std::vector<uint8_t> paged(static_cast<size_t>((n_blocks + 1) * B * f.Record()), 0xee);
        const KvTokenView cv = RecordView(contiguous.data(), lf, xf, n_tokens);
        const KvTokenView pv = PagedView(paged.data(), table.data(), B, lf, xf);
        for (int64_t t = 0; t < n_tokens; ++t) Scatter(&contiguous[t * f.Record()], pv, t, f);

        std::vector<int32_t> sel;
        for (int64_t t = 0; t < n_tokens; ++t)
          if (rng() % 2 == 0 || t == n_tokens - 1) sel.push_back(static_cast<int32_t>(t));
        const int64_t n = static_cast<int64_t>(sel.size());
        std::vector<float> c1(n * kLatent), k1(n * kRope), c2(n * kLatent), k2(n * kRope);
        GatherLatent(cv, sel.data(), n, c1.data(), k1.data());
        GatherLatent(pv, sel.data(), n, c2.data(), k2.data());
        EXPECT_EQ(c1, c2);
        EXPECT_EQ(k1, k2);

        const int n_heads = trial % 2 ? 9 : 3;  // 9: blocks of 4 heads plus a tail
        std::vector<double> qd(n_heads * kIndex);
        for (auto& q : qd) {
          uint8_t code = static_cast<uint8_t>(rng() & 0xff);
          if ((code & 0x7f) == 0x7f) code = 0;
          q = Fp8E4M3ToF32(code);
        }
        std::vector<float> w(n_heads);
        for (int h = 0; h < n_heads; ++h) w[h] = 0.3f - 0.11f * h;
        std::vector<float> s1(n_tokens), s2(n_tokens, -1.0f);
        IndexerScores(cv, qd.data(), w.data(), n_heads, 0, n_tokens, s1.data());
        const int64_t mid = n_tokens / 2;  // two ranges cover all keys
        IndexerScores(pv, qd.data(), w.data(), n_heads, 0, mid, s2.data());
        IndexerScores(pv, qd.data(), w.data(), n_heads, mid, n_tokens, s2.data());
        EXPECT_EQ(s1, s2);
        // Against a plain loop: exact double dots, fp32 head sum in order.
        for (int64_t t = 0; t < n_tokens; ++t) {
          const uint8_t* rec = &contiguous[t * f.Record()];
          const uint8_t* k = rec + f.code + f.scale + f.kpe;
          float ks;
          std::memcpy(&ks, k + kIndex, 4);
          float acc = 0;
          for (int h = 0; h < n_heads; ++h) {
            double dot = 0;
            for (int64_t i = 0; i < kIndex; ++i)
              dot += qd[h * kIndex + i] * (xf == KvIndexFormat::kFp8 ? double(Fp8E4M3ToF32(k[i])) : double(int8_t(k[i])));
            acc = std::fma(std::max(static_cast<float>(dot), 0.0f), w[h], acc);
          }
          EXPECT_EQ(s1[t], acc * ks) << t;
        }
      }
    }
  }
}

TEST(MlaAttentionTest, EncodersRoundTrip) {
  std::mt19937 rng(9);
  std::normal_distribution<float> nd;
  std::vector<float> x(kLatent), y(kLatent), kpe(kRope);
  for (auto& v : x) v = RoundToBf16(nd(rng) * 3.0f);
  int32_t zero = 0;
  for (auto lf : {KvLatentFormat::kFp8Blockwise, KvLatentFormat::kBf16, KvLatentFormat::kInt8PerToken}) {
    const Fields f = FieldsFor(lf);
    std::vector<uint8_t> rec(static_cast<size_t>(f.Record()), 0);
    EncodeLatent(lf, x.data(), kLatent, rec.data(), rec.data() + f.code);
    GatherLatent(RecordView(rec.data(), lf, KvIndexFormat::kFp8, 1), &zero, 1, y.data(), kpe.data());
    if (lf == KvLatentFormat::kFp8Blockwise) {
      std::vector<float> want = x;
      Fp8RoundTripInPlace(want.data(), kLatent);
      EXPECT_EQ(y, want);
    } else if (lf == KvLatentFormat::kBf16) {
      EXPECT_EQ(y, x);  // bf16 values are stored exactly
    } else {
      float amax = 0;
      for (float v : x) amax = std::max(amax, std::fabs(v));
      for (int64_t i = 0; i < kLatent; ++i) EXPECT_LE(std::fabs(y[i] - x[i]), amax / 254.0f * 1.0001f) << i;
    }
  }
}

TEST(MlaAttentionTest, AbsorbedHeadMatchesScalarLoop) {
  std::mt19937 rng(7);
  std::normal_distribution<float> nd;
  const int64_t n = 19;
  std::vector<float> c(n * kLatent), kpe(n * kRope);
  for (auto& v : c) v = RoundToBf16(nd(rng));
  for (auto& v : kpe) v = RoundToBf16(nd(rng));
  std::vector<float> q_lat(kLatent), q_pe(kRope), o(kLatent), scratch(n);
  for (auto& v : q_lat) v = RoundToBf16(nd(rng) * 0.1f);
  for (auto& v : q_pe) v = RoundToBf16(nd(rng) * 0.1f);
  AbsorbedAttentionHead(q_lat.data(), q_pe.data(), c.data(), kpe.data(), n, kLatent, kRope, 0.07f, o.data(), scratch.data());
  // Scalar: same rounding points, double accumulation for the dots.
  std::vector<double> p(n);
  double mx = -1e30;
  for (int64_t j = 0; j < n; ++j) {
    double a = 0, b = 0;
    for (int64_t i = 0; i < kLatent; ++i) a += double(q_lat[i]) * c[j * kLatent + i];
    for (int64_t i = 0; i < kRope; ++i) b += double(q_pe[i]) * kpe[j * kRope + i];
    p[j] = RoundToBf16(RoundToBf16(RoundToBf16(float(a)) + RoundToBf16(float(b))) * 0.07f);
    mx = std::max(mx, p[j]);
  }
  double z = 0;
  for (auto& v : p) z += (v = std::exp(v - mx));
  for (int64_t i = 0; i < kLatent; ++i) {
    double want = 0;
    for (int64_t j = 0; j < n; ++j) want += RoundToBf16(float(p[j] / z)) * c[j * kLatent + i];
    EXPECT_NEAR(o[i], want, 1e-2 * (std::fabs(want) + 0.05)) << i;
  }
}

// The vector fp8 decode agrees with the decode table on every code the quantizers write.
// The expanded (non-absorbed) head kernel against the loop it replaced in the model, bit for
// bit: every dot is DotF32's, every output one Axpy chain from zero; the blocked sizes and the
// fallback for odd ones, key counts around the block of 4, keys in any order.
TEST(MlaAttentionTest, ExpandedHeadEqualsDotAxpyLoopBitwise) {
  std::mt19937 rng(7);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  auto bf16 = [&] { return RoundToBf16(nd(rng)); };
  for (auto [dn, dr, dv] : {std::tuple<int64_t, int64_t, int64_t>{128, 64, 128}, {32, 16, 72}, {40, 8, 12}}) {
    const int64_t T = 700, H = 3, stride = H * (dn + dv);
    std::vector<float> kv(static_cast<size_t>(T * stride)), kpe(static_cast<size_t>(T * dr)), q(static_cast<size_t>(dn + dr));
    for (float& x : kv) x = bf16();
    for (float& x : kpe) x = bf16();
    for (float& x : q) x = bf16();
    std::vector<int32_t> all(static_cast<size_t>(T));
    std::iota(all.begin(), all.end(), 0);
    std::shuffle(all.begin(), all.end(), rng);
    const float scale = 0.0883883f;
    for (int64_t n : {0, 1, 3, 4, 5, 8, 513}) {
      for (int64_t h = 0; h < H; ++h) {
        const float* kvh = kv.data() + h * (dn + dv);
        std::vector<float> p(static_cast<size_t>(n) + 1), want(static_cast<size_t>(dv)), got(static_cast<size_t>(dv), -1.0f);
        for (int64_t j = 0; j < n; ++j) {
          const int64_t t = all[j];
          const float dot = DotF32(q.data(), kvh + t * stride, dn) + DotF32(q.data() + dn, &kpe[t * dr], dr);
          p[j] = RoundToBf16(RoundToBf16(dot) * scale);
        }
        Softmax(p.data(), n);
        RoundToBf16InPlace(p.data(), n);
        for (int64_t j = 0; j < n; ++j) Axpy(p[j], kvh + all[j] * stride + dn, dv, want.data());
        RoundToBf16InPlace(want.data(), dv);
        std::vector<float> scratch(static_cast<size_t>(n) + 1);
        ExpandedAttentionHead(q.data(), kvh, stride, kpe.data(), all.data(), n, dn, dr, dv, scale, got.data(),
                              scratch.data());
        ASSERT_EQ(0, std::memcmp(want.data(), got.data(), want.size() * sizeof(float)))
            << "dims " << dn << "/" << dr << "/" << dv << ", " << n << " keys, head " << h;
      }
    }
  }
}

TEST(MlaAttentionTest, Fp8DecodeMatchesTableForEveryCode) {
  const Fields f = FieldsFor(KvLatentFormat::kFp8Blockwise);
  std::vector<uint8_t> rec(static_cast<size_t>(f.Record()), 0);
  std::vector<uint8_t> codes;
  for (int c = 0; c < 256; ++c)
    if ((c & 0x7f) != 0x7f) codes.push_back(static_cast<uint8_t>(c));
  for (int64_t i = 0; i < kLatent; ++i) rec[i] = codes[i % codes.size()];
  for (int64_t i = 0; i < kIndex; ++i) rec[f.code + f.scale + f.kpe + i] = codes[(i + 128) % codes.size()];
  const float scales[2] = {0.015625f, 1024.0f};
  std::memcpy(&rec[f.code], scales, 8);
  const float ks = 0.25f;
  std::memcpy(&rec[f.code + f.scale + f.kpe + f.idx], &ks, 4);
  const KvTokenView v = RecordView(rec.data(), KvLatentFormat::kFp8Blockwise, KvIndexFormat::kFp8, 1);
  std::vector<float> c(kLatent), kpe(kRope);
  const int32_t zero = 0;
  GatherLatent(v, &zero, 1, c.data(), kpe.data());
  for (int64_t i = 0; i < kLatent; ++i) EXPECT_EQ(c[i], Fp8E4M3ToF32(rec[i]) * scales[i / 128]) << i;
  std::vector<double> qd(kIndex);
  for (int64_t i = 0; i < kIndex; ++i) qd[i] = (i % 5 == 0) ? 0.0 : Fp8E4M3ToF32(codes[(i * 7) % codes.size()]);
  const float w = 1.0f;
  float got = 0;
  IndexerScores(v, qd.data(), &w, 1, 0, 1, &got);
  double dot = 0;
  for (int64_t i = 0; i < kIndex; ++i) dot += qd[i] * Fp8E4M3ToF32(rec[f.code + f.scale + f.kpe + i]);
  EXPECT_EQ(got, std::fma(std::max(static_cast<float>(dot), 0.0f), 1.0f, 0.0f) * ks);
}

// Batched query absorption is bitwise the AxpyRow loop it replaces (bf16 and f32 weights), on
// every ISA level.
TEST(MlaAttentionTest, AbsorbQueriesEqualsAxpyRowLoop) {
  std::mt19937 rng(13);
  std::normal_distribution<float> nd;
  // Row counts hit the 8-row (AVX-512), 4-row and lone-row kernels; widths hit every strip
  // width (AVX-512: 128, 64 and 32 columns; AVX2: 64, 16, 8) and the scalar path (a width not
  // a multiple of 8).
  ForEachIsa([&](Isa isa) {
    const Isa previous = internal::TEST_SetActiveIsa(isa);
    for (auto [rows, n_d, dim, bf16] : {std::tuple{7, 128, 512, true}, std::tuple{3, 48, 260, false},
                                        std::tuple{1, 5, 13, true}, std::tuple{5, 20, 88, false},
                                        std::tuple{1, 33, 152, true}, std::tuple{19, 128, 512, true},
                                        std::tuple{13, 40, 88, false}, std::tuple{9, 24, 152, true},
                                        std::tuple{10, 16, 120, false}}) {
      const int64_t ld = dim + 6;
      std::vector<uint16_t> wb(n_d * ld);
      std::vector<float> wf(n_d * ld);
      for (size_t i = 0; i < wb.size(); ++i) {
        wb[i] = F32ToBf16Bits(nd(rng) * 0.1f);
        wf[i] = nd(rng) * 0.1f;
      }
      const void* w = bf16 ? static_cast<const void*>(wb.data()) : static_cast<const void*>(wf.data());
      std::vector<float> q(rows * (n_d + 3));
      for (auto& v : q) v = RoundToBf16(nd(rng));
      std::vector<float> want(rows * dim, 0.0f), got(rows * dim, -1.0f);
      std::vector<const float*> q_rows;
      std::vector<float*> out_rows;
      for (int r = 0; r < rows; ++r) {
        for (int d = 0; d < n_d; ++d)
          AxpyRow(q[r * (n_d + 3) + d],
                  bf16 ? static_cast<const void*>(&wb[d * ld]) : static_cast<const void*>(&wf[d * ld]), bf16, dim,
                  &want[r * dim]);
        q_rows.push_back(&q[r * (n_d + 3)]);
        out_rows.push_back(&got[r * dim]);
      }
      AbsorbQueries(q_rows.data(), rows, w, bf16, ld, n_d, dim, out_rows.data());
      EXPECT_EQ(got, want) << IsaName(isa) << " " << rows << " " << n_d << " " << dim;
    }
    internal::TEST_SetActiveIsa(previous);
  });
}

// The model's absorption with W_uk prepacked transposed (model/weights.h kv_b_uk_t): one GEMM
// per head (on one thread, or cut across two) is bitwise AbsorbQueries over W_uk's rows, for a
// lone decode row, decode batches and a prefill chunk, on every ISA level.
TEST(MlaAttentionTest, TransposedAbsorptionGemmEqualsAbsorbQueries) {
  std::mt19937 rng(14);
  std::normal_distribution<float> nd;
  const int64_t H = 3, dn = 128, dv = 32, latent = 512, dqk = dn + 64;
  std::vector<uint16_t> kv_b(H * (dn + dv) * latent);  // per head: dn W_uk rows, then dv W_uv rows
  for (auto& v : kv_b) v = F32ToBf16Bits(nd(rng) * 0.05f);
  std::vector<PackedBf16Weights> uk_t;
  for (int64_t h = 0; h < H; ++h) {
    std::vector<uint16_t> t(latent * dn);
    for (int64_t d = 0; d < dn; ++d)
      for (int64_t j = 0; j < latent; ++j) t[j * dn + d] = kv_b[(h * (dn + dv) + d) * latent + j];
    uk_t.push_back(PackedBf16Weights::Pack({DType::kBF16, t.data(), latent, dn, dn}, nullptr));
  }
  ThreadPool pool(2);
  ForEachIsa([&](Isa isa) {
    const Isa previous = internal::TEST_SetActiveIsa(isa);
    for (int64_t rows : {1, 3, 17, 64, 200}) {
      std::vector<float> q(rows * H * dqk);
      for (auto& v : q) v = RoundToBf16(nd(rng));
      std::vector<float> want(rows * H * latent, 0.0f), got(rows * H * latent, -1.0f),
          got_split(rows * H * latent, -1.0f);
      for (int64_t h = 0; h < H; ++h) {
        std::vector<const float*> q_rows;
        std::vector<float*> out_rows;
        for (int64_t r = 0; r < rows; ++r) {
          q_rows.push_back(&q[(r * H + h) * dqk]);
          out_rows.push_back(&want[(r * H + h) * latent]);
        }
        AbsorbQueries(q_rows.data(), rows, &kv_b[h * (dn + dv) * latent], true, latent, dn, latent, out_rows.data());
        Gemm(&q[h * dqk], rows, H * dqk, uk_t[h].view(), &got[h * latent], H * latent, nullptr);
        Gemm(&q[h * dqk], rows, H * dqk, uk_t[h].view(), &got_split[h * latent], H * latent, &pool);
      }
      EXPECT_EQ(got, want) << IsaName(isa) << " rows " << rows;
      EXPECT_EQ(got_split, want) << IsaName(isa) << " rows " << rows << ", two threads";
    }
    internal::TEST_SetActiveIsa(previous);
  });
}

// The multi-head kernel is bitwise the per-head one, with odd sizes hitting every tail.
TEST(MlaAttentionTest, AllHeadsKernelEqualsPerHeadBitwise) {
  std::mt19937 rng(12);
  std::normal_distribution<float> nd;
  for (auto [H, latent, rope, n] : {std::tuple{16, 512, 64, 37}, std::tuple{3, 136, 40, 5}, std::tuple{7, 256, 32, 1},
                                    std::tuple{5, 13, 3, 9}}) {
    const int64_t q_stride = latent + 11, pe_stride = rope + 5, o_stride = latent + 3;
    std::vector<float> q_lat(H * q_stride), q_pe(H * pe_stride), c(n * latent), kpe(n * rope);
    for (auto& v : q_lat) v = RoundToBf16(nd(rng) * 0.2f);
    for (auto& v : q_pe) v = RoundToBf16(nd(rng) * 0.2f);
    for (auto& v : c) v = RoundToBf16(nd(rng));
    for (auto& v : kpe) v = RoundToBf16(nd(rng));
    std::vector<float> want(H * o_stride, 0.0f), got(H * o_stride, 0.0f), scratch(H * n);
    for (int h = 0; h < H; ++h)
      AbsorbedAttentionHead(&q_lat[h * q_stride], &q_pe[h * pe_stride], c.data(), kpe.data(), n, latent, rope, 0.09f,
                            &want[h * o_stride], scratch.data());
    AbsorbedAttentionHeads(q_lat.data(), q_stride, q_pe.data(), pe_stride, H, c.data(), kpe.data(), n, latent, rope,
                           0.09f, got.data(), o_stride, scratch.data());
    EXPECT_EQ(got, want) << "H " << H << " latent " << latent;
  }
}

// The staged kernel reads each format's stage and computes bitwise what the fp32 gather
// path computes (every format, head tails, odd key counts, the unstaged fallback's sizes).
// Staging decodes every fp8 code (subnormals, zeros of both signs, the largest) to the bf16 of
// table[code] * scale, with power-of-two scales from tiny to large, on every level.
TEST(MlaAttentionTest, StagingDecodesEveryFp8CodeOnEveryIsa) {
  const Fields f = FieldsFor(KvLatentFormat::kFp8Blockwise);
  std::vector<uint8_t> codes;
  for (int c = 0; c < 256; ++c)
    if ((c & 0x7f) != 0x7f) codes.push_back(static_cast<uint8_t>(c));  // 0x7f / 0xff: NaN
  const std::vector<std::pair<float, float>> scale_pairs = {{0.015625f, 1024.0f}, {std::ldexp(1.0f, -100), std::ldexp(1.0f, 90)}};
  ForEachIsa([&](Isa isa) {
    const Isa previous = internal::TEST_SetActiveIsa(isa);
    for (const auto& [s0, s1] : scale_pairs) {
      const int64_t n_tokens = static_cast<int64_t>((codes.size() + kLatent - 1) / kLatent) + 1;
      std::vector<uint8_t> records(static_cast<size_t>(n_tokens * f.Record()), 0);
      for (int64_t t = 0; t < n_tokens; ++t) {
        uint8_t* rec = &records[static_cast<size_t>(t * f.Record())];
        for (int64_t i = 0; i < kLatent; ++i) rec[i] = codes[static_cast<size_t>(t * kLatent + i) % codes.size()];
        const float scales[2] = {s0, s1};
        std::memcpy(&rec[f.code], scales, 8);
      }
      const KvTokenView v = RecordView(records.data(), KvLatentFormat::kFp8Blockwise, KvIndexFormat::kFp8, n_tokens);
      std::vector<int32_t> sel(static_cast<size_t>(n_tokens));
      std::iota(sel.rbegin(), sel.rend(), 0);  // any order
      LatentStage stage;
      PrepareLatentStage(v, n_tokens, &stage);
      StageLatent(v, sel.data(), 0, n_tokens, &stage);
      for (int64_t j = 0; j < n_tokens; ++j) {
        const uint8_t* rec = &records[static_cast<size_t>(sel[j] * f.Record())];
        for (int64_t i = 0; i < kLatent; ++i) {
          const float want = Fp8E4M3ToF32(rec[i]) * (i < 128 ? s0 : s1);
          ASSERT_EQ(stage.LatentBits(j, i), F32ToBf16Bits(want))
              << "code " << int{rec[i]} << " scale " << (i < 128 ? s0 : s1);
        }
      }
    }
    internal::TEST_SetActiveIsa(previous);
  });
}

// The byte-table staging (AVX512-VBMI) writes the bits of the fp16 route it replaces for every
// code, at scales in its range (both ends) and outside it (where it hands the block back to
// the fp16 route: the ends + 1, non-powers of two).
TEST(MlaAttentionTest, StagingByteTablesEqualTheFp16Route) {
  if (!__builtin_cpu_supports("avx512vbmi") || ActiveIsa() < Isa::kAvx512) {
    GTEST_SKIP() << "LOUD SKIP: this CPU (or PDSERVE_ISA) has no AVX512-VBMI: the byte-table latent staging is not run";
  }
  const Fields f = FieldsFor(KvLatentFormat::kFp8Blockwise);
  const std::vector<float> scales = {1.0f,  std::ldexp(1.0f, -117), std::ldexp(1.0f, 119), std::ldexp(1.0f, -118),
                                     std::ldexp(1.0f, 100), 0.75f, std::ldexp(1.5f, -20), 0.015625f};
  const int64_t n_tokens = 2 * static_cast<int64_t>(scales.size());
  std::vector<uint8_t> records(static_cast<size_t>(n_tokens * f.Record()), 0);
  for (int64_t t = 0; t < n_tokens; ++t) {
    uint8_t* rec = &records[static_cast<size_t>(t * f.Record())];
    for (int64_t i = 0; i < kLatent; ++i) rec[i] = static_cast<uint8_t>((t * kLatent + i * 3) & 0xff);  // every code
    const float block_scales[2] = {scales[static_cast<size_t>(t / 2)], scales[static_cast<size_t>((t + 3) % scales.size())]};
    std::memcpy(&rec[f.code], block_scales, 8);
  }
  const KvTokenView v = RecordView(records.data(), KvLatentFormat::kFp8Blockwise, KvIndexFormat::kFp8, n_tokens);
  std::vector<int32_t> sel(static_cast<size_t>(n_tokens));
  std::iota(sel.begin(), sel.end(), 0);
  auto stage_with = [&](bool tables) {
    const bool previous = internal::TEST_SetStagingByteTables(tables);
    LatentStage stage;
    PrepareLatentStage(v, n_tokens, &stage);
    StageLatent(v, sel.data(), 0, n_tokens, &stage);
    internal::TEST_SetStagingByteTables(previous);
    return std::vector<uint16_t>(stage.c16.begin(), stage.c16.begin() + n_tokens * kLatent);
  };
  const std::vector<uint16_t> want = stage_with(false), got = stage_with(true);
  for (int64_t j = 0; j < n_tokens; ++j)
    for (int64_t i = 0; i < kLatent; ++i) {
      const size_t at = static_cast<size_t>(j * kLatent + LatentStage::PairedIndex(i));
      ASSERT_EQ(got[at], want[at]) << "key " << j << " value " << i;
    }
}

TEST(MlaAttentionTest, StagedEqualsGatheredBitwise) {
  ForEachIsa([](Isa isa) {
    const Isa previous = internal::TEST_SetActiveIsa(isa);
    std::mt19937 rng(21);
    std::normal_distribution<float> nd;
    for (auto lf : {KvLatentFormat::kFp8Blockwise, KvLatentFormat::kBf16, KvLatentFormat::kInt8PerToken}) {
      const int64_t n_tokens = 700;
      const Fields f = FieldsFor(lf);
      std::vector<uint8_t> records(static_cast<size_t>(n_tokens * f.Record()));
      for (int64_t t = 0; t < n_tokens; ++t) FillRecord(&records[t * f.Record()], lf, KvIndexFormat::kFp8, rng);
      // A rope part of 16 values (not a multiple of 32) leaves the stage in the plain layout.
      for (int64_t rope : {kRope, int64_t{16}})
      for (int64_t H : {32, 24, 16, 9, 3, 1})
        for (int64_t n : {1, 5, 37, 512}) {
          KvTokenView view = RecordView(records.data(), lf, KvIndexFormat::kFp8, n_tokens);
          view.rope_dim = rope;
          std::vector<int32_t> sel;
          for (int64_t j = 0; j < n; ++j) sel.push_back(static_cast<int32_t>((j * 7919) % n_tokens));
          const int64_t q_stride = kLatent + 5, pe_stride = kRope + 3, o_stride = kLatent + 2;
          std::vector<float> q_lat(H * q_stride), q_pe(H * pe_stride);
          for (auto& v : q_lat) v = RoundToBf16(nd(rng) * 0.2f);
          for (auto& v : q_pe) v = RoundToBf16(nd(rng) * 0.2f);
          std::vector<float> c(n * kLatent), kpe(n * rope), scratch(2 * H * n);
          GatherLatent(view, sel.data(), n, c.data(), kpe.data());
          std::vector<float> want(H * o_stride, 0.0f), got(H * o_stride, 0.0f);
          AbsorbedAttentionHeads(q_lat.data(), q_stride, q_pe.data(), pe_stride, H, c.data(), kpe.data(), n, kLatent, rope,
                                 0.07f, want.data(), o_stride, scratch.data());
          LatentStage stage;
          PrepareLatentStage(view, n, &stage);
          ASSERT_EQ(stage.paired, rope % 32 == 0);
          StageLatent(view, sel.data(), 0, n / 2, &stage);  // in two ranges, as threads would
          StageLatent(view, sel.data(), n / 2, n, &stage);
          StagedAttentionHeads(stage, q_lat.data(), q_stride, q_pe.data(), pe_stride, H, 0.07f, got.data(), o_stride,
                               scratch.data());
          ASSERT_EQ(got, want) << "format " << static_cast<int>(lf) << " rope " << rope << " H " << H << " n " << n;
        }
    }
    internal::TEST_SetActiveIsa(previous);
  });
}

}  // namespace
}  // namespace pdserve::kernels
