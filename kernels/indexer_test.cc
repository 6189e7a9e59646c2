// Tests of kernels/indexer.h against the scalar reference (kernels/ref/indexer_ref.h): the
// approximate scores stay within their certified bounds, and the selection equals the exact
// scores' top-k for both key formats, odd sizes, ties (repeated keys), zero keys, negative head
// weights and keys spanning the whole e4m3 range. To add a case: add a KeyKind or a size below.
#include "kernels/indexer.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <algorithm>
#include <numeric>
#include <random>
#include <utility>
#include <vector>

#include "kernels/fp8_quant.h"
#include "kernels/isa_test_util.h"
#include "kernels/kernel_table.h"
#include "kernels/ref/indexer_ref.h"

namespace pdserve::kernels {
namespace {

enum class KeyKind { kNormal, kWideRange, kRepeated, kSomeZero };

struct Keys {
  int64_t dim = 0;
  std::vector<uint8_t> bytes;  // records: codes [dim] | fp32 scale
  KvTokenView view;
};

std::vector<float> RandomVector(int64_t n, KeyKind kind, std::mt19937& rng) {
  std::normal_distribution<float> nd;
  std::uniform_real_distribution<float> ud(-14.0f, 9.0f);
  std::vector<float> x(static_cast<size_t>(n));
  for (auto& v : x) {
    v = nd(rng);
    if (kind == KeyKind::kWideRange) v = std::copysign(std::exp2(ud(rng)), v);
  }
  return x;
}

// n keys back to back at `records`, each its codes [dim] then its fp32 scale.
KvTokenView RecordsView(const uint8_t* records, int64_t n, int64_t dim, KvIndexFormat f) {
  KvTokenView v;
  v.base = records;
  v.block_tokens = std::max<int64_t>(n, 1);
  v.idx_k_offset = 0;
  v.idx_scale_offset = dim;
  v.idx_k_stride = v.idx_scale_stride = dim + 4;
  v.index_dim = dim;
  v.index_format = f;
  return v;
}

Keys MakeKeys(int64_t n, int64_t dim, KvIndexFormat f, KeyKind kind, std::mt19937& rng) {
  Keys k;
  k.dim = dim;
  const int64_t rec = dim + 4;
  k.bytes.resize(static_cast<size_t>(n * rec));
  for (int64_t t = 0; t < n; ++t) {
    uint8_t* r = &k.bytes[t * rec];
    if (kind == KeyKind::kRepeated && t >= 5) {  // every key equals one of the first five: exact ties
      std::memcpy(r, &k.bytes[(t % 5) * rec], static_cast<size_t>(rec));
      continue;
    }
    std::vector<float> x = RandomVector(dim, kind, rng);
    if (kind == KeyKind::kSomeZero && t % 3 == 0) std::fill(x.begin(), x.end(), 0.0f);
    EncodeIndexKey(f, x.data(), dim, r, r + dim);
  }
  k.view = RecordsView(k.bytes.data(), n, dim, f);
  return k;
}

struct Query {
  std::vector<uint8_t> q8;
  std::vector<float> w;
};

Query MakeQuery(int64_t heads, int64_t dim, KeyKind kind, std::mt19937& rng) {
  Query q;
  q.q8.resize(static_cast<size_t>(heads * dim));
  for (int64_t h = 0; h < heads; ++h) {
    std::vector<float> x = RandomVector(dim, kind, rng);
    std::vector<float> s(static_cast<size_t>(dim / kFp8BlockSize + 1));
    ActQuantFp8(x.data(), dim, &q.q8[h * dim], s.data());
  }
  std::normal_distribution<float> nd;
  for (int64_t h = 0; h < heads; ++h) q.w.push_back(nd(rng) * 0.1f);  // some negative
  return q;
}

// n prepared queries of `heads` x dim (KeyKind::kNormal) and pointers to them, as
// IndexerScoresApproxRows takes them (pointers into `queries`: move it, never copy it).
struct PreparedQueries {
  std::vector<IndexerQuery> queries;
  std::vector<const IndexerQuery*> pointers;
};
PreparedQueries PrepareQueries(int64_t n, int64_t heads, int64_t dim, std::mt19937& rng) {
  PreparedQueries p;
  p.queries.resize(static_cast<size_t>(n));
  for (auto& q : p.queries) {
    Query raw = MakeQuery(heads, dim, KeyKind::kNormal, rng);
    PrepareIndexerQuery(raw.q8.data(), raw.w.data(), heads, dim, &q);
    p.pointers.push_back(&q);
  }
  return p;
}

// Calls fn(coarse) with the coarse pass off, then on (where the CPU has it: otherwise said
// loudly, and the second call checks the fp32 pass again).
template <typename Fn>
void ForBothPasses(Fn&& fn) {
  for (bool coarse : {false, true}) {
    if (coarse && !internal::IndexerCoarseAvailable())
      std::fprintf(stderr, "\n******** NOT RUN: the indexer's coarse pass (this CPU, or PDSERVE_ISA, has no AVX512-VNNI + VBMI) ********\n\n");
    const bool previous = internal::TEST_SetIndexerCoarse(coarse);
    SCOPED_TRACE(coarse ? "coarse pass on" : "coarse pass off");
    fn(coarse);
    internal::TEST_SetIndexerCoarse(previous);
  }
}

TEST(IndexerTest, ApproxScoresStayWithinTheirBounds) {
  std::mt19937 rng(11);
  ForBothPasses([&](bool) {
  for (KvIndexFormat f : {KvIndexFormat::kFp8, KvIndexFormat::kInt8})
    for (KeyKind kind : {KeyKind::kNormal, KeyKind::kWideRange, KeyKind::kSomeZero})
      for (int64_t heads : {1, 3, 4, 16}) {
        const int64_t n = 301, dim = 128;
        Keys keys = MakeKeys(n, dim, f, kind, rng);
        Query q = MakeQuery(heads, dim, kind, rng);
        IndexerQuery iq;
        PrepareIndexerQuery(q.q8.data(), q.w.data(), heads, dim, &iq);
        std::vector<float> approx(n), bound(n);
        // Two calls over split ranges: a key's result must not depend on its range.
        IndexerScoresApprox(keys.view, iq, 0, 100, approx.data(), bound.data());
        IndexerScoresApprox(keys.view, iq, 100, n, approx.data() + 100, bound.data() + 100);
        double worst = 0.0, scale = 0.0;
        for (int64_t t = 0; t < n; ++t) scale = std::max(scale, std::fabs(static_cast<double>(
                                                  IndexerScoreRef(keys.view, q.q8.data(), q.w.data(), heads, t))));
        for (int64_t t = 0; t < n; ++t) {
          const float ref = IndexerScoreRef(keys.view, q.q8.data(), q.w.data(), heads, t);
          ASSERT_LE(std::fabs(static_cast<double>(approx[t]) - ref), bound[t])
              << "key " << t << " heads " << heads << " format " << static_cast<int>(f) << " kind " << static_cast<int>(kind);
          worst = std::max(worst, static_cast<double>(bound[t]) / scale);
          float exact;
          const int32_t sel = static_cast<int32_t>(t);
          IndexerScoresExactAt(keys.view, iq, &sel, 1, &exact);
          ASSERT_EQ(exact, ref) << "key " << t;
        }
        // The bounds are tight enough to be useful: a small fraction of the scores' range.
        if (kind == KeyKind::kNormal) {
          EXPECT_LT(worst, 1e-3) << heads;
        }
      }
  });
}

// The coarse pass runs where the CPU has it: its bounds differ from the fp32 pass's for fp8
// keys, and it leaves int8 keys to the fp32 pass (the same bits either way).
TEST(IndexerTest, CoarsePassRunsWhereTheCpuHasIt) {
  if (!internal::IndexerCoarseAvailable()) {
    std::fprintf(stderr, "\n******** NOT RUN: the indexer's coarse pass (this CPU, or PDSERVE_ISA, has no AVX512-VNNI + VBMI) ********\n\n");
    ::testing::Test::RecordProperty("not_run_coarse_pass", "this CPU, or PDSERVE_ISA, has no AVX512-VNNI + VBMI");
    return;
  }
  std::mt19937 rng(41);
  for (KvIndexFormat f : {KvIndexFormat::kFp8, KvIndexFormat::kInt8}) {
    const int64_t n = 96, dim = 128, heads = 16;
    Keys keys = MakeKeys(n, dim, f, KeyKind::kNormal, rng);
    Query q = MakeQuery(heads, dim, KeyKind::kNormal, rng);
    IndexerQuery iq;
    PrepareIndexerQuery(q.q8.data(), q.w.data(), heads, dim, &iq);
    std::vector<float> bound_fp32(n), bound_coarse(n), approx(n);
    const bool previous = internal::TEST_SetIndexerCoarse(false);
    IndexerScoresApprox(keys.view, iq, 0, n, approx.data(), bound_fp32.data());
    internal::TEST_SetIndexerCoarse(true);
    IndexerScoresApprox(keys.view, iq, 0, n, approx.data(), bound_coarse.data());
    internal::TEST_SetIndexerCoarse(previous);
    int64_t differ = 0;
    for (int64_t t = 0; t < n; ++t) differ += bound_coarse[t] != bound_fp32[t];
    if (f == KvIndexFormat::kFp8) EXPECT_GT(differ, n / 2);
    else EXPECT_EQ(bound_coarse, bound_fp32);
  }
}

// Several queries over one key range give, bit for bit, what each query's own
// IndexerScoresApprox call gives: whole 16-key blocks, a tail, one query, odd head counts,
// both key formats, on every ISA level.
TEST(IndexerTest, RowsCallEqualsOneCallPerQuery) {
  std::mt19937 rng(19);
  ForBothPasses([&](bool) {
  ForEachIsa([&](Isa isa) {
    const Isa previous = internal::TEST_SetActiveIsa(isa);
    for (KvIndexFormat f : {KvIndexFormat::kFp8, KvIndexFormat::kInt8})
      for (int64_t heads : {16, 3})
        for (int64_t n_queries : {1, 5}) {
          const int64_t n = 203, dim = 128;
          Keys keys = MakeKeys(n, dim, f, KeyKind::kNormal, rng);
          std::vector<IndexerQuery> iq(static_cast<size_t>(n_queries));
          std::vector<const IndexerQuery*> qp;
          for (auto& q : iq) {
            Query raw = MakeQuery(heads, dim, KeyKind::kNormal, rng);
            PrepareIndexerQuery(raw.q8.data(), raw.w.data(), heads, dim, &q);
            qp.push_back(&q);
          }
          for (auto [b, e] : {std::pair<int64_t, int64_t>{0, n}, {7, 7 + 48}, {40, 50}}) {
            std::vector<std::vector<float>> want_a, want_b, got_a, got_b;
            std::vector<float*> ap, bp;
            for (int64_t r = 0; r < n_queries; ++r) {
              want_a.emplace_back(e - b);
              want_b.emplace_back(e - b);
              IndexerScoresApprox(keys.view, iq[r], b, e, want_a.back().data(), want_b.back().data());
              got_a.emplace_back(e - b, -1.0f);
              got_b.emplace_back(e - b, -1.0f);
            }
            for (int64_t r = 0; r < n_queries; ++r) {
              ap.push_back(got_a[r].data());
              bp.push_back(got_b[r].data());
            }
            IndexerScoresApproxRows(keys.view, qp.data(), n_queries, b, e, ap.data(), bp.data());
            for (int64_t r = 0; r < n_queries; ++r) {
              ASSERT_EQ(got_a[r], want_a[r]) << "query " << r << " keys [" << b << ", " << e << ") heads " << heads;
              ASSERT_EQ(got_b[r], want_b[r]) << "query " << r << " keys [" << b << ", " << e << ") heads " << heads;
            }
          }
        }
    internal::TEST_SetActiveIsa(previous);
  });
  });
}

// On CPUs with AVX512-VBMI the fp8 keys are decoded by byte tables after a byte transpose; the
// approximations and bounds are bit for bit those of the fp16 route it replaces, for every
// code (NaN codes included: the quantizers never write them, but the decode stays defined),
// 64-dim multiples, whole blocks and tails, one and several queries.
// The lane kernels score 32 keys at a time (two blocks sharing each query broadcast) and a last
// 16; calls over 16-key ranges take the one-block kernel everywhere. Both must give the same bits.
TEST(IndexerTest, TwoBlockScoringEqualsOneBlockScoring) {
  std::mt19937 rng(23);
  ForBothPasses([&](bool) {
  ForEachIsa([&](Isa isa) {
    const Isa previous = internal::TEST_SetActiveIsa(isa);
    for (KvIndexFormat f : {KvIndexFormat::kFp8, KvIndexFormat::kInt8})
      for (int64_t heads : {16, 12, 3})
        for (int64_t dim : {128, 192, 256}) {  // 192: the decode route without byte tables
          const int64_t n = 16 * 9;  // four pairs and a single block in one call
          Keys keys = MakeKeys(n, dim, f, KeyKind::kNormal, rng);
          Query raw = MakeQuery(heads, dim, KeyKind::kNormal, rng);
          IndexerQuery q;
          PrepareIndexerQuery(raw.q8.data(), raw.w.data(), heads, dim, &q);
          std::vector<float> one_a(n), one_b(n), split_a(n, -1.0f), split_b(n, -1.0f);
          IndexerScoresApprox(keys.view, q, 0, n, one_a.data(), one_b.data());
          for (int64_t t = 0; t < n; t += 16)
            IndexerScoresApprox(keys.view, q, t, t + 16, split_a.data() + t, split_b.data() + t);
          ASSERT_EQ(one_a, split_a) << IsaName(isa) << " heads " << heads << " dim " << dim;
          ASSERT_EQ(one_b, split_b) << IsaName(isa) << " heads " << heads << " dim " << dim;
          // A bound of 0 certifies an exact score; the kernels must not be trivially equal there.
          int64_t nonzero = 0;
          for (float b : one_b) nonzero += b > 0.0f;
          EXPECT_GT(nonzero, n / 4);
        }
    internal::TEST_SetActiveIsa(previous);
  });
  });
}

TEST(IndexerTest, ByteTableDecodeEqualsTheFp16Route) {
  if (!__builtin_cpu_supports("avx512vbmi") || ActiveIsa() < Isa::kAvx512) {
    GTEST_SKIP() << "LOUD SKIP: this CPU (or PDSERVE_ISA) has no AVX512-VBMI: the byte-table key decode is not run";
  }
  std::mt19937 rng(23);
  for (int64_t dim : {128, 64, 192}) {
    const int64_t n = 16 * 21 + 5, rec = dim + 4;
    Keys keys;
    keys.dim = dim;
    keys.bytes.resize(static_cast<size_t>(n * rec));
    for (int64_t t = 0; t < n; ++t) {
      uint8_t* r = &keys.bytes[static_cast<size_t>(t * rec)];
      for (int64_t i = 0; i < dim; ++i) r[i] = static_cast<uint8_t>((t * 37 + i * 11 + (t >> 3)) & 0xff);  // every code
      const float scale = std::ldexp(1.0f, static_cast<int>(t % 9) - 4);
      std::memcpy(r + dim, &scale, 4);
    }
    keys.view = RecordsView(keys.bytes.data(), n, dim, KvIndexFormat::kFp8);
    const KvTokenView& v = keys.view;
    const PreparedQueries pq = PrepareQueries(3, 16, dim, rng);
    const std::vector<IndexerQuery>& iq = pq.queries;
    const std::vector<const IndexerQuery*>& qp = pq.pointers;
    auto run = [&](bool lut) {
      const bool previous = internal::TEST_SetIndexerByteLut(lut);
      const bool previous_coarse = internal::TEST_SetIndexerCoarse(false);  // the fp32 pass's decode
      std::vector<std::vector<float>> a(4, std::vector<float>(n)), b(4, std::vector<float>(n));
      IndexerScoresApprox(v, iq[0], 0, n, a[0].data(), b[0].data());
      float* ap[3] = {a[1].data(), a[2].data(), a[3].data()};
      float* bp[3] = {b[1].data(), b[2].data(), b[3].data()};
      IndexerScoresApproxRows(v, qp.data(), 3, 0, n, ap, bp);
      internal::TEST_SetIndexerCoarse(previous_coarse);
      internal::TEST_SetIndexerByteLut(previous);
      return std::make_pair(a, b);
    };
    const auto want = run(false), got = run(true);
    for (size_t r = 0; r < 4; ++r) {
      for (int64_t t = 0; t < n; ++t) {
        ASSERT_EQ(got.first[r][t], want.first[r][t]) << "dim " << dim << " call " << r << " key " << t;
        ASSERT_EQ(got.second[r][t], want.second[r][t]) << "dim " << dim << " call " << r << " key " << t;
      }
    }
  }
}

// The same keys in a paged pool (blocks of 32 tokens in shuffled order, one array per
// component inside a block, as the engine stores them) score bit for bit as in a contiguous
// cache.
TEST(IndexerTest, PagedKeysScoreAsContiguousOnes) {
  std::mt19937 rng(29);
  ForBothPasses([&](bool) {
  ForEachIsa([&](Isa isa) {
    const Isa previous = internal::TEST_SetActiveIsa(isa);
    const int64_t n = 16 * 21 + 5, dim = 128, B = 32, n_blocks = (n + B - 1) / B;
    Keys keys = MakeKeys(n, dim, KvIndexFormat::kFp8, KeyKind::kNormal, rng);
    std::vector<int32_t> table(static_cast<size_t>(n_blocks));
    std::iota(table.begin(), table.end(), 0);
    std::shuffle(table.begin(), table.end(), rng);
    const int64_t block_bytes = B * (dim + 4);
    std::vector<uint8_t> pool(static_cast<size_t>(n_blocks * block_bytes), 0xee);
    KvTokenView paged = keys.view;
    paged.base = pool.data();
    paged.block_table = table.data();
    paged.block_tokens = B;
    paged.block_stride = block_bytes;
    paged.idx_k_offset = 0;
    paged.idx_k_stride = dim;
    paged.idx_scale_offset = B * dim;
    paged.idx_scale_stride = 4;
    for (int64_t t = 0; t < n; ++t) {
      std::memcpy(const_cast<uint8_t*>(paged.Field(t, paged.idx_k_offset, paged.idx_k_stride)),
                  keys.view.Field(t, keys.view.idx_k_offset, keys.view.idx_k_stride), static_cast<size_t>(dim));
      std::memcpy(const_cast<uint8_t*>(paged.Field(t, paged.idx_scale_offset, paged.idx_scale_stride)),
                  keys.view.Field(t, keys.view.idx_scale_offset, keys.view.idx_scale_stride), 4);
    }
    const PreparedQueries pq = PrepareQueries(2, 16, dim, rng);
    const std::vector<IndexerQuery>& iq = pq.queries;
    const std::vector<const IndexerQuery*>& qp = pq.pointers;
    for (auto [b, e] : {std::pair<int64_t, int64_t>{0, n}, {32, 32 + 80}, {5, 5 + 64}}) {
      auto run = [&](const KvTokenView& v) {
        std::vector<std::vector<float>> out(6, std::vector<float>(static_cast<size_t>(e - b)));
        IndexerScoresApprox(v, iq[0], b, e, out[0].data(), out[1].data());
        float* ap[2] = {out[2].data(), out[3].data()};
        float* bp[2] = {out[4].data(), out[5].data()};
        IndexerScoresApproxRows(v, qp.data(), 2, b, e, ap, bp);
        return out;
      };
      ASSERT_EQ(run(paged), run(keys.view)) << "keys [" << b << ", " << e << ") isa " << static_cast<int>(isa);
    }
    internal::TEST_SetActiveIsa(previous);
  });
  });
}

TEST(IndexerTest, TopKEqualsTheExactScoresTopK) {
  std::mt19937 rng(5);
  ForBothPasses([&](bool) {
  for (KvIndexFormat f : {KvIndexFormat::kFp8, KvIndexFormat::kInt8})
    for (KeyKind kind : {KeyKind::kNormal, KeyKind::kWideRange, KeyKind::kRepeated, KeyKind::kSomeZero})
      for (int64_t n : {1, 7, 33, 513, 2049}) {
        const int64_t heads = 4, dim = 128;
        Keys keys = MakeKeys(n, dim, f, kind, rng);
        Query q = MakeQuery(heads, dim, kind, rng);
        IndexerQuery iq;
        PrepareIndexerQuery(q.q8.data(), q.w.data(), heads, dim, &iq);
        std::vector<float> approx(n), bound(n);
        IndexerScoresApprox(keys.view, iq, 0, n, approx.data(), bound.data());
        for (int64_t k : {int64_t{1}, int64_t{16}, int64_t{512}, n - 1, n, n + 1}) {
          if (k <= 0) continue;
          const std::vector<int32_t> ref = IndexerTopKRef(keys.view, q.q8.data(), q.w.data(), heads, n, k);
          std::vector<int32_t> got(static_cast<size_t>(std::min(k, n)), -7);
          int64_t n_exact = 0;
          const int64_t m = IndexerTopK(keys.view, iq, approx.data(), bound.data(), n, k, got.data(), &n_exact);
          ASSERT_EQ(m, static_cast<int64_t>(ref.size()));
          ASSERT_EQ(got, ref) << "n " << n << " k " << k << " format " << static_cast<int>(f) << " kind "
                              << static_cast<int>(kind);
          // Only keys near the cut are scored exactly (distinct random keys: a handful).
          if (kind == KeyKind::kNormal && n >= 513 && k < n) {
            EXPECT_LT(n_exact, 32) << n << " " << k << " format " << static_cast<int>(f);
          }
        }
      }
  });
}

// The radix-first threshold search gives nth_element's k-th and (k + 1)-th largest values:
// ties, signed zeros, negatives, one crowded bin, a wide range, ranks at either end.
TEST(IndexerTest, KthAndNextLargestEqualNthElement) {
  std::mt19937 rng(29);
  std::normal_distribution<float> nd;
  std::uniform_real_distribution<float> ud(-40.0f, 40.0f);
  auto check = [&](const std::vector<float>& v, const char* what) {
    const int64_t n = static_cast<int64_t>(v.size());
    for (int64_t k : {int64_t{1}, int64_t{2}, n / 3, n / 2, n - 2, n - 1}) {
      if (k < 1 || k >= n) continue;
      std::vector<float> copy = v;
      std::nth_element(copy.begin(), copy.begin() + (k - 1), copy.end(), std::greater<float>());
      const float want_kth = copy[static_cast<size_t>(k - 1)];
      const float want_next = *std::max_element(copy.begin() + k, copy.end());
      const internal::KthLargestPair got = internal::KthAndNextLargest(v.data(), n, k);
      // +0 and -0 are one value to nth_element: compare numerically.
      EXPECT_TRUE(got.kth == want_kth) << what << " n " << n << " k " << k << ": " << got.kth << " vs " << want_kth;
      EXPECT_TRUE(got.next == want_next) << what << " n " << n << " k " << k << ": " << got.next << " vs " << want_next;
    }
  };
  for (int64_t n : {2, 3, 17, 1000, 8192, 40000}) {
    std::vector<float> v(static_cast<size_t>(n));
    for (auto& x : v) x = nd(rng);
    check(v, "normal");
    for (auto& x : v) x = 1.0f + 1e-3f * static_cast<float>(rng() % 7);  // one bin, heavy ties
    check(v, "crowded");
    for (auto& x : v) x = (rng() % 3 == 0) ? 0.0f : (rng() % 2 ? -0.0f : -nd(rng) * nd(rng));
    check(v, "zeros");
    for (auto& x : v) x = std::copysign(std::exp2(ud(rng)), nd(rng));
    check(v, "wide");
    std::fill(v.begin(), v.end(), -3.5f);
    check(v, "equal");
  }
}

TEST(IndexerTest, EmptyAndZeroK) {
  std::mt19937 rng(3);
  Keys keys = MakeKeys(4, 128, KvIndexFormat::kFp8, KeyKind::kNormal, rng);
  Query q = MakeQuery(2, 128, KeyKind::kNormal, rng);
  IndexerQuery iq;
  PrepareIndexerQuery(q.q8.data(), q.w.data(), 2, 128, &iq);
  int32_t out[4] = {-1, -1, -1, -1};
  float a = 0, b = 0;
  EXPECT_EQ(IndexerTopK(keys.view, iq, &a, &b, 0, 4, out), 0);
  EXPECT_EQ(IndexerTopK(keys.view, iq, &a, &b, 1, 0, out), 0);
  EXPECT_EQ(out[0], -1);
}

}  // namespace
}  // namespace pdserve::kernels
