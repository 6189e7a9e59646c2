// The instruction-set level the kernels run at, chosen once per process.
//
// Every build runs on the AVX2 + FMA + F16C baseline (common/cpu_features.h). Kernel variants for
// wider ISAs are compiled per file with their own flags (kernels/CMakeLists.txt) and reached
// only through the dispatch table of the level chosen here (kernels/kernel_table.h), so no
// caller ever holds an #ifdef or runs an instruction its CPU lacks.
//
//   kAvx2    AVX2 + FMA + F16C: the baseline.
//   kAvx512  AVX-512 F/DQ/BW/VL + AVX512_VNNI (Ice Lake, Zen 4/5, Sapphire Rapids and later),
//            with the OS saving the zmm/opmask state (XCR0 bits 5-7). AVX512_BF16 is not
//            needed: no kernel uses its instructions (vdpbf16ps would break the one summation
//            order, docs/kernels-gemm.md), and hypervisors often hide it (an Emerald Rapids guest
//            here showed VNNI without BF16 or AMX). A CPU without VNNI (Skylake-X) runs kAvx2.
//   kAmx     kAvx512 + AMX-TILE/INT8/BF16, with the OS saving tile state (XCR0 bits 17-18)
//            and granting this process the tile data (Linux arch_prctl(ARCH_REQ_XCOMP_PERM,
//            XFEATURE_XTILEDATA), requested once here).
//
// Selection: the highest level the CPU and OS support, or lower if the environment variable
// PDSERVE_ISA=avx2|avx512|amx asks for it (side-by-side runs, tests). Asking for a level the
// machine lacks, or an unknown name, is an error (SelectIsa) that the binaries report at
// start-up (RequireIsa); a kernel reached first without that check aborts with the same message.
// The choice is logged once (logger "kernels", info).
// Thread-safety: every function may be called from any thread; the first call decides.
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include "common/status.h"

namespace pdserve::kernels {

enum class Isa : int { kAvx2 = 0, kAvx512 = 1, kAmx = 2 };
inline constexpr int kNumIsas = 3;

// "avx2", "avx512", "amx".
const char* IsaName(Isa isa);
// The features a level stands for, e.g. "AVX-512 F/DQ/BW/VL + VNNI".
const char* IsaFeatures(Isa isa);
// Parses an IsaName (exact, lower case).
std::optional<Isa> ParseIsa(std::string_view name);

// The highest level this CPU and OS support (cpuid, xgetbv, and for AMX the arch_prctl grant).
// Detected once; never affected by PDSERVE_ISA.
Isa DetectedIsa();
// For a level above DetectedIsa(): which of its features are missing, e.g. "amx-tile amx-int8";
// empty when the level is supported.
std::string MissingFeatures(Isa isa);
// Whether the CPU and OS run AVX512_BF16 (vdpbf16ps). No kernel uses it; bench_isa measures it.
bool HasAvx512Bf16();

// The level chosen for this process: DetectedIsa(), or PDSERVE_ISA when set. Errors
// (InvalidArgument): PDSERVE_ISA is not a level name, or names a level the machine lacks
// ("PDSERVE_ISA=amx, but this CPU lacks amx-tile amx-int8 amx-bf16 (best here: avx512)").
Result<Isa> SelectIsa();
// The chosen level; aborts with SelectIsa()'s message if PDSERVE_ISA is bad.
Isa ActiveIsa();
// Prints SelectIsa()'s error and exits(1): called by the binaries at start-up, after
// RequireCpuFeatures().
void RequireIsa();

}  // namespace pdserve::kernels
