// Tests for kernels/gemm.h against the double-accumulating reference kernels/ref/gemm_ref.h.
#include "kernels/gemm.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "kernels/gemm_internal.h"
#include "kernels/isa_test_util.h"
#include "kernels/kernel_table.h"
#include "kernels/ref/gemm_ref.h"

namespace pdserve::kernels {
namespace {

// Allowed |y - ref| as a fraction of sum_k |x[i,k] * w[j,k]| (the scale of the rounding errors of
// any fp32 summation order). The reference holds the same bf16-widened weights, so both dtypes
// only see fp32 accumulation error: ~sqrt(n_in) * 2^-24 relative for random signs, and at most
// n_in * 2^-24 (2.4e-4 for n_in = 4097); observed worst here ~1e-7.
constexpr double kF32RelTol = 2e-6;
constexpr double kBf16RelTol = 2e-6;

// Written into y outside the outputs a call may write, to catch stray stores.
constexpr float kSentinel = -12345.5f;

ThreadPool& Pool(int n) {
  static ThreadPool p1(1), p2(2), p3(3);
  return n == 1 ? p1 : n == 2 ? p2 : p3;
}

struct Problem {
  int64_t m, n_in, n_out, ldx, ldw, ldy;
  DType dtype;
  std::vector<float> x;
  std::vector<float> w_f32;
  std::vector<uint16_t> w_bf16;
  WeightView view() const {
    return WeightView{dtype,
                      dtype == DType::kBF16 ? static_cast<const void*>(w_bf16.data())
                                            : static_cast<const void*>(w_f32.data()),
                      n_out, n_in, ldw};
  }
};

Problem MakeProblem(int64_t m, int64_t n_in, int64_t n_out, DType dtype, bool strided,
                    uint32_t seed) {
  Problem p{m, n_in, n_out, n_in + (strided ? 3 : 0), n_in + (strided ? 5 : 0),
            n_out + (strided ? 2 : 0), dtype, {}, {}, {}};
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  // Padding gets huge values: a kernel reading past n_in would be caught.
  p.x.assign(static_cast<size_t>(std::max<int64_t>(m, 1) * p.ldx), 1e30f);
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t k = 0; k < n_in; ++k) p.x[i * p.ldx + k] = dist(rng);
  }
  const size_t w_size = static_cast<size_t>(n_out * p.ldw);
  if (dtype == DType::kBF16) {
    p.w_bf16.assign(w_size, F32ToBf16Bits(1e30f));
    for (int64_t j = 0; j < n_out; ++j) {
      for (int64_t k = 0; k < n_in; ++k) p.w_bf16[j * p.ldw + k] = F32ToBf16Bits(dist(rng));
    }
  } else {
    p.w_f32.assign(w_size, 1e30f);
    for (int64_t j = 0; j < n_out; ++j) {
      for (int64_t k = 0; k < n_in; ++k) p.w_f32[j * p.ldw + k] = dist(rng);
    }
  }
  return p;
}

std::vector<float> NewY(const Problem& p) {
  return std::vector<float>(static_cast<size_t>(std::max<int64_t>(p.m, 1) * p.ldy), kSentinel);
}

// Checks y against the reference on outputs [j_begin, j_end) and the sentinel elsewhere.
void ExpectNearRef(const Problem& p, const std::vector<float>& y, int64_t j_begin, int64_t j_end,
                   const std::string& what) {
  const WeightView w = p.view();
  const double tol = p.dtype == DType::kBF16 ? kBf16RelTol : kF32RelTol;
  std::vector<float> ref = NewY(p);
  GemmRowsRef(p.x.data(), p.m, p.ldx, w, j_begin, j_end, ref.data(), p.ldy, nullptr);
  int failures = 0;
  for (int64_t i = 0; i < p.m && failures < 5; ++i) {
    for (int64_t j = 0; j < p.ldy && failures < 5; ++j) {
      const float got = y[i * p.ldy + j];
      if (j < j_begin || j >= j_end) {
        if (std::memcmp(&got, &kSentinel, sizeof(float)) != 0) {
          ADD_FAILURE() << what << ": wrote outside the slice at i=" << i << " j=" << j;
          ++failures;
        }
        continue;
      }
      double scale = 0.0;
      for (int64_t k = 0; k < p.n_in; ++k) {
        scale += std::fabs(static_cast<double>(p.x[i * p.ldx + k]) * WeightAt(w, j, k));
      }
      const double err = std::fabs(static_cast<double>(got) - ref[i * p.ldy + j]);
      if (!(err <= tol * scale)) {
        ADD_FAILURE() << what << ": i=" << i << " j=" << j << " got " << got << " ref "
                      << ref[i * p.ldy + j] << " err/scale " << err / scale;
        ++failures;
      }
    }
  }
}

void ExpectBitwiseEqual(const std::vector<float>& a, const std::vector<float>& b,
                        const std::string& what) {
  ASSERT_EQ(a.size(), b.size());
  EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0) << what;
}

// Runs every entry point on one problem: the public Gemm (no pool, pools of 1/2/3 threads, all
// bitwise equal), every ISA level's kernels (each against the reference, thread counts bitwise
// equal), and GemmRows on a middle slice (bitwise equal to the full result there).
void CheckProblem(const Problem& p) {
  const WeightView w = p.view();
  const std::string tag = std::string(DTypeName(p.dtype)) + " m=" + std::to_string(p.m) +
                          " n_in=" + std::to_string(p.n_in) + " n_out=" + std::to_string(p.n_out) +
                          (p.ldx > p.n_in ? " strided" : "");
  std::vector<float> y = NewY(p);
  Gemm(p.x.data(), p.m, p.ldx, w, y.data(), p.ldy, nullptr);
  if (p.m == 0) {
    EXPECT_EQ(y[0], kSentinel) << tag << ": m=0 must not write";
    return;
  }
  ExpectNearRef(p, y, 0, p.n_out, tag);
  for (int threads : {1, 2, 3}) {
    std::vector<float> yt = NewY(p);
    Gemm(p.x.data(), p.m, p.ldx, w, yt.data(), p.ldy, &Pool(threads));
    ExpectBitwiseEqual(y, yt, tag + " threads=" + std::to_string(threads));
  }
  std::vector<float> y_avx2;
  ForEachIsa([&](Isa isa) {
    std::vector<float> yi = NewY(p);
    internal::GemmWithIsa(isa, p.x.data(), p.m, p.ldx, w, yi.data(), p.ldy, &Pool(2));
    ExpectNearRef(p, yi, 0, p.n_out, tag + " isa " + IsaName(isa));
    // Every level sums in the same order (one fp32 FMA chain per output): the same bits.
    if (isa == Isa::kAvx2) y_avx2 = yi;
    else ExpectBitwiseEqual(y_avx2, yi, tag + " isa " + IsaName(isa) + " vs avx2");
    std::vector<float> y1 = NewY(p);
    internal::GemmWithIsa(isa, p.x.data(), p.m, p.ldx, w, y1.data(), p.ldy, nullptr);
    ExpectBitwiseEqual(yi, y1, tag + " isa " + IsaName(isa) + " 1 vs 2 threads");
    if (isa == ActiveIsa()) ExpectBitwiseEqual(y, yi, tag + " Gemm vs its active level");
  });
  const int64_t j_begin = p.n_out / 3, j_end = p.n_out - p.n_out / 4;
  std::vector<float> yr = NewY(p);
  GemmRows(p.x.data(), p.m, p.ldx, w, j_begin, j_end, yr.data(), p.ldy, &Pool(2));
  for (int64_t i = 0; i < p.m; ++i) {
    for (int64_t j = 0; j < p.ldy; ++j) {
      const float expect = (j >= j_begin && j < j_end) ? y[i * p.ldy + j] : kSentinel;
      ASSERT_EQ(std::memcmp(&yr[i * p.ldy + j], &expect, sizeof(float)), 0)
          << tag << " GemmRows [" << j_begin << "," << j_end << ") at i=" << i << " j=" << j;
    }
  }
}

class GemmShapes : public testing::TestWithParam<std::tuple<DType, int64_t>> {};

TEST_P(GemmShapes, MatchesReferenceAllSizes) {
  const auto [dtype, m] = GetParam();
  uint32_t seed = 1;
  for (int64_t n_in : {1, 7, 9, 33, 128, 257}) {
    for (int64_t n_out : {1, 7, 9, 33, 128, 257}) {
      for (bool strided : {false, true}) {
        Problem p = MakeProblem(m, n_in, n_out, dtype, strided, seed++);
        CheckProblem(p);
        // bf16-exact x (every projection input of the model): the avx512 level's vdpbf16ps path.
        for (float& v : p.x) v = RoundToBf16(v);
        CheckProblem(p);
        if (HasFailure()) return;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Gemm, GemmShapes,
    testing::Combine(testing::Values(DType::kF32, DType::kBF16),
                     testing::Values<int64_t>(0, 1, 2, 3, 5, 8, 17, 64, 130)),
    [](const testing::TestParamInfo<GemmShapes::ParamType>& info) {
      return std::string(DTypeName(std::get<0>(info.param))) + "_m" +
             std::to_string(std::get<1>(info.param));
    });

// Long k (several k blocks of the tiled path, long decode rows) and wide n (many tasks).
TEST(Gemm, LargeDimensions) {
  struct Shape {
    int64_t m, n_in, n_out;
  };
  uint32_t seed = 1000;
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    for (const Shape& s : {Shape{1, 4097, 257}, Shape{3, 4097, 33}, Shape{8, 4097, 9},
                           Shape{17, 4097, 65}, Shape{64, 4097, 129}, Shape{1, 33, 4097},
                           Shape{5, 257, 4097}, Shape{130, 33, 4097}}) {
      Problem p = MakeProblem(s.m, s.n_in, s.n_out, dtype, (seed & 1) != 0, seed);
      CheckProblem(p);
      for (float& v : p.x) v = RoundToBf16(v);
      CheckProblem(p);
      ++seed;
    }
  }
}

TEST(Gemm, ZeroInnerDimensionWritesZeros) {
  const std::vector<float> x(3, 1.0f);
  const std::vector<float> w(4, 1.0f);
  const WeightView view{DType::kF32, w.data(), 4, 0, 1};
  std::vector<float> y(3 * 4, kSentinel);
  Gemm(x.data(), 3, 1, view, y.data(), 4, &Pool(2));
  for (float v : y) EXPECT_EQ(v, 0.0f);
}

TEST(Gemm, EmptySliceIsNoOp) {
  Problem p = MakeProblem(4, 16, 16, DType::kF32, false, 7);
  std::vector<float> y = NewY(p);
  GemmRows(p.x.data(), p.m, p.ldx, p.view(), 5, 5, y.data(), p.ldy, &Pool(2));
  for (float v : y) EXPECT_EQ(v, kSentinel);
}

// One summation order per output for every m, on every level: a row's result is bitwise the
// same whether it is computed alone, in the first rows of a call, or in the middle of one,
// whatever m (1, 3, 17, 64 and others), the thread count, and the other rows' values
// (bf16-exact rows beside rows that need three bf16 terms). docs/engine.md relies on it.
TEST(Gemm, RowResultsDoNotDependOnTheBatch) {
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    for (int64_t n_in : {300, 7, 1100}) {
      Problem p = MakeProblem(200, n_in, 45, dtype, true, 31);
      // Every third row bf16-exact (as the model's projection inputs are).
      for (int64_t i = 0; i < p.m; i += 3) {
        for (int64_t k = 0; k < n_in; ++k) p.x[i * p.ldx + k] = RoundToBf16(p.x[i * p.ldx + k]);
      }
      ForEachIsa([&](Isa isa) {
        // Each row alone (m = 1) is the expectation.
        std::vector<float> alone = NewY(p);
        for (int64_t i = 0; i < p.m; ++i) {
          internal::GemmWithIsa(isa, &p.x[i * p.ldx], 1, p.ldx, p.view(), &alone[i * p.ldy],
                                p.ldy, &Pool(1 + i % 3));
        }
        for (int64_t m : {2, 3, 5, 8, 9, 12, 16, 17, 33, 40, 64, 128, 129, 199}) {
          for (int64_t first : {int64_t{0}, int64_t{1}}) {
            if (first + m > p.m) continue;
            std::vector<float> part = NewY(p);
            internal::GemmWithIsa(isa, &p.x[first * p.ldx], m, p.ldx, p.view(),
                                  &part[first * p.ldy], p.ldy, &Pool(m % 2 == 0 ? 2 : 3));
            EXPECT_EQ(std::memcmp(&part[first * p.ldy], &alone[first * p.ldy],
                                  m * p.ldy * sizeof(float)),
                      0)
                << DTypeName(dtype) << " n_in=" << n_in << " m=" << m << " first=" << first;
          }
        }
      });
    }
  }
}

// x in 32-byte aligned rows (ldx a multiple of 8) is read in place by the small-m path; other x is
// copied to aligned scratch first (the strided cases above): both must give the same bits.
TEST(Gemm, AlignedAndUnalignedActivationsAgree) {
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    for (int64_t m : {1, 3, 8, 20}) {
      Problem p = MakeProblem(m, 200, 70, dtype, false, 21);
      const int64_t ld = 208;
      struct Free {
        void operator()(float* q) const { std::free(q); }
      };
      std::unique_ptr<float, Free> buf(
          static_cast<float*>(std::aligned_alloc(64, (m * ld + 8) * sizeof(float))));
      for (int64_t shift : {0, 1}) {  // aligned rows, then every row off by 4 bytes
        float* xa = buf.get() + shift;
        for (int64_t i = 0; i < m; ++i) std::memcpy(xa + i * ld, &p.x[i * p.ldx], 200 * 4);
        std::vector<float> y = NewY(p), y_ref = NewY(p);
        Gemm(xa, m, ld, p.view(), y.data(), p.ldy, &Pool(2));
        Gemm(p.x.data(), m, p.ldx, p.view(), y_ref.data(), p.ldy, nullptr);
        ExpectBitwiseEqual(y, y_ref, std::string(DTypeName(dtype)) + " m=" + std::to_string(m) +
                                         " shift=" + std::to_string(shift));
      }
    }
  }
}

// The same pool and thread-local scratch serve shapes that grow and shrink between calls.
TEST(Gemm, RepeatedCallsAreDeterministic) {
  Problem big = MakeProblem(70, 600, 520, DType::kBF16, true, 11);
  Problem small = MakeProblem(20, 40, 30, DType::kF32, false, 12);
  std::vector<float> first = NewY(big);
  Gemm(big.x.data(), big.m, big.ldx, big.view(), first.data(), big.ldy, &Pool(2));
  for (int rep = 0; rep < 3; ++rep) {
    std::vector<float> ys = NewY(small);
    Gemm(small.x.data(), small.m, small.ldx, small.view(), ys.data(), small.ldy, &Pool(2));
    ExpectNearRef(small, ys, 0, small.n_out, "small");
    std::vector<float> again = NewY(big);
    Gemm(big.x.data(), big.m, big.ldx, big.view(), again.data(), big.ldy, &Pool(2));
    ExpectBitwiseEqual(first, again, "repeat " + std::to_string(rep));
  }
  ExpectNearRef(big, first, 0, big.n_out, "big");
}

// GroupedGemm: experts of one MoE layer (gate and up of an expert share x, some experts get no
// row, one is large): every output bitwise equal to its own Gemm call, on every level.
TEST(Gemm, GroupedEqualsSeparateCalls) {
  const int64_t D = 200, I = 72;
  const std::vector<int64_t> rows = {3, 0, 1, 0, 17, 2, 40};
  std::vector<Problem> probs;
  for (size_t e = 0; e < rows.size(); ++e) {
    probs.push_back(MakeProblem(rows[e], D, I, DType::kBF16, e % 2 == 1, static_cast<uint32_t>(100 + e)));
    probs.push_back(MakeProblem(rows[e], D, I + 8, e == 4 ? DType::kF32 : DType::kBF16, false,
                                static_cast<uint32_t>(200 + e)));
    probs.back().x = probs[probs.size() - 2].x;  // up reads gate's rows
    probs.back().ldx = probs[probs.size() - 2].ldx;
  }
  ForEachIsa([&](Isa isa) {
    const Isa previous = internal::TEST_SetActiveIsa(isa);
    for (int threads : {1, 2, 3}) {
      std::vector<GemmGroup> groups;
      std::vector<std::vector<float>> y;
      for (const Problem& p : probs) y.push_back(NewY(p));
      for (size_t g = 0; g < probs.size(); ++g) {
        const Problem& p = probs[g];
        groups.push_back({p.view(), p.x.data(), p.m, p.ldx, y[g].data(), p.ldy});
      }
      GroupedGemm(groups.data(), static_cast<int64_t>(groups.size()), &Pool(threads));
      for (size_t g = 0; g < probs.size(); ++g) {
        const Problem& p = probs[g];
        std::vector<float> one = NewY(p);
        Gemm(p.x.data(), p.m, p.ldx, p.view(), one.data(), p.ldy, nullptr);
        ExpectBitwiseEqual(y[g], one, "group " + std::to_string(g) + " threads " + std::to_string(threads));
      }
    }
    internal::TEST_SetActiveIsa(previous);
  });
}

// The packed layout holds each weight where Bf16PanelBytes' contract says: a lane-by-lane
// check of the bytes against the row-major matrix (zero past n_out and past an odd n_in).
TEST(GemmPanels, PackPutsEveryWeightWhereTheLayoutSays) {
  for (int64_t n_in : {1, 7, 64}) {
    Problem p = MakeProblem(1, n_in, 37, DType::kBF16, true, 5);
    const PackedBf16Weights packed = PackedBf16Weights::Pack(p.view(), &Pool(2));
    ASSERT_TRUE(packed);
    const WeightView v = packed.view();
    EXPECT_EQ(v.layout, WeightLayout::kPanels16);
    EXPECT_EQ(packed.bytes(), 3 * ((n_in + 1) / 2) * 64);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(v.data) % 64, 0u);
    const uint32_t* d = static_cast<const uint32_t*>(v.data);
    const int64_t pairs = (n_in + 1) / 2;
    for (int64_t r = 0; r < 48; ++r) {
      for (int64_t k = 0; k < 2 * pairs; ++k) {
        const uint32_t dword = d[(r / 16 * pairs + k / 2) * 16 + r % 16];
        const uint16_t got = static_cast<uint16_t>(k % 2 == 0 ? dword & 0xffff : dword >> 16);
        const uint16_t want = r < p.n_out && k < n_in ? p.w_bf16[r * p.ldw + k] : 0;
        ASSERT_EQ(got, want) << "row " << r << " k " << k << " n_in " << n_in;
      }
    }
    // PackInto (the caller's memory, as the model's arena) writes the same bytes.
    std::vector<uint8_t> arena(static_cast<size_t>(packed.bytes()) + 64);
    void* dst = arena.data() + (64 - reinterpret_cast<uintptr_t>(arena.data()) % 64) % 64;
    const PackedBf16Weights into = PackedBf16Weights::PackInto(p.view(), dst, nullptr);
    EXPECT_EQ(into.view().data, dst);
    EXPECT_EQ(std::memcmp(dst, v.data, static_cast<size_t>(packed.bytes())), 0) << "n_in " << n_in;
  }
}

// Prepacked weights give every output bitwise what the row-major matrix gives, on every level,
// for every m (both the decode kernels and the tiled ones), thread count, odd n_in and n_out,
// and slices that start on a panel; GroupedGemm mixes both layouts. The reference check
// (ExpectNearRef) guards against both layouts being wrong the same way.
TEST(GemmPanels, EqualRowMajorBitwiseOnEveryLevel) {
  for (int64_t n_in : {7, 300, 1100}) {
    for (int64_t n_out : {5, 45, 130}) {
      Problem p = MakeProblem(70, n_in, n_out, DType::kBF16, true, static_cast<uint32_t>(n_in + n_out));
      for (int64_t i = 0; i < p.m; i += 2) {
        for (int64_t k = 0; k < n_in; ++k) p.x[i * p.ldx + k] = RoundToBf16(p.x[i * p.ldx + k]);
      }
      const PackedBf16Weights packed = PackedBf16Weights::Pack(p.view(), nullptr);
      ForEachIsa([&](Isa isa) {
        for (int64_t m : {1, 2, 3, 4, 5, 11, 12, 13, 17, 24, 25, 64, 70}) {
          for (int threads : {1, 2, 3}) {
            std::vector<float> rows = NewY(p), panels = NewY(p);
            internal::GemmWithIsa(isa, p.x.data(), m, p.ldx, p.view(), rows.data(), p.ldy, &Pool(threads));
            internal::GemmWithIsa(isa, p.x.data(), m, p.ldx, packed.view(), panels.data(), p.ldy, &Pool(threads));
            const std::string what = "n_in=" + std::to_string(n_in) + " n_out=" + std::to_string(n_out) +
                                     " m=" + std::to_string(m) + " threads=" + std::to_string(threads);
            ExpectBitwiseEqual(panels, rows, what);
            if (threads == 2) {
              Problem head = p;
              head.m = m;
              ExpectNearRef(head, panels, 0, n_out, what);
            }
          }
        }
        const Isa previous = internal::TEST_SetActiveIsa(isa);
        for (int64_t m : {1, 3, 20}) {
          for (int64_t jb = 0; jb < n_out; jb += 16) {
            const int64_t je = std::min(n_out, jb + 21);
            std::vector<float> rows = NewY(p), panels = NewY(p);
            GemmRows(p.x.data(), m, p.ldx, p.view(), jb, je, rows.data(), p.ldy, &Pool(2));
            GemmRows(p.x.data(), m, p.ldx, packed.view(), jb, je, panels.data(), p.ldy, &Pool(2));
            ExpectBitwiseEqual(panels, rows, "slice [" + std::to_string(jb) + ", " + std::to_string(je) +
                                                 ") m=" + std::to_string(m));
          }
          std::vector<float> y_rows = NewY(p), y_panels = NewY(p);
          const GemmGroup groups[2] = {{p.view(), p.x.data(), m, p.ldx, y_rows.data(), p.ldy},
                                       {packed.view(), p.x.data(), m, p.ldx, y_panels.data(), p.ldy}};
          GroupedGemm(groups, 2, &Pool(2));
          ExpectBitwiseEqual(y_panels, y_rows, "grouped m=" + std::to_string(m));
        }
        internal::TEST_SetActiveIsa(previous);
      });
    }
  }
}

TEST(GemmPanels, SliceNotOnAPanelIsACheckedBug) {
  Problem p = MakeProblem(1, 32, 40, DType::kBF16, false, 9);
  const PackedBf16Weights packed = PackedBf16Weights::Pack(p.view(), nullptr);
  std::vector<float> y = NewY(p);
  EXPECT_DEATH(GemmRows(p.x.data(), 1, p.ldx, packed.view(), 8, 40, y.data(), p.ldy, nullptr),
               "multiple of 16");
}

}  // namespace
}  // namespace pdserve::kernels
