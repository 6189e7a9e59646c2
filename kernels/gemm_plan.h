// Task planning shared by the GEMM entry points (gemm.cc, gemm_int8.cc); internal to kernels/.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <memory>

#include "common/check.h"

namespace pdserve::kernels::internal {

// Prepared activations of one wave stay below this (a 2048-token prefill of V3.2's 7168-wide
// rows would otherwise take ~88 MB as three bf16 terms): larger GEMMs run in row chunks, each
// re-reading the weights (at >= 300 rows per chunk, arithmetic intensity stays far above what
// DRAM bandwidth limits).
inline constexpr int64_t kMaxPreparedBytes = int64_t{16} << 20;
// Below this many multiply-adds per task a ParallelFor hand-off costs more than it saves.
inline constexpr int64_t kMinMacsPerTask = 65536;
inline constexpr int kTasksPerThread = 4;
// Output blocks start on multiples of this (the widest register / tile block of any table).
inline constexpr int64_t kColumnGranule = 32;

// Grow-only, 64-byte aligned bytes; meant to be thread_local and reused across calls.
class AlignedBuffer {
 public:
  void* Get(int64_t n_bytes) {
    if (n_bytes > capacity_) {
      const size_t bytes = (static_cast<size_t>(n_bytes) + 63) & ~size_t{63};
      data_.reset(std::aligned_alloc(64, bytes));
      PDSERVE_CHECK(data_ != nullptr, "Gemm: scratch allocation");
      capacity_ = n_bytes;
    }
    return data_.get();
  }

 private:
  struct Free {
    void operator()(void* p) const { std::free(p); }
  };
  std::unique_ptr<void, Free> data_;
  int64_t capacity_ = 0;
};

// The tasks of one GEMM: mb row blocks of mc rows x nb output blocks of nc outputs.
struct TaskGrid {
  int64_t mc = 1, nc = 1, mb = 1, nb = 1;
  int64_t n_tasks() const { return mb * nb; }
  // Rows [i0, i1) and outputs [j0, j1) of task t for m rows and the slice [jb, je).
  void Bounds(int64_t t, int64_t m, int64_t jb, int64_t je, int64_t* i0, int64_t* i1, int64_t* j0,
              int64_t* j1) const {
    const int64_t ti = t / nb, tj = t % nb;
    *i0 = ti * mc;
    *i1 = std::min(m, *i0 + mc);
    *j0 = jb + tj * nc;
    *j1 = std::min(je, *j0 + nc);
  }
};

// Rows per task: all of them up to mc_max, else near-equal blocks on multiples of granule.
// Outputs per task: enough tasks for kTasksPerThread per thread, none below kMinMacsPerTask,
// on multiples of kColumnGranule.
inline TaskGrid MakeTaskGrid(int64_t m, int64_t n, int64_t n_in, int n_threads, int granule,
                             int64_t mc_max) {
  TaskGrid g;
  g.mb = (m + mc_max - 1) / mc_max;
  g.mc = ((m + g.mb - 1) / g.mb + granule - 1) / granule * granule;
  g.mb = (m + g.mc - 1) / g.mc;
  if (n_threads <= 1) {
    g.nc = n;
  } else {
    const int64_t want = std::max<int64_t>(1, (int64_t{kTasksPerThread} * n_threads + g.mb - 1) / g.mb);
    const int64_t min_nc = (kMinMacsPerTask + g.mc * n_in - 1) / (g.mc * n_in);
    int64_t nc = std::max((n + want - 1) / want, min_nc);
    nc = (nc + kColumnGranule - 1) / kColumnGranule * kColumnGranule;
    g.nc = std::min(nc, n);
  }
  g.nb = (n + g.nc - 1) / g.nc;
  return g;
}

// Rows per plan so that one plan's prepared x stays under kMaxPreparedBytes (a multiple of
// granule, at least one granule).
inline int64_t PlanChunkRows(int64_t m, int64_t bytes_per_row, int granule) {
  const int64_t rows = kMaxPreparedBytes / std::max<int64_t>(1, bytes_per_row) / granule * granule;
  return std::max<int64_t>(granule, std::min(m, rows));
}

}  // namespace pdserve::kernels::internal
