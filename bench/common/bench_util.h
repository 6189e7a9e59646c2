// Helpers shared by the benchmark drivers in bench/: timing, the machine's measured read
// bandwidth (a STREAM-like sum over a buffer far larger than the caches), machine and commit
// identification, and writing results as JSON + a markdown summary under bench/results/.
#pragma once

#include <immintrin.h>

#include <algorithm>
#include <chrono>
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

// Writes bench/results/<name>.json and <name>.md (relative to the repository root when run
// from it, else to the current directory).
inline void WriteResults(const std::string& name, const nlohmann::json& j, const std::string& markdown) {
  const std::string dir = std::filesystem::exists("bench") ? "bench/results" : "results";
  std::filesystem::create_directories(dir);
  std::ofstream(dir + "/" + name + ".json") << j.dump(2) << "\n";
  std::ofstream(dir + "/" + name + ".md") << markdown;
  std::printf("%s\nwrote %s/%s.{json,md}\n", markdown.c_str(), dir.c_str(), name.c_str());
}

}  // namespace pdserve::bench
