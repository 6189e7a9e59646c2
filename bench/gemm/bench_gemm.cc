// bench_gemm: measures kernels/gemm.h against OpenBLAS and against this machine's limits.
//
//   * FMA peak: a tight loop of 12 independent vfmadd231ps chains, on 1 and on N threads;
//   * read bandwidth: a STREAM-like sum over a 512 MiB buffer, 1 and N threads;
//   * prefill shapes (m = 512, 2048): our F32 and BF16 GEMM, OpenBLAS cblas_sgemm (RowMajor,
//     x NoTrans, W Trans) on the same F32 data, all on N threads (OpenBLAS set with
//     openblas_set_num_threads);
//   * decode shapes (m = 1, 4) with the same weight shapes: GFLOP/s and GB/s of weight bytes,
//     plus OpenBLAS on the F32 ones;
//   Weights are rotated over 256 MiB per dtype so every call reads them from DRAM, as in a real
//   forward pass, where a layer's weights were evicted since their last use.
//   * the m crossover between our two paths (kGemmSmallMMax).
// Every figure is the best (and the median) of repeated timed calls, in several rounds that
// alternate our kernels and OpenBLAS: the 2-core VM is shared, so single runs are noisy.
//
// Usage: bench_gemm [--threads N] [--rounds R] [--quick] [--only prefill|decode|crossover]
//                   [--hot] [--cpu-time] [--quiet-budget S] [--out DIR]
// --hot: no weight rotation (small matrices then stay in L2/L3; for kernel tuning).
// --cpu-time: time calls by thread CPU time (with --threads 1; for tuning on a busy machine).
// --quiet-budget: seconds the run may spend waiting for a quiet machine (default 240).
// Writes DIR/gemm.json and DIR/gemm.md (DIR defaults to <source>/bench/results).
#include <cblas.h>
#include <immintrin.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <ctime>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "bench/common/bench_util.h"
#include "common/dtype.h"
#include "common/thread_pool.h"
#include "kernels/gemm.h"
#include "kernels/gemm_internal.h"

namespace pdserve::bench {
namespace {

using kernels::WeightView;

double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

std::string RunCommand(const char* cmd) {
  std::string out;
  if (FILE* f = popen(cmd, "r")) {
    char buf[512];
    while (fgets(buf, sizeof(buf), f)) out += buf;
    pclose(f);
  }
  while (!out.empty() && (out.back() == '\n' || out.back() == ' ')) out.pop_back();
  return out;
}

// 64-byte aligned buffer, filled with a cheap deterministic pattern in [-1, 1).
template <typename T>
struct Buffer {
  struct Free {
    void operator()(T* p) const { std::free(p); }
  };
  std::unique_ptr<T, Free> p;
  size_t n = 0;
  explicit Buffer(size_t count) : n(count) {
    p.reset(static_cast<T*>(std::aligned_alloc(64, (count * sizeof(T) + 63) & ~size_t{63})));
    uint32_t s = 12345;
    for (size_t i = 0; i < count; ++i) {
      s = s * 1664525u + 1013904223u;
      const float v = static_cast<float>(s >> 8) * (2.0f / 16777216.0f) - 1.0f;
      if constexpr (std::is_same_v<T, uint16_t>) {
        p.get()[i] = F32ToBf16Bits(v);
      } else {
        p.get()[i] = v;
      }
    }
  }
  T* get() const { return p.get(); }
};

struct Stat {
  double best = 0, median = 0;  // seconds per call
  int reps = 0;
};

// Times fn(rep) until min_seconds have passed (at least min_reps calls) after one warm-up call.
// With g_cpu_time, a call's time is the calling thread's CPU time (only meaningful on 1 thread):
// immune to being descheduled by other jobs on the shared VM, for tuning single-core kernels.
bool g_cpu_time = false;

double ThreadCpuSeconds() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + ts.tv_nsec * 1e-9;
}

Stat Measure(const std::function<void(int)>& fn, double min_seconds, int min_reps = 3) {
  fn(0);
  std::vector<double> t;
  const auto start = Clock::now();
  for (int rep = 1;; ++rep) {
    const auto a = Clock::now();
    const double ca = g_cpu_time ? ThreadCpuSeconds() : 0;
    fn(rep);
    const auto b = Clock::now();
    t.push_back(g_cpu_time ? ThreadCpuSeconds() - ca : Seconds(a, b));
    if (static_cast<int>(t.size()) >= min_reps && Seconds(start, b) >= min_seconds) break;
    if (t.size() >= 100000) break;
  }
  std::sort(t.begin(), t.end());
  return Stat{t.front(), t[t.size() / 2], static_cast<int>(t.size())};
}

void Merge(Stat& acc, const Stat& s) {  // best over rounds; median of the best round's medians
  if (acc.reps == 0 || s.best < acc.best) acc.best = s.best;
  if (acc.reps == 0 || s.median < acc.median) acc.median = s.median;
  acc.reps += s.reps;
}

// ---- machine limits -----------------------------------------------------------------------------

// GFLOP/s of bench_util's FMA loop on one thread, on this driver's clock.
double FmaLoopGflops(int64_t iters) {
  return 2 * FmaLoopGmacs(iters, g_cpu_time ? &ThreadCpuSeconds : &WallSeconds);
}

double FmaPeak(int threads, int rounds) {
  double best = 0;
  for (int i = 0; i < rounds + 2; ++i) {
    best = std::max(best, OnThreads(threads, [](int) { return FmaLoopGflops(50'000'000); }));
  }
  return best;
}

// GB/s of summing n floats at p, read as `streams` equal sub-ranges walked in lockstep (several
// streams keep more prefetches in flight, as a GEMV over several weight rows does), 8
// independent vector adds per 256 bytes.
template <int kStreams>
double ReadGbps(const float* p, size_t n) {
  __m256 s[8];
  for (auto& v : s) v = _mm256_setzero_ps();
  const size_t per = n / kStreams / 64 * 64;
  const auto t0 = Clock::now();
  const double c0 = g_cpu_time ? ThreadCpuSeconds() : 0;
  for (size_t i = 0; i < per; i += 64 / kStreams) {
#pragma GCC unroll 8
    for (int r = 0; r < 8; ++r) {
      const int st = r % kStreams;
      s[r] = _mm256_add_ps(s[r], _mm256_load_ps(p + st * per + i + 8 * (r / kStreams)));
    }
  }
  const double sec = g_cpu_time ? ThreadCpuSeconds() - c0 : Seconds(t0, Clock::now());
  float sink = 0;
  for (auto& v : s) sink += _mm256_cvtss_f32(v);
  asm volatile("" : : "x"(sink));
  return static_cast<double>(per) * kStreams * 4 / sec / 1e9;
}

// Best over rounds and over 1, 4 and 8 streams per thread.
double ReadBandwidth(const Buffer<float>& buf, int threads, int rounds) {
  double best = 0;
  const size_t per = buf.n / threads / 64 * 64;
  for (int i = 0; i < rounds + 1; ++i) {
    for (auto fn : {&ReadGbps<1>, &ReadGbps<4>, &ReadGbps<8>}) {
      const double g = OnThreads(threads, [&](int t) { return fn(buf.get() + per * t, per); });
      best = std::max(best, g);
    }
  }
  return best;
}

// ---- GEMM shapes --------------------------------------------------------------------------------

struct WeightShape {
  int64_t n_out, n_in;
};
constexpr std::array<WeightShape, 4> kWeightShapes = {
    {{1024, 1024}, {2048, 1024}, {1024, 4096}, {576, 1024}}};

// Weights for one (shape, dtype): `copies` contiguous matrices in one buffer; call r uses copy
// r % copies, so with copies > 1 the weight bytes come from DRAM.
struct Weights {
  DType dtype;
  WeightShape shape;
  int64_t copies;
  const void* base;
  WeightView View(int rep) const {
    const int64_t c = rep % copies;
    const size_t elem = dtype == DType::kBF16 ? 2 : 4;
    return WeightView{dtype,
                      static_cast<const char*>(base) + c * shape.n_out * shape.n_in * elem,
                      shape.n_out, shape.n_in, shape.n_in};
  }
};

void OpenBlasGemm(const float* x, int64_t m, const WeightView& w, float* y) {
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<blasint>(m),
              static_cast<blasint>(w.n_out), static_cast<blasint>(w.n_in), 1.0f, x,
              static_cast<blasint>(w.n_in), static_cast<const float*>(w.data),
              static_cast<blasint>(w.n_in), 0.0f, y, static_cast<blasint>(w.n_out));
}

// OpenBLAS worker threads keep spinning for a while after a call; on 2 cores that would steal
// our time, so switching libraries waits them out.
void Settle() { std::this_thread::sleep_for(std::chrono::milliseconds(500)); }

// The VM's 2 cores are shared with other jobs (builds, other benchmarks), which halve a 2-thread
// figure while they run. Before each measurement, a ~12 ms FMA probe on all threads must reach 90%
// of the best probe seen, else we sleep and retry, for at most --quiet-budget seconds per run.
struct QuietGate {
  int threads;
  double budget_seconds;
  double best_probe = 0;     // reference: the seed or the best probe seen
  double best_measured = 0;  // best probe seen
  double waited = 0;
  int contended = 0;  // measurements taken without a quiet probe (budget exhausted)
  bool Wait() {
    if (g_cpu_time) return true;  // CPU time does not count time lost to other jobs
    for (;;) {
      const double g = OnThreads(threads, [](int) { return FmaLoopGflops(8'000'000); });
      best_probe = std::max(best_probe, g);
      best_measured = std::max(best_measured, g);
      if (g >= 0.9 * best_probe) return true;
      if (waited >= budget_seconds) {
        ++contended;
        return false;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(500));
      waited += 0.5;
    }
  }
};

struct Row {
  std::string kind, dtype;
  int64_t m, n_out, n_in;
  Stat ours, blas;  // blas.reps == 0: not measured
};

double Gflops(const Row& r, double sec) { return 2.0 * r.m * r.n_out * r.n_in / sec / 1e9; }
double WeightGbps(const Row& r, double sec) {
  return static_cast<double>(r.n_out) * r.n_in * (r.dtype == "BF16" ? 2 : 4) / sec / 1e9;
}

int Main(int argc, char** argv) {
  int threads = 2, rounds = 3;
  bool quick = false;
  std::string only;  // "", "prefill", "decode" or "crossover": run only that section
  bool hot = false;  // one copy of each weight matrix (cache-resident when small enough)
  double quiet_budget = 240;  // seconds the whole run may wait for a quiet machine
  std::string out_dir = std::string(PDSERVE_SOURCE_DIR) + "/bench/results";
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--threads" && i + 1 < argc) threads = std::atoi(argv[++i]);
    else if (a == "--rounds" && i + 1 < argc) rounds = std::atoi(argv[++i]);
    else if (a == "--quick") quick = true;
    else if (a == "--out" && i + 1 < argc) out_dir = argv[++i];
    else if (a == "--only" && i + 1 < argc) only = argv[++i];
    else if (a == "--hot") hot = true;
    else if (a == "--cpu-time") g_cpu_time = true;
    else if (a == "--quiet-budget" && i + 1 < argc) quiet_budget = std::atof(argv[++i]);
    else {
      std::fprintf(stderr, "usage: bench_gemm [--threads N] [--rounds R] [--quick] [--only prefill|decode|crossover] [--hot] [--cpu-time] [--quiet-budget S] [--out DIR]\n");
      return 2;
    }
  }
  if (quick) rounds = 1;
  if (g_cpu_time && threads != 1) {
    std::fprintf(stderr, "--cpu-time needs --threads 1\n");
    return 2;
  }
  const double min_sec = quick ? 0.1 : 0.25;
  openblas_set_num_threads(threads);
  ThreadPool pool(threads);

  nlohmann::json j;
  const char* coretype = std::getenv("OPENBLAS_CORETYPE");
  j["machine"] = {
      {"cpu", RunCommand("lscpu | sed -n 's/^Model name: *//p' | head -1")},
      {"cpu_family_model", RunCommand("lscpu | sed -n -e 's/^CPU family: *//p' -e 's/^Model: *//p' | paste -sd/")},
      {"online_cpus", std::thread::hardware_concurrency()},
      {"git", RunCommand("git -C " PDSERVE_SOURCE_DIR " rev-parse --short HEAD")},
      {"git_dirty", !RunCommand("git -C " PDSERVE_SOURCE_DIR " status --porcelain -- kernels/gemm* bench/gemm").empty()},
      {"threads", threads},
      {"openblas_threads", threads},
      {"openblas_coretype_env", coretype ? coretype : "(unset)"},
      {"openblas_corename", openblas_get_corename()},
      {"openblas_config", openblas_get_config()},
      {"rounds", rounds},
      {"weights_hot", hot},
      {"quiet_budget_s", quiet_budget},
      {"cpu_time", g_cpu_time},
      {"small_m_max", kernels::kGemmSmallMMax},
  };
  std::fprintf(stderr, "cpu %s, %d threads, OpenBLAS core %s (OPENBLAS_CORETYPE=%s)\n",
               j["machine"]["cpu"].get<std::string>().c_str(), threads, openblas_get_corename(),
               coretype ? coretype : "unset");

  // Machine limits.
  const double peak1 = FmaPeak(1, rounds);
  double peakn = FmaPeak(threads, rounds);
  Buffer<float> stream_buf(size_t{128} << 20);  // 512 MiB
  const double bw1 = ReadBandwidth(stream_buf, 1, rounds);
  double bwn = ReadBandwidth(stream_buf, threads, rounds);
  j["fma_peak_gflops"] = {{"1", peak1}, {std::to_string(threads), peakn}};
  j["read_bw_gbps"] = {{"1", bw1}, {std::to_string(threads), bwn}};
  std::fprintf(stderr, "FMA peak %.1f / %.1f GFLOP/s (1/%d thr), read bw %.1f / %.1f GB/s\n",
               peak1, peakn, threads, bw1, bwn);

  // Data: x big enough for m = 2048 x 4096; hot weights (one copy) and cold ones (rotated).
  const int64_t max_m = 2048, max_in = 4096, max_out = 2048;  // crossover: 96 x 18432 fits
  Buffer<float> x(max_m * max_in), y(max_m * max_out);
  const size_t cold_bytes = size_t{256} << 20;
  Buffer<float> cold_f32(cold_bytes / 4);
  Buffer<uint16_t> cold_bf16(cold_bytes / 2);
  std::vector<Row> rows;
  const std::vector<int64_t> prefill_m = quick ? std::vector<int64_t>{512}
                                               : std::vector<int64_t>{512, 2048};
  for (int64_t m : prefill_m) {
    if (!only.empty() && only != "prefill") break;
    for (const WeightShape& s : kWeightShapes) {
      for (const char* dt : {"F32", "BF16"}) rows.push_back({"prefill", dt, m, s.n_out, s.n_in, {}, {}});
    }
  }
  for (int64_t m : {1, 4}) {
    if (!only.empty() && only != "decode") break;
    for (const WeightShape& s : kWeightShapes) {
      for (const char* dt : {"F32", "BF16"}) rows.push_back({"decode", dt, m, s.n_out, s.n_in, {}, {}});
    }
  }
  auto weights_for = [&](const Row& r) {
    const bool bf16 = r.dtype == "BF16";
    const int64_t bytes = r.n_out * r.n_in * (bf16 ? 2 : 4);
    const int64_t copies = hot ? 1 : static_cast<int64_t>(cold_bytes) / bytes;
    return Weights{bf16 ? DType::kBF16 : DType::kF32, {r.n_out, r.n_in}, copies,
                   bf16 ? static_cast<const void*>(cold_bf16.get())
                        : static_cast<const void*>(cold_f32.get())};
  };
  // The start-up peak may itself have been measured on a busy machine; N threads should reach
  // about N times the 1-thread peak.
  QuietGate gate{threads, quiet_budget, std::max(peakn, 0.95 * threads * peak1)};
  // Ours and OpenBLAS measured back to back per row, in alternating order, so both see the
  // same machine; Settle() after OpenBLAS lets its spinning workers go to sleep.
  for (int round = 0; round < rounds; ++round) {
    for (Row& r : rows) {
      const Weights w = weights_for(r);
      auto run_ours = [&] {
        gate.Wait();
        Merge(r.ours, Measure([&](int rep) {
                kernels::Gemm(x.get(), r.m, r.n_in, w.View(rep), y.get(), r.n_out, &pool);
              }, min_sec));
      };
      auto run_blas = [&] {
        if (r.dtype != "F32") return;
        gate.Wait();
        Merge(r.blas, Measure([&](int rep) { OpenBlasGemm(x.get(), r.m, w.View(rep), y.get()); },
                              min_sec));
        Settle();
      };
      if (round % 2 == 0) {
        run_ours();
        run_blas();
      } else {
        run_blas();
        run_ours();
      }
    }
    std::fprintf(stderr, "round %d/%d done\n", round + 1, rounds);
  }

  // Crossover between the two paths on MoE-expert / MLP-like weights, rotated so they come from
  // DRAM as in a real forward pass.
  nlohmann::json crossover = nlohmann::json::array();
  for (const WeightShape& s : {WeightShape{2048, 1024}, WeightShape{2048, 7168}, WeightShape{1024, 18432}}) {
    for (const char* dt : {"F32", "BF16"}) {
      if (!only.empty() && only != "crossover") break;
      for (int64_t m : {1, 4, 8, 12, 16, 24, 32, 48, 64, 96, 128}) {
        Row r{"crossover", dt, m, s.n_out, s.n_in, {}, {}};
        const Weights w = weights_for(r);
        Stat small, tiled;
        for (int round = 0; round < rounds; ++round) {
          gate.Wait();
          Merge(small, Measure([&](int rep) {
                  kernels::internal::GemmWithIsa(kernels::Isa::kAvx2, x.get(), m, r.n_in, w.View(rep),
                                                 y.get(), r.n_out, &pool);
                }, min_sec / 2));
          gate.Wait();
          Merge(tiled, Measure([&](int rep) {
                  kernels::internal::GemmWithIsa(kernels::DetectedIsa(), x.get(), m, r.n_in,
                                                 w.View(rep), y.get(), r.n_out, &pool);
                }, min_sec / 2));
        }
        crossover.push_back({{"dtype", dt}, {"m", m}, {"n_out", r.n_out}, {"n_in", r.n_in},
                             {"small_m_gflops", Gflops(r, small.best)},
                             {"tiled_gflops", Gflops(r, tiled.best)}});
      }
    }
  }
  j["crossover"] = crossover;
  // The gate's probes may have seen a quieter machine than the start-up peak measurement (its
  // seed, 0.95 x threads x the 1-thread peak, is not a measurement: only count real probes).
  peakn = std::max(peakn, gate.best_measured);
  gate.Wait();  // and the bandwidth probe again, on a quiet machine
  bwn = std::max(bwn, ReadBandwidth(stream_buf, threads, rounds));
  j["read_bw_gbps"][std::to_string(threads)] = bwn;
  j["fma_peak_gflops"][std::to_string(threads)] = peakn;
  j["quiet_gate"] = {{"waited_s", gate.waited}, {"contended_measurements", gate.contended},
                     {"best_probe_gflops", gate.best_measured}};

  // Report.
  nlohmann::json results = nlohmann::json::array();
  for (const Row& r : rows) {
    nlohmann::json e = {{"kind", r.kind}, {"dtype", r.dtype}, {"m", r.m}, {"n_out", r.n_out},
                        {"n_in", r.n_in},
                        {"ours_best_s", r.ours.best}, {"ours_median_s", r.ours.median},
                        {"ours_gflops", Gflops(r, r.ours.best)},
                        {"ours_gflops_median", Gflops(r, r.ours.median)},
                        {"ours_vs_fma_peak", Gflops(r, r.ours.best) / peakn}};
    if (r.blas.reps) {
      e["openblas_best_s"] = r.blas.best;
      e["openblas_gflops"] = Gflops(r, r.blas.best);
      e["openblas_gflops_median"] = Gflops(r, r.blas.median);
      e["ours_vs_openblas"] = r.blas.best / r.ours.best;
    }
    if (r.kind == "decode") {
      e["weights_cold"] = true;
      e["ours_weight_gbps"] = WeightGbps(r, r.ours.best);
      e["ours_vs_read_bw"] = WeightGbps(r, r.ours.best) / bwn;
      if (r.blas.reps) e["openblas_weight_gbps"] = WeightGbps(r, r.blas.best);
    }
    results.push_back(e);
  }
  j["results"] = results;

  std::filesystem::create_directories(out_dir);
  std::ofstream(out_dir + "/gemm.json") << j.dump(2) << "\n";

  std::string md;
  char line[512];
  auto add = [&](const char* fmt, auto... args) {
    std::snprintf(line, sizeof(line), fmt, args...);
    md += line;
  };
  add("# bench_gemm\n\n");
  add("- machine: %s (family/model %s), %u online CPUs\n",
      j["machine"]["cpu"].get<std::string>().c_str(),
      j["machine"]["cpu_family_model"].get<std::string>().c_str(),
      std::thread::hardware_concurrency());
  add("- git %s%s; threads: ours %d, OpenBLAS %d (openblas_set_num_threads), OpenBLAS core %s, "
      "OPENBLAS_CORETYPE=%s\n",
      j["machine"]["git"].get<std::string>().c_str(),
      j["machine"]["git_dirty"].get<bool>() ? " (+uncommitted gemm changes)" : "", threads,
      threads, openblas_get_corename(), coretype ? coretype : "(unset)");
  add("- FMA peak (12 vfmadd231ps chains): %.1f GFLOP/s on 1 thread, %.1f on %d\n", peak1, peakn,
      threads);
  add("- read bandwidth (512 MiB sum): %.1f GB/s on 1 thread, %.1f on %d\n", bw1, bwn, threads);
  add("- times: best of %d rounds x >= %.2f s of calls (median in parentheses); shared VM, noisy:\n"
      "  each measurement waited for a quiet machine (FMA probe >= 90%% of best): %.0f s waited, "
      "%d measurements taken contended\n\n",
      rounds, min_sec, gate.waited, gate.contended);
  add("## Prefill (weights rotated over 256 MiB: read from DRAM), %d threads\n\n", threads);
  add("| dtype | m | n_out | n_in | ours GFLOP/s | OpenBLAS GFLOP/s | ours/OpenBLAS | ours/peak |\n");
  add("|---|---|---|---|---|---|---|---|\n");
  for (const Row& r : rows) {
    if (r.kind != "prefill") continue;
    add("| %s | %lld | %lld | %lld | %.1f (%.1f) |", r.dtype.c_str(), (long long)r.m,
        (long long)r.n_out, (long long)r.n_in, Gflops(r, r.ours.best), Gflops(r, r.ours.median));
    if (r.blas.reps) {
      add(" %.1f (%.1f) | %.2f |", Gflops(r, r.blas.best), Gflops(r, r.blas.median),
          r.blas.best / r.ours.best);
    } else {
      add(" - | - |");
    }
    add(" %.2f |\n", Gflops(r, r.ours.best) / peakn);
  }
  add("\n## Decode (weights rotated over 256 MiB: read from DRAM), %d threads\n\n", threads);
  add("| dtype | m | n_out | n_in | ours GFLOP/s | ours weight GB/s | ours/read bw | OpenBLAS GB/s |\n");
  add("|---|---|---|---|---|---|---|---|\n");
  for (const Row& r : rows) {
    if (r.kind != "decode") continue;
    add("| %s | %lld | %lld | %lld | %.2f | %.1f (%.1f) | %.2f |", r.dtype.c_str(), (long long)r.m,
        (long long)r.n_out, (long long)r.n_in, Gflops(r, r.ours.best), WeightGbps(r, r.ours.best),
        WeightGbps(r, r.ours.median), WeightGbps(r, r.ours.best) / bwn);
    if (r.blas.reps) {
      add(" %.1f |\n", WeightGbps(r, r.blas.best));
    } else {
      add(" - |\n");
    }
  }
  add("\n## Path crossover (weights from DRAM): GFLOP/s of the small-m path vs the tiled path\n\n");
  add("| dtype | n_out | n_in | m | small-m | tiled |\n|---|---|---|---|---|---|\n");
  for (const auto& c : crossover) {
    add("| %s | %lld | %lld | %lld | %.1f | %.1f |\n", c["dtype"].get<std::string>().c_str(),
        (long long)c["n_out"].get<int64_t>(), (long long)c["n_in"].get<int64_t>(),
        (long long)c["m"].get<int64_t>(), c["small_m_gflops"].get<double>(),
        c["tiled_gflops"].get<double>());
  }
  std::ofstream(out_dir + "/gemm.md") << md;
  std::fputs(md.c_str(), stdout);
  return 0;
}

}  // namespace
}  // namespace pdserve::bench

int main(int argc, char** argv) { return pdserve::bench::Main(argc, argv); }
