// The amx level's INT8 kernels (W8A8): tdpbssd tiles. Compiled with the avx512 flags plus
// -mamx-tile -mamx-int8 -mamx-bf16 and run only where DetectedIsa() is kAmx (the process then
// holds the tile-data permission, kernels/isa.cc). Uses only intrinsics, inline asm and its
// own functions (see gemm_avx512.cc on why).
//
// Roles: the weights are the A tile (16 weight rows x 64 k int8, loaded in place from the
// checkpoint layout with the row stride), x is the B tile (16 k-quads x 16 rows of x x 4 int8,
// prepared once per call by a 16x16 dword transpose per 64 k), C = 16 weight rows x 16 x rows of
// int32. A block runs 2 x 2 tiles (32 weight rows x 32 x rows) over all of k; decode (<= 16 x
// rows) runs 2 x 1. Products and sums are exact int32, so every level gives the same bits.
// (BF16 weights at this level use the avx512 kernels: tdpbf16ps sums in an internal order that
// matches no fp32 FMA chain, measured on this CPU, so it would break the one-order contract.)
//
// GCC 12's tile load/store/config intrinsics carry no memory clobber (the compiler may keep a
// buffer's stores after the tile load that reads it), so this file uses its own asm for them.
#include <immintrin.h>

#include <cstring>

#include "kernels/avx512_transpose.h"
#include "kernels/isa_kernels.h"

#if !defined(__AMX_TILE__) || !defined(__AMX_INT8__) || !defined(__AVX512F__)
#error "gemm_amx.cc needs -mamx-tile -mamx-int8 and the avx512 flags"
#endif

#define PDSERVE_TILE_LOAD(t, ptr, stride) \
  __asm__ volatile("tileloadd (%0,%1,1), %%tmm" #t ::"r"(ptr), "r"(static_cast<long>(stride)) : "memory")
#define PDSERVE_TILE_STORE(t, ptr, stride) \
  __asm__ volatile("tilestored %%tmm" #t ", (%0,%1,1)" ::"r"(ptr), "r"(static_cast<long>(stride)) : "memory")

namespace pdserve::kernels::internal::amx {
namespace {

inline int64_t RoundUp(int64_t v, int64_t to) { return (v + to - 1) / to * to; }
inline int64_t Min(int64_t a, int64_t b) { return a < b ? a : b; }

constexpr int64_t kTileBytes = 1024;  // 16 rows x 64 bytes

struct alignas(64) TileConfig {
  uint8_t palette = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

// Tiles 0-3: C (int32 16 x 16); 4, 5: A (weights); 6, 7: B (x). All 16 rows x 64 bytes.
void ConfigureTiles() {
  TileConfig cfg;
  for (int t = 0; t < 8; ++t) {
    cfg.colsb[t] = 64;
    cfg.rows[t] = 16;
  }
  __asm__ volatile("ldtilecfg %0" ::"m"(cfg) : "memory");
}


inline int64_t Steps(int64_t n_in) { return (n_in + 63) / 64; }

// The A tile of weight rows [j, j + 16) at k: in place when all 16 rows exist and the 64 bytes
// lie inside each row's storage up to n_in (or the next row), else a zero-padded copy in pad.
inline const int8_t* ATile(const Int8WeightView& w, int64_t j, int64_t k, int8_t* pad,
                           int64_t* stride) {
  const bool rows_ok = j + 16 <= w.n_out;
  const bool k_ok = k + 64 <= w.n_in;
  if (rows_ok && k_ok) {
    *stride = w.ld;
    return w.data + j * w.ld + k;
  }
  std::memset(pad, 0, kTileBytes);
  const int64_t n = Min(64, w.n_in - k);
  for (int64_t r = 0; r < 16 && j + r < w.n_out; ++r) std::memcpy(pad + r * 64, w.data + (j + r) * w.ld + k, static_cast<size_t>(n));
  *stride = 64;
  return pad;
}

// Writes C tile c (int32 [16 weight rows][16 x rows]) to outputs: x rows [i, i + ni), weight
// rows [j, j + nj), transposed, raw or dequantized.
void Epilogue(const int32_t* c, const Int8Problem& p, int64_t i, int ni, int64_t j, int nj) {
  __m512i r[16];
  for (int t = 0; t < 16; ++t) r[t] = _mm512_load_si512(c + t * 16);
  Transpose16(r);  // r[x row][weight row]
  const __mmask16 mask = nj >= 16 ? 0xffff : static_cast<__mmask16>((1u << nj) - 1);
  if (p.raw) {
    for (int t = 0; t < ni; ++t) _mm512_mask_storeu_epi32(static_cast<int32_t*>(p.y) + (i + t) * p.ldy + j, mask, r[t]);
    return;
  }
  const __m512 ws = _mm512_maskz_loadu_ps(mask, p.w.scales + j);
  for (int t = 0; t < ni; ++t) {
    const __m512 v = _mm512_mul_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(r[t]), _mm512_set1_ps(p.x_scales[i + t])), ws);
    _mm512_mask_storeu_ps(static_cast<float*>(p.y) + (i + t) * p.ldy + j, mask, v);
  }
}

// k steps (64 k) per block: 32 weight rows x 16 steps = 32 KiB of A tiles, reused from L1 by
// every pair of x-row groups of the task.
constexpr int64_t kStepsPerBlock = 16;
// Rows of x per task (kernel_tables.cc: the amx INT8 mc_max) and the partial C tiles they need.
constexpr int64_t kMaxTaskRows = 256;
struct alignas(64) Partials {
  int32_t c[kMaxTaskRows / 32][4][256];
};

// Prefetch distance along each weight row (bytes), into L2: the A tiles read 32 rows at once,
// more streams than the hardware prefetcher follows.
constexpr int64_t kPrefetchAhead = 1024;

}  // namespace

// GEMMs of at most kVnniMaxRows rows run avx512's vpdpbusd kernel instead (exact: the same
// bits), which kept closer to the read bandwidth from DRAM than 16-row tiles carrying 1-4 rows
// (bench_isa). Its prepared rows follow the tiles.
constexpr int64_t kVnniMaxRows = 4;
inline int64_t TilesBytes(int64_t m, int64_t n_in) { return (m + 15) / 16 * Steps(n_in) * kTileBytes; }

int64_t Int8PreparedBytes(int64_t m, int64_t n_in) {
  return TilesBytes(m, n_in) + (m <= kVnniMaxRows ? avx512::Int8PreparedBytes(m, n_in) : 0);
}

// Per group of 16 rows of x, per 64 k: a B tile [quad][x row][4] (rows past m and k past n_in
// zero).
void Int8Prepare(const int8_t* x, int64_t ldx, int64_t m, int64_t i0, int64_t i1, int64_t n_in,
                 void* xp, uint8_t* terms) {
  if (m <= kVnniMaxRows) {
    avx512::Int8Prepare(x, ldx, m, i0, i1, n_in, static_cast<char*>(xp) + TilesBytes(m, n_in), terms);
    return;
  }
  const int64_t steps = Steps(n_in);
  for (int64_t g = i0 / 16; g * 16 < i1; ++g) {
    int8_t* dst = static_cast<int8_t*>(xp) + g * steps * kTileBytes;
    for (int64_t s = 0; s < steps; ++s) {
      const int64_t k = s * 64, valid = n_in - k;
      const __mmask64 mask = valid >= 64 ? ~__mmask64{0} : (__mmask64{1} << valid) - 1;
      __m512i r[16];
      for (int t = 0; t < 16; ++t) {
        const int64_t i = g * 16 + t;
        r[t] = i < m ? _mm512_maskz_loadu_epi8(mask, x + i * ldx + k) : _mm512_setzero_si512();
      }
      Transpose16(r);
      for (int q = 0; q < 16; ++q) _mm512_store_si512(dst + s * kTileBytes + q * 64, r[q]);
    }
  }
}

void Int8Compute(const Int8Problem& p, int64_t i0, int64_t i1, int64_t j0, int64_t j1) {
  if (p.m <= kVnniMaxRows) {
    Int8Problem q = p;
    q.xp = static_cast<const char*>(p.xp) + TilesBytes(p.m, p.w.n_in);
    avx512::Int8Compute(q, i0, i1, j0, j1);
    return;
  }
  const int64_t steps = Steps(p.w.n_in);
  const int8_t* xb = static_cast<const int8_t*>(p.xp);
  alignas(64) int8_t pad0[kTileBytes], pad1[kTileBytes];
  alignas(64) int32_t c[4][256];
  // Partial C tiles of every pair of x-row groups between k blocks (a task has at most 256
  // rows: 8 pairs x 4 tiles x 1 KiB).
  Partials& partials = *static_cast<Partials*>(ThreadScratch(3, sizeof(Partials)));
  ConfigureTiles();
  for (int64_t j = j0; j < j1; j += 32) {
    const int nj = static_cast<int>(Min(32, j1 - j));
    const bool two_a = nj > 16;
    // k blocks of kStepsPerBlock steps: the block's A tiles (32 rows x 1 KiB) stay in L1
    // while every pair of x-row groups passes over them.
    for (int64_t s0 = 0; s0 < steps; s0 += kStepsPerBlock) {
      const int64_t s1 = Min(steps, s0 + kStepsPerBlock);
      const bool first = s0 == 0, last = s1 == steps;
      for (int64_t i = i0, pair = 0; i < i1; i += 32, ++pair) {
        const int ni = static_cast<int>(Min(32, i1 - i));
        const bool two_b = ni > 16;
        const int8_t* b0 = xb + (i / 16) * steps * kTileBytes;
        const int8_t* b1 = b0 + steps * kTileBytes;
        int32_t* saved = partials.c[pair][0];
        if (first) {
          _tile_zero(0);
          _tile_zero(1);
          _tile_zero(2);
          _tile_zero(3);
        } else {
          PDSERVE_TILE_LOAD(0, saved, 64);
          PDSERVE_TILE_LOAD(1, saved + 256, 64);
          PDSERVE_TILE_LOAD(2, saved + 512, 64);
          PDSERVE_TILE_LOAD(3, saved + 768, 64);
        }
        for (int64_t s = s0; s < s1; ++s) {
          const int64_t k = s * 64;
          if (i == i0) {
            for (int r = 0; r < nj; ++r) {
              _mm_prefetch(reinterpret_cast<const char*>(p.w.data + (j + r) * p.w.ld + k) + kPrefetchAhead, _MM_HINT_T1);
            }
          }
          int64_t sa0, sa1 = 64;
          const int8_t* a0 = ATile(p.w, j, k, pad0, &sa0);
          PDSERVE_TILE_LOAD(4, a0, sa0);
          PDSERVE_TILE_LOAD(6, b0 + s * kTileBytes, 64);
          _tile_dpbssd(0, 4, 6);
          if (two_b) {
            PDSERVE_TILE_LOAD(7, b1 + s * kTileBytes, 64);
            _tile_dpbssd(1, 4, 7);
          }
          if (two_a) {
            const int8_t* a1 = ATile(p.w, j + 16, k, pad1, &sa1);
            PDSERVE_TILE_LOAD(5, a1, sa1);
            _tile_dpbssd(2, 5, 6);
            if (two_b) _tile_dpbssd(3, 5, 7);
          }
        }
        if (!last) {
          PDSERVE_TILE_STORE(0, saved, 64);
          PDSERVE_TILE_STORE(1, saved + 256, 64);
          PDSERVE_TILE_STORE(2, saved + 512, 64);
          PDSERVE_TILE_STORE(3, saved + 768, 64);
          continue;
        }
        PDSERVE_TILE_STORE(0, c[0], 64);
        Epilogue(c[0], p, i, ni < 16 ? ni : 16, j, nj < 16 ? nj : 16);
        if (two_b) {
          PDSERVE_TILE_STORE(1, c[1], 64);
          Epilogue(c[1], p, i + 16, ni - 16, j, nj < 16 ? nj : 16);
        }
        if (two_a) {
          PDSERVE_TILE_STORE(2, c[2], 64);
          Epilogue(c[2], p, i, ni < 16 ? ni : 16, j + 16, nj - 16);
          if (two_b) {
            PDSERVE_TILE_STORE(3, c[3], 64);
            Epilogue(c[3], p, i + 16, ni - 16, j + 16, nj - 16);
          }
        }
      }
    }
  }
  _tile_release();
}

}  // namespace pdserve::kernels::internal::amx
