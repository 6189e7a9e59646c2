// The ISA-neutral part of the GEMM entry points (gemm.cc, gemm_int8.cc); internal to kernels/.
//
// A call is cut into plans (a GEMM, or a chunk of its rows when its prepared x would not fit
// kMaxPreparedBytes), run in waves: all plans of a wave first prepare their x (the calling
// thread alone when that is small, else on the pool), then every (row block x output block)
// task of the wave goes through one ParallelFor. Task bounds never change a result (the
// tables' contract, kernel_table.h), so planning is free to follow shapes and thread count.
#pragma once

#include <algorithm>
#include <cstdint>
#include <utility>
#include <vector>

#include "common/thread_pool.h"
#include "kernels/gemm_plan.h"

namespace pdserve::kernels::internal {

// One plan: Problem (FloatProblem / Int8Problem) prepared by Kernels from rows of X.
template <typename Kernels, typename Problem, typename X>
struct GemmPlan {
  Problem p;
  const Kernels* k = nullptr;
  const X* x = nullptr;  // source rows of this plan (row 0 = p's row 0)
  int64_t ldx = 0;
  int64_t j0 = 0, j1 = 0;  // output slice
  bool prepare = true;     // false: shares the previous plan's prepared x
  TaskGrid grid;
  int64_t xp_offset = 0, terms_offset = 0, task_begin = 0;
};

template <typename Plan>
struct DriverScratch {
  AlignedBuffer xp;
  std::vector<uint8_t> terms;
  std::vector<Plan> plans;
  std::vector<std::pair<size_t, int64_t>> units;  // prepare units: (plan, first row)
};

// Appends the plans of one GEMM: rows in chunks whose prepared x fits the cap.
template <typename Plan, typename Kernels, typename Problem, typename X>
void AddPlans(std::vector<Plan>& plans, const Kernels& k, const Problem& p, const X* x,
              int64_t ldx, int64_t j0, int64_t j1, bool share_previous_x, int n_threads) {
  const int64_t n_in = p.w.n_in;
  const int64_t chunk = PlanChunkRows(p.m, k.prepared_bytes(k.m_granule, n_in) / k.m_granule,
                                      k.m_granule);
  for (int64_t r0 = 0; r0 < p.m; r0 += chunk) {
    Plan pl;
    pl.p = p;
    pl.p.m = std::min(chunk, p.m - r0);
    pl.p.y = static_cast<decltype(p.y)>(static_cast<void*>(
        static_cast<char*>(static_cast<void*>(p.y)) + r0 * p.ldy * 4));  // fp32 / int32 rows
    if constexpr (requires { pl.p.x_scales; }) {
      if (p.x_scales != nullptr) pl.p.x_scales = p.x_scales + r0;
    }
    pl.k = &k;
    pl.x = x + r0 * ldx;
    pl.ldx = ldx;
    pl.j0 = j0;
    pl.j1 = j1;
    pl.prepare = !(share_previous_x && chunk >= p.m);
    pl.grid = MakeTaskGrid(pl.p.m, j1 - j0, n_in, n_threads, k.m_granule, k.mc_max);
    plans.push_back(pl);
  }
}

template <typename Plan>
void RunTasks(const Plan& pl, int64_t t0, int64_t t1) {
  for (int64_t t = t0; t < t1; ++t) {
    int64_t i0, i1, j0, j1;
    pl.grid.Bounds(t, pl.p.m, pl.j0, pl.j1, &i0, &i1, &j0, &j1);
    pl.k->compute(pl.p, i0, i1, j0, j1);
  }
}

// Runs plans[begin, end) (one wave): prepares x, then all tasks.
template <typename Plan>
void RunWave(DriverScratch<Plan>& s, size_t begin, size_t end, ThreadPool* pool, int n_threads) {
  int64_t xp_total = 0, terms_total = 0, prep_elems = 0;
  for (size_t i = begin; i < end; ++i) {
    Plan& pl = s.plans[i];
    if (i > begin && !pl.prepare) {
      pl.xp_offset = s.plans[i - 1].xp_offset;
      pl.terms_offset = s.plans[i - 1].terms_offset;
      continue;
    }
    pl.prepare = true;
    pl.xp_offset = xp_total;
    pl.terms_offset = terms_total;
    xp_total += (pl.k->prepared_bytes(pl.p.m, pl.p.w.n_in) + 63) / 64 * 64;  // 64-B aligned
    terms_total += (pl.p.m + pl.k->m_granule - 1) / pl.k->m_granule;
    prep_elems += pl.p.m * pl.p.w.n_in;
  }
  uint8_t* xp = static_cast<uint8_t*>(s.xp.Get(xp_total));
  if (static_cast<int64_t>(s.terms.size()) < terms_total) s.terms.resize(static_cast<size_t>(terms_total));
  // Prepare units: (plan, up to 64 rows); on the pool only when there is enough to share.
  constexpr int64_t kPrepRows = 64;
  s.units.clear();
  int64_t n_tasks = 0;
  for (size_t i = begin; i < end; ++i) {
    Plan& pl = s.plans[i];
    pl.p.xp = xp + pl.xp_offset;
    pl.p.terms = s.terms.data() + pl.terms_offset;
    pl.task_begin = n_tasks;
    n_tasks += pl.grid.n_tasks();
    if (pl.prepare) {
      for (int64_t r = 0; r < pl.p.m; r += kPrepRows) s.units.emplace_back(i, r);
    }
  }
  auto prep = [&s](int64_t u0, int64_t u1) {
    for (int64_t u = u0; u < u1; ++u) {
      const auto [i, r0] = s.units[static_cast<size_t>(u)];
      const Plan& pl = s.plans[i];
      pl.k->prepare(pl.x, pl.ldx, pl.p.m, r0, std::min(pl.p.m, r0 + kPrepRows), pl.p.w.n_in,
                    const_cast<void*>(pl.p.xp), const_cast<uint8_t*>(pl.p.terms));
    }
  };
  const int64_t n_units = static_cast<int64_t>(s.units.size());
  if (n_threads == 1 || prep_elems < (int64_t{1} << 16)) {
    prep(0, n_units);
  } else {
    pool->ParallelFor(n_units, prep);
  }
  if (n_threads == 1 || n_tasks == 1) {
    for (size_t i = begin; i < end; ++i) RunTasks(s.plans[i], 0, s.plans[i].grid.n_tasks());
    return;
  }
  const Plan* first = s.plans.data() + begin;
  const Plan* last = s.plans.data() + end;
  pool->ParallelFor(n_tasks, [first, last](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      const Plan* pl = std::upper_bound(first, last, t, [](int64_t v, const Plan& p) {
                         return v < p.task_begin;
                       }) - 1;
      RunTasks(*pl, t - pl->task_begin, t - pl->task_begin + 1);
    }
  });
}

// Runs every plan in s.plans, in waves of at most kMaxPreparedBytes of prepared x (at least
// one plan each; a plan sharing x stays in the wave of the plan that prepares it).
template <typename Plan>
void RunPlans(DriverScratch<Plan>& s, ThreadPool* pool) {
  const int n_threads = pool == nullptr ? 1 : pool->n_threads();
  size_t begin = 0;
  while (begin < s.plans.size()) {
    int64_t bytes = 0;
    size_t end = begin;
    while (end < s.plans.size()) {
      const Plan& pl = s.plans[end];
      const int64_t b = pl.prepare ? pl.k->prepared_bytes(pl.p.m, pl.p.w.n_in) : 0;
      if (end > begin && bytes + b > kMaxPreparedBytes) break;
      bytes += b;
      ++end;
    }
    while (end < s.plans.size() && !s.plans[end].prepare) ++end;
    RunWave(s, begin, end, pool, n_threads);
    begin = end;
  }
}

}  // namespace pdserve::kernels::internal
