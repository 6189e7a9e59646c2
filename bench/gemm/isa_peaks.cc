// See isa_peaks.h. Loops in asm: with intrinsics the compiler would hoist the loop-invariant
// instructions out of the loop.
#include "bench/gemm/isa_peaks.h"

#include <sys/syscall.h>
#include <unistd.h>

#include <chrono>
#include <cstring>

namespace pdserve::bench {
namespace {

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

#define PDSERVE_ZMM_LOOP(name, insn, macs)                                                        \
  double name(int64_t iters) {                                                                    \
    const double t0 = Now();                                                                      \
    for (int64_t it = 0; it < iters; ++it) {                                                      \
      asm volatile(insn " %%zmm31, %%zmm30, %%zmm0\n\t" insn " %%zmm31, %%zmm30, %%zmm1\n\t"      \
                   insn " %%zmm31, %%zmm30, %%zmm2\n\t" insn " %%zmm31, %%zmm30, %%zmm3\n\t"      \
                   insn " %%zmm31, %%zmm30, %%zmm4\n\t" insn " %%zmm31, %%zmm30, %%zmm5\n\t"      \
                   insn " %%zmm31, %%zmm30, %%zmm6\n\t" insn " %%zmm31, %%zmm30, %%zmm7\n\t"      \
                   insn " %%zmm31, %%zmm30, %%zmm8\n\t" insn " %%zmm31, %%zmm30, %%zmm9\n\t"      \
                   insn " %%zmm31, %%zmm30, %%zmm10\n\t" insn " %%zmm31, %%zmm30, %%zmm11\n\t"    \
                   :                                                                              \
                   :                                                                              \
                   : "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8",      \
                     "xmm9", "xmm10", "xmm11");                                                   \
    }                                                                                             \
    return static_cast<double>(iters) * 12 * (macs) / (Now() - t0) / 1e9;                         \
  }

}  // namespace

PDSERVE_ZMM_LOOP(Avx512FmaGmacs, "vfmadd231ps", 16)
PDSERVE_ZMM_LOOP(Avx512Bf16DotGmacs, "vdpbf16ps", 32)
PDSERVE_ZMM_LOOP(Avx512VnniGmacs, "vpdpbusd", 64)

namespace {
struct alignas(64) TileConfig {
  uint8_t palette = 1, start_row = 0, reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

template <bool kInt8>
double AmxLoop(int64_t iters) {
  syscall(SYS_arch_prctl, 0x1023, 18);
  TileConfig cfg;
  for (int t = 0; t < 8; ++t) {
    cfg.colsb[t] = 64;
    cfg.rows[t] = 16;
  }
  asm volatile("ldtilecfg %0" ::"m"(cfg) : "memory");
  alignas(64) static char zeros[1024];
  asm volatile("tileloadd (%0,%1,1), %%tmm4\n\ttileloadd (%0,%1,1), %%tmm5\n\t"
               "tileloadd (%0,%1,1), %%tmm6\n\ttileloadd (%0,%1,1), %%tmm7\n\t"
               "tilezero %%tmm0\n\ttilezero %%tmm1\n\ttilezero %%tmm2\n\ttilezero %%tmm3" ::"r"(zeros),
               "r"(64L)
               : "memory");
  const double t0 = Now();
  for (int64_t it = 0; it < iters; ++it) {
    if constexpr (kInt8) {
      asm volatile("tdpbssd %%tmm6, %%tmm4, %%tmm0\n\ttdpbssd %%tmm7, %%tmm4, %%tmm1\n\t"
                   "tdpbssd %%tmm6, %%tmm5, %%tmm2\n\ttdpbssd %%tmm7, %%tmm5, %%tmm3" ::);
    } else {
      asm volatile("tdpbf16ps %%tmm6, %%tmm4, %%tmm0\n\ttdpbf16ps %%tmm7, %%tmm4, %%tmm1\n\t"
                   "tdpbf16ps %%tmm6, %%tmm5, %%tmm2\n\ttdpbf16ps %%tmm7, %%tmm5, %%tmm3" ::);
    }
  }
  const double sec = Now() - t0;
  asm volatile("tilerelease" ::);
  return static_cast<double>(iters) * 4 * (kInt8 ? 16384 : 8192) / sec / 1e9;
}
}  // namespace

double AmxInt8Gmacs(int64_t iters) { return AmxLoop<true>(iters); }
double AmxBf16Gmacs(int64_t iters) { return AmxLoop<false>(iters); }

}  // namespace pdserve::bench
