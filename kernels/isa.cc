// ISA detection (cpuid, xgetbv, arch_prctl), the PDSERVE_ISA override, and the active table.
#include "kernels/isa.h"

#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <mutex>

#include "common/logging.h"
#include "kernels/kernel_table.h"

namespace pdserve::kernels {
namespace {

struct Features {
  bool avx512f = false, avx512dq = false, avx512bw = false, avx512vl = false;
  bool avx512vnni = false, avx512bf16 = false;
  bool amx_tile = false, amx_int8 = false, amx_bf16 = false;
  bool os_zmm = false;   // XCR0: opmask, ZMM_Hi256, Hi16_ZMM (and SSE/AVX) state saved
  bool os_tile = false;  // XCR0: XTILECFG and XTILEDATA saved
  bool tile_perm = false;  // arch_prctl granted XTILEDATA to this process
};

void Cpuid(unsigned leaf, unsigned sub, unsigned r[4]) {
  __asm__("cpuid" : "=a"(r[0]), "=b"(r[1]), "=c"(r[2]), "=d"(r[3]) : "a"(leaf), "c"(sub));
}

Features Probe() {
  Features f;
  unsigned r[4];
  Cpuid(0, 0, r);
  const unsigned max_leaf = r[0];
  Cpuid(1, 0, r);
  const bool osxsave = (r[2] >> 27) & 1;
  if (max_leaf < 7 || !osxsave) return f;
  unsigned xcr0_lo, xcr0_hi;
  __asm__("xgetbv" : "=a"(xcr0_lo), "=d"(xcr0_hi) : "c"(0));
  const uint64_t xcr0 = (uint64_t{xcr0_hi} << 32) | xcr0_lo;
  f.os_zmm = (xcr0 & 0xe6) == 0xe6;            // bits 1, 2, 5, 6, 7
  f.os_tile = (xcr0 & (3ull << 17)) == (3ull << 17);  // bits 17, 18
  Cpuid(7, 0, r);
  const unsigned max_sub = r[0];
  f.avx512f = (r[1] >> 16) & 1;
  f.avx512dq = (r[1] >> 17) & 1;
  f.avx512bw = (r[1] >> 30) & 1;
  f.avx512vl = (r[1] >> 31) & 1;
  f.avx512vnni = (r[2] >> 11) & 1;
  f.amx_bf16 = (r[3] >> 22) & 1;
  f.amx_tile = (r[3] >> 24) & 1;
  f.amx_int8 = (r[3] >> 25) & 1;
  if (max_sub >= 1) {
    Cpuid(7, 1, r);
    f.avx512bf16 = (r[0] >> 5) & 1;
  }
  if (f.amx_tile && f.os_tile) {
    // Linux >= 5.16: tile data is off until the process asks for it (once, for all threads).
    constexpr long kArchReqXcompPerm = 0x1023;
    constexpr long kXfeatureXtiledata = 18;
    f.tile_perm = syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
  }
  return f;
}

const Features& Cpu() {
  static const Features f = Probe();
  return f;
}

std::string Missing(Isa isa, const Features& f) {
  std::string m;
  auto need = [&](bool have, const char* name) {
    if (!have) m += std::string(m.empty() ? "" : " ") + name;
  };
  if (isa >= Isa::kAvx512) {
    need(f.avx512f, "avx512f");
    need(f.avx512dq, "avx512dq");
    need(f.avx512bw, "avx512bw");
    need(f.avx512vl, "avx512vl");
    need(f.avx512vnni, "avx512_vnni");
    need(f.os_zmm, "OS support for zmm state (XCR0)");
  }
  if (isa >= Isa::kAmx) {
    need(f.amx_tile, "amx-tile");
    need(f.amx_int8, "amx-int8");
    need(f.amx_bf16, "amx-bf16");
    need(f.os_tile, "OS support for tile state (XCR0)");
    if (f.amx_tile && f.os_tile) need(f.tile_perm, "tile data permission (arch_prctl)");
  }
  return m;
}

struct Selection {
  Result<Isa> isa = Status::Internal("unset");
  std::atomic<const internal::KernelTable*> table{nullptr};
};

Selection& Selected() {
  static Selection* s = [] {
    auto* sel = new Selection;  // never freed: read by kernels until exit
    const Isa detected = DetectedIsa();
    const char* env = std::getenv("PDSERVE_ISA");
    const std::string asked = env ? env : "";
    if (asked.empty()) {
      sel->isa = detected;
    } else if (const std::optional<Isa> want = ParseIsa(asked); !want) {
      sel->isa = Status::InvalidArgument("PDSERVE_ISA='" + asked +
                                         "' is not an ISA level (avx2, avx512 or amx)");
    } else if (*want > detected) {
      sel->isa = Status::InvalidArgument(
          std::string("PDSERVE_ISA=") + asked + ", but this machine lacks " +
          MissingFeatures(*want) + " (best level here: " + IsaName(detected) + ")");
    } else {
      sel->isa = *want;
    }
    if (sel->isa.ok()) {
      sel->table.store(&internal::TableFor(*sel->isa), std::memory_order_release);
      GetLogger("kernels")->debug("kernels ISA: {} ({}); detected {}{}", IsaName(*sel->isa),
                                 IsaFeatures(*sel->isa), IsaName(detected),
                                 asked.empty() ? "" : ", set by PDSERVE_ISA");
    }
    return sel;
  }();
  return *s;
}

}  // namespace

const char* IsaName(Isa isa) {
  switch (isa) {
    case Isa::kAvx2: return "avx2";
    case Isa::kAvx512: return "avx512";
    case Isa::kAmx: return "amx";
  }
  return "?";
}

const char* IsaFeatures(Isa isa) {
  switch (isa) {
    case Isa::kAvx2: return "AVX2+FMA+F16C";
    case Isa::kAvx512: return "AVX-512 F/DQ/BW/VL + VNNI";
    case Isa::kAmx: return "AVX-512 F/DQ/BW/VL + VNNI, AMX-TILE/INT8/BF16";
  }
  return "?";
}

std::optional<Isa> ParseIsa(std::string_view name) {
  for (Isa isa : {Isa::kAvx2, Isa::kAvx512, Isa::kAmx}) {
    if (name == IsaName(isa)) return isa;
  }
  return std::nullopt;
}

Isa DetectedIsa() {
  static const Isa isa = [] {
    const Features& f = Cpu();
    if (Missing(Isa::kAmx, f).empty()) return Isa::kAmx;
    if (Missing(Isa::kAvx512, f).empty()) return Isa::kAvx512;
    return Isa::kAvx2;
  }();
  return isa;
}

std::string MissingFeatures(Isa isa) { return Missing(isa, Cpu()); }

bool HasAvx512Bf16() { return Cpu().avx512bf16 && Cpu().os_zmm; }

Result<Isa> SelectIsa() { return Selected().isa; }

Isa ActiveIsa() {
  const Result<Isa>& r = Selected().isa;
  PDSERVE_CHECK(r.ok(), r.status().ToString());
  return *r;
}

void RequireIsa() {
  const Result<Isa>& r = Selected().isa;
  if (!r.ok()) {
    std::fprintf(stderr, "pdserve: %s\n", r.status().ToString().c_str());
    std::exit(1);
  }
}

namespace internal {

const KernelTable& TableFor(Isa isa) {
  PDSERVE_CHECK(isa <= DetectedIsa(), "kernel table of an ISA level this machine lacks");
  switch (isa) {
    case Isa::kAvx2: return kAvx2Table;
    case Isa::kAvx512: return kAvx512Table;
    case Isa::kAmx: return kAmxTable;
  }
  return kAvx2Table;
}

const KernelTable& ActiveTable() {
  Selection& s = Selected();
  const KernelTable* t = s.table.load(std::memory_order_acquire);
  if (t == nullptr) ActiveIsa();  // aborts with the selection error
  return *s.table.load(std::memory_order_acquire);
}

Isa TEST_SetActiveIsa(Isa isa) {
  Selection& s = Selected();
  const KernelTable* old = s.table.load(std::memory_order_acquire);
  s.table.store(&TableFor(isa), std::memory_order_release);
  return old != nullptr ? old->isa : DetectedIsa();
}

}  // namespace internal
}  // namespace pdserve::kernels
