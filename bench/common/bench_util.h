// Helpers shared by the benchmark drivers in bench/: timing, the machine's measured read
// bandwidth (a STREAM-like sum over a buffer far larger than the caches), machine and commit
// identification, and writing results as JSON + a markdown summary under bench/results/.
#pragma once

#include <immintrin.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

namespace pdserve::bench {

using Clock = std::chrono::steady_clock;

inline double SecondsSince(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// Median of `reps` timed runs of fn (after one warm-up run).
inline double MedianSeconds(const std::function<void()>& fn, int reps) {
  fn();
  std::vector<double> t;
  for (int i = 0; i < reps; ++i) {
    const auto t0 = Clock::now();
    fn();
    t.push_back(SecondsSince(t0));
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

inline std::string CommandOutput(const char* cmd) {
  std::string out;
  if (FILE* p = popen(cmd, "r")) {
    char buf[256];
    while (fgets(buf, sizeof(buf), p)) out += buf;
    pclose(p);
  }
  while (!out.empty() && (out.back() == '\n' || out.back() == ' ')) out.pop_back();
  return out;
}

// The directory of the running executable (build/bin: the drivers start their sibling binaries).
inline std::string BinDir() {
  return std::filesystem::read_symlink("/proc/self/exe").parent_path().string();
}

inline std::string MachineName() {
  return CommandOutput("lscpu | sed -n 's/^Model name: *//p' | head -1");
}
inline std::string GitRevision() { return CommandOutput("git rev-parse --short HEAD 2>/dev/null"); }

// Read bandwidth in GB/s: `threads` threads each sum their slice of a 1 GiB buffer with AVX2
// loads; best of `rounds`. This is the roofline denominator for memory-bound steps.
inline double ReadBandwidthGBps(int threads, int rounds = 5) {
  const size_t n = (1ull << 30) / sizeof(float);
  std::vector<float> buf(n, 1.0f);
  double best = 0;
  for (int r = 0; r < rounds; ++r) {
    std::vector<std::thread> ts;
    std::vector<float> sums(static_cast<size_t>(threads));
    const auto t0 = Clock::now();
    for (int t = 0; t < threads; ++t)
      ts.emplace_back([&, t] {
        const size_t begin = n / threads * t, end = t + 1 == threads ? n : n / threads * (t + 1);
        __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps(), a2 = _mm256_setzero_ps(), a3 = _mm256_setzero_ps();
        for (size_t i = begin; i + 32 <= end; i += 32) {
          a0 = _mm256_add_ps(a0, _mm256_loadu_ps(&buf[i]));
          a1 = _mm256_add_ps(a1, _mm256_loadu_ps(&buf[i + 8]));
          a2 = _mm256_add_ps(a2, _mm256_loadu_ps(&buf[i + 16]));
          a3 = _mm256_add_ps(a3, _mm256_loadu_ps(&buf[i + 24]));
        }
        alignas(32) float l[8];
        _mm256_store_ps(l, _mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
        sums[static_cast<size_t>(t)] = l[0] + l[7];
      });
    for (auto& t : ts) t.join();
    const double s = SecondsSince(t0);
    if (sums[0] < 0) std::printf(" ");  // keep the sums observable
    best = std::max(best, static_cast<double>(n * sizeof(float)) / s / 1e9);
  }
  return best;
}

inline double WallSeconds() {
  return std::chrono::duration<double>(Clock::now().time_since_epoch()).count();
}

// ---- compute ceilings of one core (GMAC/s), the denominators for compute-bound kernels ----
// Each runs 12 independent accumulator chains (more than latency x pipes), no loads: the most
// this core retires of that instruction mix. `now` is the clock (wall or thread CPU time).

// fp32 FMA: 12 vfmadd231ps per iteration, 8 MACs each.
inline double FmaLoopGmacs(int64_t iters, double (*now)() = &WallSeconds) {
  __m256 a[12];
  for (int r = 0; r < 12; ++r) a[r] = _mm256_set1_ps(static_cast<float>(r));
  const __m256 b = _mm256_set1_ps(0.999999f), c = _mm256_set1_ps(1e-6f);
  const double t0 = now();
  for (int64_t it = 0; it < iters; ++it) {
#pragma GCC unroll 12
    for (int r = 0; r < 12; ++r) a[r] = _mm256_fmadd_ps(a[r], b, c);
  }
  const double sec = now() - t0;
  float sink = 0;
  for (int r = 0; r < 12; ++r) sink += _mm256_cvtss_f32(a[r]);
  asm volatile("" : : "x"(sink));
  return static_cast<double>(iters) * 12 * 8 / sec / 1e9;
}

// The exact int8 GEMM's arithmetic without VNNI: vpmaddwd (16 int16 MACs into 8 int32 pair
// sums) and the vpaddd that accumulates its result, 12 of each per iteration. Written in asm:
// with intrinsics the compiler would hoist the loop-invariant vpmaddwd out of the loop.
inline double Int16MaddAddLoopGmacs(int64_t iters, double (*now)() = &WallSeconds) {
#if defined(__x86_64__)
  const double t0 = now();
  for (int64_t it = 0; it < iters; ++it) {
    asm volatile(
        "vpmaddwd %%ymm15, %%ymm14, %%ymm0\n\tvpaddd %%ymm0, %%ymm6, %%ymm6\n\t"
        "vpmaddwd %%ymm15, %%ymm14, %%ymm1\n\tvpaddd %%ymm1, %%ymm7, %%ymm7\n\t"
        "vpmaddwd %%ymm15, %%ymm14, %%ymm2\n\tvpaddd %%ymm2, %%ymm8, %%ymm8\n\t"
        "vpmaddwd %%ymm15, %%ymm14, %%ymm3\n\tvpaddd %%ymm3, %%ymm9, %%ymm9\n\t"
        "vpmaddwd %%ymm15, %%ymm14, %%ymm4\n\tvpaddd %%ymm4, %%ymm10, %%ymm10\n\t"
        "vpmaddwd %%ymm15, %%ymm14, %%ymm5\n\tvpaddd %%ymm5, %%ymm11, %%ymm11\n\t"
        "vpmaddwd %%ymm15, %%ymm13, %%ymm0\n\tvpaddd %%ymm0, %%ymm6, %%ymm6\n\t"
        "vpmaddwd %%ymm15, %%ymm13, %%ymm1\n\tvpaddd %%ymm1, %%ymm7, %%ymm7\n\t"
        "vpmaddwd %%ymm15, %%ymm13, %%ymm2\n\tvpaddd %%ymm2, %%ymm8, %%ymm8\n\t"
        "vpmaddwd %%ymm15, %%ymm13, %%ymm3\n\tvpaddd %%ymm3, %%ymm9, %%ymm9\n\t"
        "vpmaddwd %%ymm15, %%ymm13, %%ymm4\n\tvpaddd %%ymm4, %%ymm10, %%ymm10\n\t"
        "vpmaddwd %%ymm15, %%ymm13, %%ymm5\n\tvpaddd %%ymm5, %%ymm11, %%ymm11\n\t"
        :
        :
        : "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9", "xmm10",
          "xmm11");
  }
  return static_cast<double>(iters) * 12 * 16 / (now() - t0) / 1e9;
#else
  (void)iters;
  (void)now;
  return 0;
#endif
}

// The vpmaddubsw route (u8 x s8 pairs into int16, vpmaddwd by ones to int32, vpaddd): 32 MACs
// per two multiplies. Exact only while a pair sum fits int16, i.e. with 7-bit operands; with
// `with_sign` each product first takes the activation's sign (vpsignb), the way to keep full
// int8 ranges exact. 6 chains of 4 products-of-32 per iteration.
template <bool with_sign>
inline double Int8MaddubsLoopGmacs(int64_t iters, double (*now)() = &WallSeconds) {
#if defined(__x86_64__)
  const double t0 = now();
  for (int64_t it = 0; it < iters; ++it) {
    if constexpr (with_sign) {
      asm volatile(
          "vpsignb %%ymm14, %%ymm15, %%ymm0\n\tvpsignb %%ymm13, %%ymm15, %%ymm1\n\t"
          "vpsignb %%ymm14, %%ymm12, %%ymm2\n\tvpsignb %%ymm13, %%ymm12, %%ymm3\n\t"
          "vpsignb %%ymm15, %%ymm12, %%ymm4\n\tvpsignb %%ymm15, %%ymm14, %%ymm5\n\t"
          "vpmaddubsw %%ymm0, %%ymm13, %%ymm0\n\tvpmaddubsw %%ymm1, %%ymm14, %%ymm1\n\t"
          "vpmaddubsw %%ymm2, %%ymm13, %%ymm2\n\tvpmaddubsw %%ymm3, %%ymm14, %%ymm3\n\t"
          "vpmaddubsw %%ymm4, %%ymm13, %%ymm4\n\tvpmaddubsw %%ymm5, %%ymm14, %%ymm5\n\t"
          "vpmaddwd %%ymm11, %%ymm0, %%ymm0\n\tvpmaddwd %%ymm11, %%ymm1, %%ymm1\n\t"
          "vpmaddwd %%ymm11, %%ymm2, %%ymm2\n\tvpmaddwd %%ymm11, %%ymm3, %%ymm3\n\t"
          "vpmaddwd %%ymm11, %%ymm4, %%ymm4\n\tvpmaddwd %%ymm11, %%ymm5, %%ymm5\n\t"
          "vpaddd %%ymm0, %%ymm6, %%ymm6\n\tvpaddd %%ymm1, %%ymm7, %%ymm7\n\t"
          "vpaddd %%ymm2, %%ymm8, %%ymm8\n\tvpaddd %%ymm3, %%ymm9, %%ymm9\n\t"
          "vpaddd %%ymm4, %%ymm10, %%ymm10\n\tvpaddd %%ymm5, %%ymm6, %%ymm6\n\t"
          :
          :
          : "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9", "xmm10");
    } else {
      asm volatile(
          "vpmaddubsw %%ymm15, %%ymm13, %%ymm0\n\tvpmaddubsw %%ymm15, %%ymm14, %%ymm1\n\t"
          "vpmaddubsw %%ymm14, %%ymm13, %%ymm2\n\tvpmaddubsw %%ymm12, %%ymm13, %%ymm3\n\t"
          "vpmaddubsw %%ymm12, %%ymm14, %%ymm4\n\tvpmaddubsw %%ymm12, %%ymm15, %%ymm5\n\t"
          "vpmaddwd %%ymm11, %%ymm0, %%ymm0\n\tvpmaddwd %%ymm11, %%ymm1, %%ymm1\n\t"
          "vpmaddwd %%ymm11, %%ymm2, %%ymm2\n\tvpmaddwd %%ymm11, %%ymm3, %%ymm3\n\t"
          "vpmaddwd %%ymm11, %%ymm4, %%ymm4\n\tvpmaddwd %%ymm11, %%ymm5, %%ymm5\n\t"
          "vpaddd %%ymm0, %%ymm6, %%ymm6\n\tvpaddd %%ymm1, %%ymm7, %%ymm7\n\t"
          "vpaddd %%ymm2, %%ymm8, %%ymm8\n\tvpaddd %%ymm3, %%ymm9, %%ymm9\n\t"
          "vpaddd %%ymm4, %%ymm10, %%ymm10\n\tvpaddd %%ymm5, %%ymm6, %%ymm6\n\t"
          :
          :
          : "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9", "xmm10");
    }
  }
  return static_cast<double>(iters) * 6 * 32 / (now() - t0) / 1e9;
#else
  (void)iters;
  (void)now;
  return 0;
#endif
}

// Runs fn(t) on n threads at once, returns the sum of their results.
inline double OnThreads(int n, const std::function<double(int)>& fn) {
  std::vector<double> r(static_cast<size_t>(n));
  std::vector<std::thread> th;
  for (int t = 1; t < n; ++t) th.emplace_back([&, t] { r[static_cast<size_t>(t)] = fn(t); });
  r[0] = fn(0);
  for (auto& t : th) t.join();
  double s = 0;
  for (double v : r) s += v;
  return s;
}

// Best over `rounds` of `loop` run on `threads` threads at once (GMAC/s summed over threads).
inline double PeakGmacs(double (*loop)(int64_t, double (*)()), int threads, int rounds,
                        int64_t iters = 20'000'000) {
  double best = 0;
  for (int i = 0; i < rounds; ++i)
    best = std::max(best, OnThreads(threads, [&](int) { return loop(iters, &WallSeconds); }));
  return best;
}

// Where results go: $PDSERVE_RESULTS_DIR when set, else <repository>/bench/results of the
// checkout whose build the binary belongs to (found by walking up from the binary), else
// ./bench-results. Never a bare ./results wherever the command happens to run.
inline std::string ResultsDir() {
  if (const char* env = std::getenv("PDSERVE_RESULTS_DIR"); env != nullptr && *env != '\0') return env;
  std::error_code ec;
  for (std::filesystem::path p = BinDir(); !p.empty() && p != p.root_path(); p = p.parent_path()) {
    if (std::filesystem::exists(p / "bench" / "common" / "bench_util.h", ec)) return (p / "bench" / "results").string();
  }
  return "bench-results";
}

// Writes <ResultsDir()>/<name>.json and <name>.md.
inline void WriteResults(const std::string& name, const nlohmann::json& j, const std::string& markdown) {
  const std::string dir = ResultsDir();
  std::filesystem::create_directories(dir);
  std::ofstream(dir + "/" + name + ".json") << j.dump(2) << "\n";
  std::ofstream(dir + "/" + name + ".md") << markdown;
  std::printf("%s\nwrote %s/%s.{json,md}\n", markdown.c_str(), dir.c_str(), name.c_str());
}

}  // namespace pdserve::bench
