// Entry points of kernels/gemm_int8.h: argument checks, task planning over one or many GEMMs
// (kernels/gemm_driver.h), and the hand-off to the active ISA's INT8 kernels.
#include "kernels/gemm_int8.h"

#include <immintrin.h>

#include <cstring>

#include "common/check.h"
#include "kernels/gemm_driver.h"
#include "kernels/gemm_int8_internal.h"
#include "kernels/kernel_table.h"

namespace pdserve::kernels {
namespace internal {
namespace {

using Int8Plan = GemmPlan<Int8Kernels, Int8Problem, int8_t>;

// One GEMM of a call: p without its prepared x, and its source rows.
struct Src {
  const int8_t* xq;
  int64_t ldx;
};

void ZeroOutput(void* y, int64_t m, int64_t n, int64_t ldy) {
  for (int64_t i = 0; i < m; ++i) {
    std::memset(static_cast<uint8_t*>(y) + i * ldy * 4, 0, static_cast<size_t>(n) * 4);
  }
}

void Run(const KernelTable& table, const Int8Problem* problems, const Src* srcs, int64_t n,
         ThreadPool* pool) {
  thread_local DriverScratch<Int8Plan> s;
  const int n_threads = pool == nullptr ? 1 : pool->n_threads();
  s.plans.clear();
  for (int64_t g = 0; g < n; ++g) {
    const Int8Problem& p = problems[g];
    PDSERVE_CHECK(p.w.n_in <= kGemmInt8MaxK, "GemmInt8: n_in exceeds kGemmInt8MaxK");
    PDSERVE_DCHECK(srcs[g].ldx >= p.w.n_in && p.ldy >= p.w.n_out && p.w.ld >= p.w.n_in,
                   "GemmInt8: strides");
    if (p.m <= 0 || p.w.n_out <= 0) continue;
    if (p.w.n_in == 0) {
      ZeroOutput(p.y, p.m, p.w.n_out, p.ldy);
      continue;
    }
    // Adjacent groups reading the same x rows (gate/up of one expert) share one preparation.
    const bool same_x = g > 0 && !s.plans.empty() && s.plans.back().x == srcs[g].xq &&
                        srcs[g - 1].xq == srcs[g].xq && srcs[g - 1].ldx == srcs[g].ldx &&
                        problems[g - 1].m == p.m && problems[g - 1].w.n_in == p.w.n_in;
    AddPlans(s.plans, table.int8, p, srcs[g].xq, srcs[g].ldx, 0, p.w.n_out, same_x, n_threads);
  }
  RunPlans(s, pool);
}

}  // namespace

void GemmInt8WithIsa(Isa isa, const int8_t* xq, const float* x_scales, int64_t m, int64_t ldx,
                     const Int8WeightView& w, void* y, int64_t ldy, ThreadPool* pool) {
  Int8Problem p;
  p.x_scales = x_scales;
  p.m = m;
  p.w = w;
  p.y = y;
  p.ldy = ldy;
  p.raw = x_scales == nullptr;
  const Src src{xq, ldx};
  Run(TableFor(isa), &p, &src, 1, pool);
}

}  // namespace internal

void GemmInt8(const int8_t* xq, const float* x_scales, int64_t m, int64_t ldx,
              const Int8WeightView& w, float* y, int64_t ldy, ThreadPool* pool) {
  internal::Int8Problem p;
  p.x_scales = x_scales;
  p.m = m;
  p.w = w;
  p.y = y;
  p.ldy = ldy;
  const internal::Src src{xq, ldx};
  internal::Run(internal::ActiveTable(), &p, &src, 1, pool);
}

void GemmInt8Acc(const int8_t* xq, int64_t m, int64_t ldx, const Int8WeightView& w,
                 int32_t* acc, int64_t ldacc, ThreadPool* pool) {
  internal::Int8Problem p;
  p.m = m;
  p.w = w;
  p.y = acc;
  p.ldy = ldacc;
  p.raw = true;
  const internal::Src src{xq, ldx};
  internal::Run(internal::ActiveTable(), &p, &src, 1, pool);
}

void GroupedGemmInt8(const Int8GemmGroup* groups, int64_t n_groups, ThreadPool* pool) {
  thread_local std::vector<internal::Int8Problem> problems;
  thread_local std::vector<internal::Src> srcs;
  problems.resize(static_cast<size_t>(n_groups));
  srcs.resize(static_cast<size_t>(n_groups));
  for (int64_t g = 0; g < n_groups; ++g) {
    internal::Int8Problem& p = problems[static_cast<size_t>(g)];
    p = internal::Int8Problem{};
    p.x_scales = groups[g].x_scales;
    p.m = groups[g].m;
    p.w = groups[g].w;
    p.y = groups[g].y;
    p.ldy = groups[g].ldy;
    srcs[static_cast<size_t>(g)] = {groups[g].xq, groups[g].ldx};
  }
  internal::Run(internal::ActiveTable(), problems.data(), srcs.data(), n_groups, pool);
}

int32_t DotInt8(const int8_t* a, const int8_t* b, int64_t n) {
  int64_t k = 0;
  int32_t s = 0;
  __m256i acc = _mm256_setzero_si256();
  for (; k + 16 <= n; k += 16) {
    const __m256i av = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(a + k)));
    const __m256i bv = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b + k)));
    acc = _mm256_add_epi32(acc, _mm256_madd_epi16(av, bv));
  }
  __m128i h = _mm_add_epi32(_mm256_castsi256_si128(acc), _mm256_extracti128_si256(acc, 1));
  h = _mm_add_epi32(h, _mm_shuffle_epi32(h, 0x4e));
  h = _mm_add_epi32(h, _mm_shuffle_epi32(h, 0xb1));
  s = _mm_cvtsi128_si32(h);
  for (; k < n; ++k) s += int32_t{a[k]} * b[k];
  return s;
}

}  // namespace pdserve::kernels
