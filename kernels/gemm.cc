// Entry points of kernels/gemm.h: argument checks, task planning over one or many GEMMs, and
// the hand-off to the active ISA's kernels (kernels/kernel_table.h).
//
#include "kernels/gemm.h"

#include <algorithm>
#include <cstdlib>
#include <memory>
#include <vector>

#include "common/check.h"
#include "kernels/gemm_driver.h"
#include "kernels/gemm_simd.h"
#include "kernels/kernel_table.h"

namespace pdserve::kernels {
namespace internal {
namespace {

using FloatPlan = GemmPlan<FloatKernels, FloatProblem, float>;

void Run(const KernelTable& table, const GemmGroup* groups, const int64_t* j_begin,
         const int64_t* j_end, int64_t n, ThreadPool* pool) {
  thread_local DriverScratch<FloatPlan> s;
  const int n_threads = pool == nullptr ? 1 : pool->n_threads();
  s.plans.clear();
  for (int64_t g = 0; g < n; ++g) {
    const GemmGroup& gr = groups[g];
    const WeightView& w = gr.w;
    PDSERVE_CHECK(w.dtype == DType::kF32 || w.dtype == DType::kBF16, "Gemm: weight dtype");
    const bool panels = w.layout == WeightLayout::kPanels16;
    PDSERVE_CHECK(!panels || w.dtype == DType::kBF16, "Gemm: kPanels16 weights are BF16");
    const int64_t jb = j_begin ? j_begin[g] : 0, je = j_end ? j_end[g] : w.n_out;
    PDSERVE_DCHECK(0 <= jb && jb <= je && je <= w.n_out, "GemmRows: slice");
    PDSERVE_CHECK(!panels || jb % 16 == 0, "GemmRows: a kPanels16 slice starts on a panel (multiple of 16)");
    PDSERVE_DCHECK(gr.ldx >= w.n_in && gr.ldy >= je && (panels || w.ld >= w.n_in), "Gemm: strides");
    if (gr.m <= 0 || jb >= je) continue;
    if (w.n_in <= 0) {  // empty sum
      for (int64_t i = 0; i < gr.m; ++i) {
        for (int64_t j = jb; j < je; ++j) gr.y[i * gr.ldy + j] = 0.0f;
      }
      continue;
    }
    const FloatKernels& k = panels ? table.bf16_panels : w.dtype == DType::kBF16 ? table.bf16 : table.f32;
    // Adjacent groups reading the same x (gate and up of one expert) share its preparation.
    const bool same_x = !s.plans.empty() && s.plans.back().k == &k && g > 0 &&
                        groups[g - 1].x == gr.x && groups[g - 1].ldx == gr.ldx &&
                        groups[g - 1].m == gr.m && groups[g - 1].w.n_in == w.n_in &&
                        s.plans.back().x == gr.x;
    FloatProblem p;
    p.m = gr.m;
    p.w = w;
    p.y = gr.y;
    p.ldy = gr.ldy;
    AddPlans(s.plans, k, p, gr.x, gr.ldx, jb, je, same_x, n_threads);
  }
  RunPlans(s, pool);
}

}  // namespace
}  // namespace internal

int64_t Bf16PanelBytes(int64_t n_out, int64_t n_in) {
  return (n_out + 15) / 16 * ((n_in + 1) / 2) * 64;
}

void PackedBf16Weights::Free::operator()(void* p) const { std::free(p); }

PackedBf16Weights PackedBf16Weights::Pack(const WeightView& rows, ThreadPool* pool) {
  std::unique_ptr<void, Free> owned(
      std::aligned_alloc(64, static_cast<size_t>(std::max<int64_t>(64, Bf16PanelBytes(rows.n_out, rows.n_in)))));
  PDSERVE_CHECK(owned != nullptr, "PackedBf16Weights::Pack: allocation");
  PackedBf16Weights packed = PackInto(rows, owned.get(), pool);
  packed.owned_ = std::move(owned);
  return packed;
}

PackedBf16Weights PackedBf16Weights::PackInto(const WeightView& rows, void* dst_bytes, ThreadPool* pool) {
  PDSERVE_CHECK(rows.dtype == DType::kBF16 && rows.layout == WeightLayout::kRows && rows.n_out > 0 &&
                    rows.n_in > 0 && rows.ld >= rows.n_in,
                "PackedBf16Weights::Pack: a BF16 row-major matrix");
  PDSERVE_CHECK(reinterpret_cast<uintptr_t>(dst_bytes) % 64 == 0, "PackedBf16Weights::PackInto: 64-byte aligned memory");
  PackedBf16Weights packed;
  packed.n_out_ = rows.n_out;
  packed.n_in_ = rows.n_in;
  packed.data_ = dst_bytes;
  const int64_t n_panels = (rows.n_out + 15) / 16, pairs = (rows.n_in + 1) / 2;
  const uint16_t* w = static_cast<const uint16_t*>(rows.data);
  uint32_t* dst = static_cast<uint32_t*>(dst_bytes);
  auto pack = [&](int64_t p0, int64_t p1) {
    // Writes in order; reads the panel's 16 rows side by side. Rows past n_out and the k past
    // an odd n_in read from a zero row.
    std::vector<uint16_t> zero(static_cast<size_t>(2 * pairs), 0);
    for (int64_t p = p0; p < p1; ++p) {
      uint32_t* d = dst + p * pairs * 16;
      const uint16_t* row[16];
      for (int t = 0; t < 16; ++t) row[t] = 16 * p + t < rows.n_out ? w + (16 * p + t) * rows.ld : zero.data();
      const int64_t full = rows.n_in / 2;  // pairs with both halves inside every real row
      int64_t q = 0;
      // 8 rows x 8 pairs at a time: one 8x8 dword transpose in registers.
      for (; q + 8 <= full; q += 8, d += 8 * 16) {
        for (int h = 0; h < 2; ++h) {
          __m256 r[8];
          for (int t = 0; t < 8; ++t) {
            r[t] = _mm256_castsi256_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(row[8 * h + t] + 2 * q)));
          }
          internal::Transpose8x8(r);
          for (int c = 0; c < 8; ++c) _mm256_storeu_ps(reinterpret_cast<float*>(d + c * 16 + 8 * h), r[c]);
        }
      }
      for (; q < full; ++q, d += 16) {
        for (int t = 0; t < 16; ++t) d[t] = row[t][2 * q] | (static_cast<uint32_t>(row[t][2 * q + 1]) << 16);
      }
      for (int64_t q = full; q < pairs; ++q, d += 16) {  // odd n_in: the last k alone
        for (int t = 0; t < 16; ++t) d[t] = row[t][2 * q];
      }
    }
  };
  if (pool != nullptr && n_panels > 1) {
    pool->ParallelFor(n_panels, pack);
  } else {
    pack(0, n_panels);
  }
  return packed;
}

WeightView PackedBf16Weights::view() const {
  PDSERVE_CHECK(data_ != nullptr, "PackedBf16Weights::view: empty");
  return WeightView{DType::kBF16, data_, n_out_, n_in_, n_in_, WeightLayout::kPanels16};
}

void GemmRows(const float* x, int64_t m, int64_t ldx, const WeightView& w, int64_t j_begin,
              int64_t j_end, float* y, int64_t ldy, ThreadPool* pool) {
  const GemmGroup g{w, x, m, ldx, y, ldy};
  internal::Run(internal::ActiveTable(), &g, &j_begin, &j_end, 1, pool);
}

void Gemm(const float* x, int64_t m, int64_t ldx, const WeightView& w, float* y, int64_t ldy,
          ThreadPool* pool) {
  const GemmGroup g{w, x, m, ldx, y, ldy};
  internal::Run(internal::ActiveTable(), &g, nullptr, nullptr, 1, pool);
}

namespace internal {
void GemmWithIsa(Isa isa, const float* x, int64_t m, int64_t ldx, const WeightView& w, float* y,
                 int64_t ldy, ThreadPool* pool) {
  const GemmGroup g{w, x, m, ldx, y, ldy};
  Run(TableFor(isa), &g, nullptr, nullptr, 1, pool);
}
}  // namespace internal

void GroupedGemm(const GemmGroup* groups, int64_t n_groups, ThreadPool* pool) {
  internal::Run(internal::ActiveTable(), groups, nullptr, nullptr, n_groups, pool);
}

}  // namespace pdserve::kernels
