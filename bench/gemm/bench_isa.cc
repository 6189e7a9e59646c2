// bench_isa: the GEMM kernels at every ISA level this CPU has (kernels/isa.h), against the
// ceilings measured in the same run:
//   * compute peaks per level: register-only loops of the instruction each kernel is built on
//     (fp32 FMA ymm, vpmaddwd+vpaddd; vdpbf16ps, vpdpbusd zmm; tdpbssd, and tdpbf16ps for
//     reference) on all threads;
//   * read bandwidth: streaming sums over 1 GiB on all threads (best of 1, 4 and 8 streams per
//     thread, with and without software prefetch).
// Sections, each per level:
//   gemv:    m = 1, weights rotated over 1 GiB (read from DRAM, as in a decode step), BF16
//            row-major, BF16 prepacked (kPanels16, as the model loads them) and W8A8
//            (activation quantization included): GB/s of weights and share of the read
//            bandwidth, on the `small` and `v32-slice` layer shapes;
//   batch:   m = 16 and 64, hot weights (cache-resident: the compute ceiling) and cold ones
//            (DRAM: ceiling min(peak, arithmetic intensity x read bandwidth)): share of each;
//   prefill: m = 512, hot weights: INT8 / BF16 time ratio.
// Activations are bf16-exact, as every projection input of the model is (the avx512 BF16 path
// needs it; other rows take the avx2 kernels, same bits).
// Usage: bench_isa [--threads N] [--rounds R] [--quick]. Prints the load average beside every
// section; writes bench/results/gemm_isa.{json,md}.
#include <immintrin.h>

#include <algorithm>
#include <cstdio>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "bench/common/bench_util.h"
#include "bench/gemm/isa_peaks.h"
#include "common/cpu_features.h"
#include "common/dtype.h"
#include "common/thread_pool.h"
#include "kernels/gemm.h"
#include "kernels/gemm_int8.h"
#include "kernels/gemm_int8_internal.h"
#include "kernels/gemm_internal.h"
#include "kernels/isa.h"
#include "kernels/quantize.h"

namespace pdserve::bench {
namespace {

using kernels::Isa;

std::string LoadAverage() { return CommandOutput("cut -d' ' -f1-3 /proc/loadavg"); }

// Best over rounds of the median of `reps` calls.
double Best(const std::function<void()>& fn, int reps, int rounds) {
  double best = 1e30;
  for (int r = 0; r < rounds; ++r) best = std::min(best, MedianSeconds(fn, reps));
  return best;
}

double Peak(double (*loop)(int64_t), int threads, int rounds, int64_t iters) {
  double best = 0;
  for (int r = 0; r < rounds; ++r) best = std::max(best, OnThreads(threads, [&](int) { return loop(iters); }));
  return best;
}
double PeakWall(double (*loop)(int64_t, double (*)()), int threads, int rounds, int64_t iters) {
  return PeakGmacs(loop, threads, rounds, iters);
}

// Read bandwidth from each thread's L2 (sums over 512 KiB per thread, 200 passes): the ceiling of
// a kernel whose weights are cache-resident but used too few times per load to reach the
// compute peak (intensity x this).
double HotReadBandwidthGBps(int threads) {
  return OnThreads(threads, [](int) {
    std::vector<float> buf(128 * 1024, 1.0f);
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    const auto t0 = Clock::now();
    for (int pass = 0; pass < 200; ++pass) {
      for (size_t i = 0; i + 32 <= buf.size(); i += 32) {
        a0 = _mm256_add_ps(a0, _mm256_loadu_ps(&buf[i]));
        a1 = _mm256_add_ps(a1, _mm256_loadu_ps(&buf[i + 8]));
        a2 = _mm256_add_ps(a2, _mm256_loadu_ps(&buf[i + 16]));
        a3 = _mm256_add_ps(a3, _mm256_loadu_ps(&buf[i + 24]));
      }
    }
    const double sec = SecondsSince(t0);
    alignas(32) float l[8];
    _mm256_store_ps(l, _mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
    if (l[0] < 0) std::printf(" ");
    return 200.0 * buf.size() * 4 / sec / 1e9;
  });
}

// Read bandwidth over 1 GiB with each thread's slice read as `streams` interleaved sequential
// streams, optionally with software prefetch 2 KiB ahead (what the GEMV kernels do): the
// roofline is the best of these and of bench_util's single-stream probe, so a kernel that
// prefetches is not measured against a probe that does not.
double StreamsReadGBps(const std::vector<float>& buf, int threads, int streams, bool prefetch) {
  const size_t n = buf.size();
  const auto t0 = Clock::now();
  const double sum = OnThreads(threads, [&](int t) {
    const size_t begin = n / threads * t, len = n / threads / streams / 32 * 32;
    __m256 acc[8];
    for (auto& a : acc) a = _mm256_setzero_ps();
    for (size_t i = 0; i < len; i += 16) {
      for (int s = 0; s < streams; ++s) {
        const float* p = &buf[begin + s * len + i];
        if (prefetch) _mm_prefetch(reinterpret_cast<const char*>(p) + 2048, _MM_HINT_T0);
        acc[s] = _mm256_add_ps(acc[s], _mm256_add_ps(_mm256_loadu_ps(p), _mm256_loadu_ps(p + 8)));
      }
    }
    alignas(32) float l[8];
    __m256 tot = _mm256_setzero_ps();
    for (int s = 0; s < streams; ++s) tot = _mm256_add_ps(tot, acc[s]);
    _mm256_store_ps(l, tot);
    return static_cast<double>(l[0]);
  });
  const double sec = SecondsSince(t0);
  if (sum < 0) std::printf(" ");
  return static_cast<double>(n) * 4 / sec / 1e9;
}

struct Shape {
  int64_t n_out, n_in;
  const char* what;
};
const Shape kGemvShapes[] = {{1024, 1024, "small o_proj/2"},     {3072, 384, "small q_b_proj"},
                             {256, 1024, "small expert gate/up"}, {1024, 256, "small expert down"},
                             {32000, 1024, "small lm_head"},      {2048, 7168, "v32 expert gate/up"},
                             {7168, 2048, "v32 expert down"},     {24576, 1536, "v32 q_b_proj"},
                             {7168, 16384, "v32 o_proj"}};
const Shape kBatchShapes[] = {{2048, 7168, "v32 expert gate/up"}, {7168, 2048, "v32 expert down"},
                              {2048, 1024, "small o_proj^T"}};
const Shape kPrefillShapes[] = {{1024, 1024, "small o_proj/2"},      {2048, 1024, "small o_proj^T"},
                                {3072, 384, "small q_b_proj"},       {256, 1024, "small expert gate/up"},
                                {1024, 256, "small expert down"},    {2048, 7168, "v32 expert gate/up"},
                                {7168, 2048, "v32 expert down"}};

struct Ceilings {
  double bf16 = 0, int8 = 0;  // GMAC/s of the instruction the level's kernels use
};

struct Data {
  std::vector<uint16_t> wb;   // rotated bf16 weights
  std::vector<int8_t> wq;     // rotated int8 weights
  std::vector<float> ws, x, xs, y;
  std::vector<int8_t> xq;
};

int Main(int argc, char** argv) {
  RequireCpuFeatures();
  kernels::RequireIsa();
  int threads = 2, rounds = 3;
  bool quick = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--threads" && i + 1 < argc) threads = std::atoi(argv[++i]);
    else if (a == "--rounds" && i + 1 < argc) rounds = std::atoi(argv[++i]);
    else if (a == "--quick") quick = true;
    else {
      std::fprintf(stderr, "usage: bench_isa [--threads N] [--rounds R] [--quick]\n");
      return 2;
    }
  }
  if (quick) rounds = 1;
  ThreadPool pool(threads);
  std::vector<Isa> isas;
  for (Isa isa : {Isa::kAvx2, Isa::kAvx512, Isa::kAmx}) {
    if (isa <= kernels::DetectedIsa()) isas.push_back(isa);
  }
  nlohmann::json j;
  std::string md = "# bench_isa\n\n";
  char line[1024];
  auto add = [&](const std::string& s) {
    md += s;
    std::fputs(s.c_str(), stdout);
    std::fflush(stdout);
  };
  std::snprintf(line, sizeof(line), "- machine: %s; git %s; %d threads; levels here: %s%s%s\n",
                MachineName().c_str(), GitRevision().c_str(), threads, kernels::IsaName(isas[0]),
                isas.size() > 1 ? ", avx512" : "", isas.size() > 2 ? ", amx" : "");
  add(line);

  // ---- ceilings ----
  const std::string load0 = LoadAverage();
  const int64_t it = quick ? 5'000'000 : 20'000'000;
  std::vector<Ceilings> ceil(3);
  const double fma_ymm = PeakWall(&FmaLoopGmacs, threads, rounds, it);
  const double madd_ymm = PeakWall(&Int16MaddAddLoopGmacs, threads, rounds, it);
  ceil[0] = {fma_ymm, madd_ymm};
  double fma_zmm = 0, dpbf16 = 0, vnni = 0, amx_i8 = 0, amx_bf16 = 0;
  if (isas.size() > 1) {
    fma_zmm = Peak(&Avx512FmaGmacs, threads, rounds, it);
    // Not part of the avx512 level (kernels/isa.h): a CPU may lack it (0 in the report).
    if (kernels::HasAvx512Bf16()) dpbf16 = Peak(&Avx512Bf16DotGmacs, threads, rounds, it);
    vnni = Peak(&Avx512VnniGmacs, threads, rounds, it);
    ceil[1] = {fma_zmm, vnni};
  }
  if (isas.size() > 2) {
    amx_i8 = Peak(&AmxInt8Gmacs, threads, rounds, it / 64);
    amx_bf16 = Peak(&AmxBf16Gmacs, threads, rounds, it / 64);
    ceil[2] = {fma_zmm, amx_i8};
  }
  double bw = ReadBandwidthGBps(threads, rounds + 2);
  {
    std::vector<float> buf((size_t{1} << 30) / 4, 1.0f);
    for (int r = 0; r < rounds + 1; ++r) {
      for (int streams : {1, 4, 8}) {
        for (bool pf : {false, true}) bw = std::max(bw, StreamsReadGBps(buf, threads, streams, pf));
      }
    }
  }
  double hot_bw = 0;
  for (int r = 0; r < rounds + 2; ++r) hot_bw = std::max(hot_bw, HotReadBandwidthGBps(threads));
  std::snprintf(line, sizeof(line),
                "\n## Ceilings (load average %s)\n\n| loop | GMAC/s | used as |\n|---|---|---|\n"
                "| fp32 FMA ymm (vfmadd231ps) | %.1f | avx2 BF16/F32 peak |\n"
                "| vpmaddwd + vpaddd ymm | %.1f | avx2 INT8 peak |\n",
                load0.c_str(), fma_ymm, madd_ymm);
  add(line);
  if (isas.size() > 1) {
    std::snprintf(line, sizeof(line),
                  "| fp32 FMA zmm | %.1f | avx512/amx BF16/F32 peak |\n| vdpbf16ps zmm | %.1f | not used (half the FMA rate here; 0: the CPU lacks AVX512_BF16) |\n"
                  "| vpdpbusd zmm | %.1f | avx512 INT8 peak |\n",
                  fma_zmm, dpbf16, vnni);
    add(line);
  }
  if (isas.size() > 2) {
    std::snprintf(line, sizeof(line),
                  "| AMX tdpbssd | %.1f | amx INT8 peak |\n| AMX tdpbf16ps | %.1f | not used (breaks the one order; docs) |\n",
                  amx_i8, amx_bf16);
    add(line);
  }
  std::snprintf(line, sizeof(line),
                "\nRead bandwidth (1 GiB, %d threads, best of 1/4/8 streams per thread with and without prefetch): **%.1f GB/s**; from L2 (512 KiB per thread): %.1f GB/s\n",
                threads, bw, hot_bw);
  add(line);
  j["ceilings"] = {{"load_average", load0}, {"fma_ymm_gmacs", fma_ymm}, {"vpmaddwd_ymm_gmacs", madd_ymm},
                   {"fma_zmm_gmacs", fma_zmm}, {"vdpbf16ps_gmacs", dpbf16}, {"vpdpbusd_gmacs", vnni},
                   {"amx_int8_gmacs", amx_i8}, {"amx_bf16_gmacs", amx_bf16}, {"read_bw_gbps", bw}, {"l2_read_bw_gbps", hot_bw}};

  // ---- data ----
  const int64_t rot_bytes = int64_t{1} << 30;  // as the bandwidth probe: past the 300 MiB L3
  Data d;
  {
    std::mt19937 rng(7);
    std::uniform_int_distribution<int> code(-127, 127);
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    d.wb.resize(static_cast<size_t>(rot_bytes / 2));
    for (size_t i = 0; i < d.wb.size(); ++i) d.wb[i] = F32ToBf16Bits(u(rng) * 0.05f);
    d.wq.resize(static_cast<size_t>(rot_bytes));
    for (size_t i = 0; i < d.wq.size(); i += 64) {
      const int8_t v = static_cast<int8_t>(code(rng));
      std::fill_n(d.wq.begin() + static_cast<std::ptrdiff_t>(i), 64, v);
    }
    d.ws.assign(32768, 0.01f);
    d.x.resize(512 * 16384);
    for (float& v : d.x) v = RoundToBf16(u(rng));
    d.xq.resize(d.x.size());
    d.xs.resize(512);
    d.y.resize(512 * 32768);
  }
  auto quantize = [&](int64_t m, int64_t n_in) {
    if (m == 1) {
      kernels::QuantizeRowsInt8(d.x.data(), 1, n_in, n_in, d.xq.data(), n_in, d.xs.data());
      return;
    }
    pool.ParallelFor(m, [&](int64_t b, int64_t e) {
      kernels::QuantizeRowsInt8(d.x.data() + b * n_in, e - b, n_in, n_in, d.xq.data() + b * n_in, n_in,
                                d.xs.data() + b);
    });
  };
  kernels::QuantizeRowsInt8(d.x.data(), 512, 1024, 1024, d.xq.data(), 1024, d.xs.data());
  // One call of each format at a level: weights copy `c` of the rotation (hot: always copy 0).
  auto bf16_call = [&](Isa isa, const Shape& s, int64_t m, int64_t c) {
    const kernels::WeightView v{DType::kBF16, d.wb.data() + c * s.n_out * s.n_in, s.n_out, s.n_in, s.n_in};
    kernels::internal::GemmWithIsa(isa, d.x.data(), m, s.n_in, v, d.y.data(), s.n_out, &pool);
  };
  auto int8_call = [&](Isa isa, const Shape& s, int64_t m, int64_t c, bool with_quant) {
    if (with_quant) quantize(m, s.n_in);
    const kernels::Int8WeightView v{d.wq.data() + c * s.n_out * s.n_in, d.ws.data(), s.n_out, s.n_in, s.n_in};
    kernels::internal::GemmInt8WithIsa(isa, d.xq.data(), d.xs.data(), m, s.n_in, v, d.y.data(), s.n_out, &pool);
  };

  // The first `copies` BF16 weight copies of a shape, prepacked as the model loads them
  // (kernels/gemm.h kPanels16).
  auto pack_copies = [&](const Shape& s, int64_t copies) {
    std::vector<kernels::PackedBf16Weights> packed;
    for (int64_t c = 0; c < copies; ++c) {
      packed.push_back(kernels::PackedBf16Weights::Pack(
          kernels::WeightView{DType::kBF16, d.wb.data() + c * s.n_out * s.n_in, s.n_out, s.n_in, s.n_in}, &pool));
    }
    return packed;
  };

  // ---- gemv ----
  std::snprintf(line, sizeof(line),
                "\n## GEMV m = 1, weights from DRAM (load average %s): GB/s of weights, share of %.1f GB/s\n\n"
                "| shape | level | BF16 GB/s | BF16 share | BF16 packed GB/s | packed share | W8A8 GB/s (with quant) | W8A8 share | W8A8/BF16 time |\n"
                "|---|---|---|---|---|---|---|---|---|\n",
                LoadAverage().c_str(), bw);
  add(line);
  nlohmann::json gemv = nlohmann::json::array();
  for (const Shape& s : kGemvShapes) {
    const int64_t per = s.n_out * s.n_in;
    const int64_t copies_b = std::max<int64_t>(1, rot_bytes / 2 / per), copies_q = std::max<int64_t>(1, rot_bytes / per);
    const std::vector<kernels::PackedBf16Weights> packed = pack_copies(s, copies_b);
    for (Isa isa : isas) {
      int64_t cb = 0, cp = 0, cq = 0;
      const double tb = Best([&] { bf16_call(isa, s, 1, cb++ % copies_b); }, quick ? 11 : 31, rounds);
      const double tp = Best([&] {
        kernels::internal::GemmWithIsa(isa, d.x.data(), 1, s.n_in, packed[static_cast<size_t>(cp++ % copies_b)].view(),
                                       d.y.data(), s.n_out, &pool);
      }, quick ? 11 : 31, rounds);
      const double tq = Best([&] { int8_call(isa, s, 1, cq++ % copies_q, true); }, quick ? 11 : 31, rounds);
      const double gb = per * 2 / tb / 1e9, gp = per * 2 / tp / 1e9, gq = per / tq / 1e9;
      std::snprintf(line, sizeof(line), "| %lldx%lld %s | %s | %.1f | %.2f | %.1f | %.2f | %.1f | %.2f | %.2fx |\n",
                    static_cast<long long>(s.n_out), static_cast<long long>(s.n_in), s.what, kernels::IsaName(isa),
                    gb, gb / bw, gp, gp / bw, gq, gq / bw, tb / tq);
      add(line);
      gemv.push_back({{"shape", s.what}, {"n_out", s.n_out}, {"n_in", s.n_in}, {"isa", kernels::IsaName(isa)},
                      {"bf16_gbps", gb}, {"bf16_share_of_bw", gb / bw}, {"bf16_packed_gbps", gp},
                      {"bf16_packed_share_of_bw", gp / bw}, {"int8_gbps", gq},
                      {"int8_share_of_bw", gq / bw}, {"int8_speedup", tb / tq}});
    }
  }
  j["gemv"] = gemv;

  // ---- batch ----
  std::snprintf(line, sizeof(line),
                "\n## Linear layers at batch m = 16, 64 (load average %s)\n\n"
                "Hot: one weight copy (cache-resident): share of the level's peak, and of min(peak, intensity x %.1f GB/s "
                "from L2). Cold: weights rotated over 1 GiB: share of min(peak, intensity x %.1f GB/s).\n\n"
                "| shape | m | level | BF16 GFLOP/s hot | of peak | of L2 ceiling | cold | of ceiling | BF16 packed hot | of peak | packed cold | of ceiling | INT8 GOP/s hot | of peak | of L2 ceiling | cold | of ceiling |\n"
                "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n",
                LoadAverage().c_str(), hot_bw, bw);
  add(line);
  nlohmann::json batch = nlohmann::json::array();
  for (const Shape& s : kBatchShapes) {
    const int64_t per = s.n_out * s.n_in;
    const int64_t copies_b = std::max<int64_t>(1, rot_bytes / 2 / per), copies_q = std::max<int64_t>(1, rot_bytes / per);
    const std::vector<kernels::PackedBf16Weights> packed = pack_copies(s, copies_b);
    auto packed_call = [&](Isa isa, int64_t m, int64_t c) {
      kernels::internal::GemmWithIsa(isa, d.x.data(), m, s.n_in, packed[static_cast<size_t>(c)].view(), d.y.data(),
                                     s.n_out, &pool);
    };
    for (int64_t m : {16, 64}) {
      const double flop = 2.0 * m * per;
      for (Isa isa : isas) {
        const Ceilings& c = ceil[static_cast<int>(isa)];
        int64_t cb = 0, cp = 0, cq = 0;
        const double tbh = Best([&] { bf16_call(isa, s, m, 0); }, 11, rounds);
        const double tbc = Best([&] { bf16_call(isa, s, m, cb++ % copies_b); }, 11, rounds);
        const double tph = Best([&] { packed_call(isa, m, 0); }, 11, rounds);
        const double tpc = Best([&] { packed_call(isa, m, cp++ % copies_b); }, 11, rounds);
        const double tqh = Best([&] { int8_call(isa, s, m, 0, false); }, 11, rounds);
        const double tqc = Best([&] { int8_call(isa, s, m, cq++ % copies_q, false); }, 11, rounds);
        const double pb = 2 * c.bf16, pq = 2 * c.int8;  // GFLOP/s (2 per MAC)
        const double rb = std::min(pb, flop / (per * 2.0) * bw), rq = std::min(pq, flop / per * bw);
        const double hb = std::min(pb, flop / (per * 2.0) * hot_bw), hq = std::min(pq, flop / per * hot_bw);
        std::snprintf(line, sizeof(line),
                      "| %lldx%lld %s | %lld | %s | %.0f | %.2f | %.2f | %.0f | %.2f | %.0f | %.2f | %.0f | %.2f | %.0f | %.2f | %.2f | %.0f | %.2f |\n",
                      static_cast<long long>(s.n_out), static_cast<long long>(s.n_in), s.what,
                      static_cast<long long>(m), kernels::IsaName(isa), flop / tbh / 1e9, flop / tbh / 1e9 / pb,
                      flop / tbh / 1e9 / hb, flop / tbc / 1e9, flop / tbc / 1e9 / rb, flop / tph / 1e9,
                      flop / tph / 1e9 / pb, flop / tpc / 1e9, flop / tpc / 1e9 / rb, flop / tqh / 1e9,
                      flop / tqh / 1e9 / pq, flop / tqh / 1e9 / hq, flop / tqc / 1e9, flop / tqc / 1e9 / rq);
        add(line);
        batch.push_back({{"shape", s.what}, {"m", m}, {"isa", kernels::IsaName(isa)},
                         {"bf16_hot_gflops", flop / tbh / 1e9}, {"bf16_hot_of_peak", flop / tbh / 1e9 / pb},
                         {"bf16_hot_of_l2_ceiling", flop / tbh / 1e9 / hb}, {"int8_hot_of_l2_ceiling", flop / tqh / 1e9 / hq},
                         {"bf16_cold_gflops", flop / tbc / 1e9}, {"bf16_cold_of_ceiling", flop / tbc / 1e9 / rb},
                         {"bf16_packed_hot_gflops", flop / tph / 1e9}, {"bf16_packed_hot_of_peak", flop / tph / 1e9 / pb},
                         {"bf16_packed_cold_gflops", flop / tpc / 1e9}, {"bf16_packed_cold_of_ceiling", flop / tpc / 1e9 / rb},
                         {"int8_hot_gops", flop / tqh / 1e9}, {"int8_hot_of_peak", flop / tqh / 1e9 / pq},
                         {"int8_cold_gops", flop / tqc / 1e9}, {"int8_cold_of_ceiling", flop / tqc / 1e9 / rq}});
      }
    }
  }
  j["batch"] = batch;

  // ---- prefill ----
  std::snprintf(line, sizeof(line),
                "\n## Prefill m = 512, hot weights (load average %s): W8A8 vs BF16\n\n"
                "| shape | level | BF16 GFLOP/s | of peak | BF16 packed | of peak | INT8 GOP/s | of peak | INT8+quant GOP/s | INT8/BF16 | INT8+quant/BF16 |\n"
                "|---|---|---|---|---|---|---|---|---|---|---|\n",
                LoadAverage().c_str());
  add(line);
  nlohmann::json prefill = nlohmann::json::array();
  for (const Shape& s : kPrefillShapes) {
    const int64_t m = 512;
    const double flop = 2.0 * m * s.n_out * s.n_in;
    const kernels::PackedBf16Weights packed = kernels::PackedBf16Weights::Pack(
        kernels::WeightView{DType::kBF16, d.wb.data(), s.n_out, s.n_in, s.n_in}, &pool);
    for (Isa isa : isas) {
      const Ceilings& c = ceil[static_cast<int>(isa)];
      const int reps = quick ? 3 : 5;
      const double tb = Best([&] { bf16_call(isa, s, m, 0); }, reps, rounds);
      const double tp = Best([&] {
        kernels::internal::GemmWithIsa(isa, d.x.data(), m, s.n_in, packed.view(), d.y.data(), s.n_out, &pool);
      }, reps, rounds);
      const double tq = Best([&] { int8_call(isa, s, m, 0, false); }, reps, rounds);
      const double tqq = Best([&] { int8_call(isa, s, m, 0, true); }, reps, rounds);
      std::snprintf(line, sizeof(line), "| %lldx%lld %s | %s | %.0f | %.2f | %.0f | %.2f | %.0f | %.2f | %.0f | %.2fx | %.2fx |\n",
                    static_cast<long long>(s.n_out), static_cast<long long>(s.n_in), s.what, kernels::IsaName(isa),
                    flop / tb / 1e9, flop / tb / 1e9 / (2 * c.bf16), flop / tp / 1e9, flop / tp / 1e9 / (2 * c.bf16),
                    flop / tq / 1e9, flop / tq / 1e9 / (2 * c.int8),
                    flop / tqq / 1e9, tb / tq, tb / tqq);
      add(line);
      prefill.push_back({{"shape", s.what}, {"isa", kernels::IsaName(isa)}, {"bf16_gflops", flop / tb / 1e9},
                         {"bf16_packed_gflops", flop / tp / 1e9},
                         {"int8_gops", flop / tq / 1e9}, {"int8_quant_gops", flop / tqq / 1e9},
                         {"int8_over_bf16", tb / tq}, {"int8_quant_over_bf16", tb / tqq}});
    }
  }
  j["prefill"] = prefill;
  std::snprintf(line, sizeof(line), "\nLoad average at the end: %s\n", LoadAverage().c_str());
  add(line);
  j["load_average_end"] = LoadAverage();
  WriteResults("gemm_isa", j, md);
  return 0;
}

}  // namespace
}  // namespace pdserve::bench

int main(int argc, char** argv) { return pdserve::bench::Main(argc, argv); }
