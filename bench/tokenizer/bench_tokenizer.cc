// bench_tokenizer: single-thread encode throughput of pdserve's tokenizer against the JS
// reference (@lenml/tokenizers under node) on the same corpus, in the same run.
//
//   1. node tools/js/bench_encode.js make-corpus: a seeded mixed corpus (~10 MB of English,
//      code, CJK, numbers, whitespace, emoji, ...) split into 1-16 KB documents;
//   2. C++: load the tokenizer, then encode every document, R rounds. Round 1 starts with an
//      empty BPE cache ("cold"); later rounds reuse it, as a long-running server does;
//   3. JS: node tools/js/bench_encode.js encode: a 1 MB warm-up, then R timed rounds (its own
//      10,000-entry LRU cache stays warm between rounds);
//   4. both sides report the token count and an FNV-1a hash of all ids: they must agree.
// MB/s counts UTF-8 input bytes (1 MB = 10^6 bytes). Reported: best and median of the rounds.
//
// Usage: bench_tokenizer [--bytes N] [--seed S] [--rounds R] [--tokenizer DIR] [--out DIR]
//                        [--cache ENTRIES] [--skip-js]
// Writes DIR/tokenizer.json and DIR/tokenizer.md (DIR defaults to <source>/bench/results).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tokenizer/tokenizer.h"
#include "tokenizer/tokenizer_paths.h"

namespace pdserve::bench {
namespace {

using Clock = std::chrono::steady_clock;
using nlohmann::json;

double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

std::string ShellQuote(const std::string& s) {
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

// Runs a command and returns its stdout (exit status in *rc).
std::string RunCommand(const std::string& cmd, int* rc) {
  std::string out;
  FILE* f = popen(cmd.c_str(), "r");
  if (f == nullptr) {
    *rc = -1;
    return out;
  }
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), f)) > 0) out.append(buf, n);
  *rc = pclose(f);
  return out;
}

std::string CpuModel() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("model name", 0) == 0) return line.substr(line.find(':') + 2);
  }
  return "unknown";
}

uint64_t HashIds(uint64_t h, const std::vector<int32_t>& ids) {
  for (int32_t id : ids) {
    uint32_t v = static_cast<uint32_t>(id);
    for (int k = 0; k < 4; ++k) {
      h ^= v & 0xFF;
      h *= 0x100000001b3ULL;
      v >>= 8;
    }
  }
  return h;
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

std::string Arg(int argc, char** argv, const std::string& name, const std::string& fallback) {
  for (int i = 1; i + 1 < argc; ++i)
    if (argv[i] == name) return argv[i + 1];
  return fallback;
}

bool Flag(int argc, char** argv, const std::string& name) {
  for (int i = 1; i < argc; ++i)
    if (argv[i] == name) return true;
  return false;
}

int Main(int argc, char** argv) {
  const std::string source = PDSERVE_SOURCE_DIR;
  const std::string bytes = Arg(argc, argv, "--bytes", "10000000");
  const std::string seed = Arg(argc, argv, "--seed", "1");
  const int rounds = std::max(1, std::atoi(Arg(argc, argv, "--rounds", "3").c_str()));
  const std::string dir = Arg(argc, argv, "--tokenizer", tokenizer::DefaultTokenizerDir());
  const std::string out_dir = Arg(argc, argv, "--out", source + "/bench/results");
  const bool skip_js = Flag(argc, argv, "--skip-js");
  std::filesystem::create_directories(out_dir);
  const std::string js_tool = source + "/tools/js/bench_encode.js";
  const std::string corpus_path = out_dir + "/tokenizer_corpus.jsonl";

  // 1. Corpus.
  int rc = 0;
  std::fprintf(stderr, "bench_tokenizer: building a %s-byte corpus (seed %s)\n", bytes.c_str(), seed.c_str());
  RunCommand("node " + ShellQuote(js_tool) + " make-corpus " + ShellQuote(corpus_path) + " --bytes " + bytes +
                 " --seed " + seed,
             &rc);
  if (rc != 0) {
    std::fprintf(stderr, "bench_tokenizer: corpus generation failed (is node installed? run scripts/setup.sh)\n");
    return 1;
  }
  std::vector<std::string> docs;
  size_t total_bytes = 0;
  {
    std::ifstream in(corpus_path);
    std::string line;
    while (std::getline(in, line)) {
      if (line.empty()) continue;
      docs.push_back(json::parse(line).get<std::string>());
      total_bytes += docs.back().size();
    }
  }

  // 2. C++.
  const auto t0 = Clock::now();
  tokenizer::TokenizerOptions options;
  options.cache_capacity = std::strtoull(Arg(argc, argv, "--cache", std::to_string(options.cache_capacity)).c_str(), nullptr, 10);
  auto tok = tokenizer::Tokenizer::Load(dir, options);
  const double load_seconds = Seconds(t0, Clock::now());
  if (!tok.ok()) {
    std::fprintf(stderr, "bench_tokenizer: %s\n", tok.status().ToString().c_str());
    return 1;
  }
  std::vector<double> cpp_mbps;
  int64_t cpp_tokens = 0;
  uint64_t cpp_hash = 0xcbf29ce484222325ULL;
  std::vector<int32_t> ids;
  for (int r = 0; r < rounds; ++r) {
    const auto start = Clock::now();
    int64_t tokens = 0;
    uint64_t hash = 0xcbf29ce484222325ULL;
    for (const std::string& d : docs) {
      ids.clear();
      Status s = (*tok)->EncodeAppend(d, {}, &ids);
      if (!s.ok()) {
        std::fprintf(stderr, "bench_tokenizer: %s\n", s.ToString().c_str());
        return 1;
      }
      tokens += static_cast<int64_t>(ids.size());
      if (r == 0) hash = HashIds(hash, ids);
    }
    const double seconds = Seconds(start, Clock::now());
    cpp_mbps.push_back(total_bytes / 1e6 / seconds);
    if (r == 0) {
      cpp_tokens = tokens;
      cpp_hash = hash;
    }
    std::fprintf(stderr, "bench_tokenizer: C++ round %d: %.2f MB/s\n", r + 1, cpp_mbps.back());
  }
  char cpp_hash_hex[20];
  std::snprintf(cpp_hash_hex, sizeof(cpp_hash_hex), "%016llx", static_cast<unsigned long long>(cpp_hash));

  // 3. JS.
  json js = nullptr;
  if (!skip_js) {
    std::fprintf(stderr, "bench_tokenizer: running the JS reference (%d rounds)\n", rounds);
    const std::string out = RunCommand("node " + ShellQuote(js_tool) + " encode " + ShellQuote(corpus_path) +
                                           " --rounds " + std::to_string(rounds),
                                       &rc);
    if (rc != 0) {
      std::fprintf(stderr, "bench_tokenizer: the JS reference failed\n");
      return 1;
    }
    js = json::parse(out);
  }

  // 4. Report.
  const double cpp_best = *std::max_element(cpp_mbps.begin(), cpp_mbps.end());
  json report = {
      {"benchmark", "tokenizer encode, single thread"},
      {"cpu", CpuModel()},
      {"corpus", {{"bytes", total_bytes}, {"documents", docs.size()}, {"seed", seed}, {"path", corpus_path}}},
      {"cpp",
       {{"load_seconds", load_seconds},
        {"mb_per_second", cpp_mbps},
        {"cold_mb_per_second", cpp_mbps.front()},
        {"best_mb_per_second", cpp_best},
        {"median_mb_per_second", Median(cpp_mbps)},
        {"tokens", cpp_tokens},
        {"ids_fnv1a64", cpp_hash_hex}}},
  };
  bool ids_match = true;
  double ratio = 0;
  if (!js.is_null()) {
    const std::vector<double> js_mbps = js["mb_per_second"].get<std::vector<double>>();
    const double js_best = *std::max_element(js_mbps.begin(), js_mbps.end());
    ratio = cpp_best / js_best;
    ids_match = js["tokens"].get<int64_t>() == cpp_tokens && js["ids_fnv1a64"].get<std::string>() == cpp_hash_hex;
    js["best_mb_per_second"] = js_best;
    js["median_mb_per_second"] = Median(js_mbps);
    report["js"] = js;
    report["speedup_best"] = ratio;
    report["speedup_median"] = Median(cpp_mbps) / Median(js_mbps);
    report["ids_match"] = ids_match;
  }
  std::ofstream(out_dir + "/tokenizer.json") << report.dump(2) << "\n";

  char md[4096];
  int len = std::snprintf(
      md, sizeof(md),
      "# Tokenizer encode throughput (single thread)\n\n"
      "CPU: %s  \nCorpus: %.2f MB in %zu documents (tools/js/corpus.js buildMixedText, seed %s)  \n"
      "Rounds: %d (best / median; C++ round 1 starts with an empty BPE cache)\n\n"
      "| implementation | best MB/s | median MB/s | cold MB/s | load s | tokens |\n"
      "|---|---|---|---|---|---|\n"
      "| pdserve C++ | %.2f | %.2f | %.2f | %.2f | %lld |\n",
      CpuModel().c_str(), total_bytes / 1e6, docs.size(), seed.c_str(), rounds, cpp_best, Median(cpp_mbps),
      cpp_mbps.front(), load_seconds, static_cast<long long>(cpp_tokens));
  std::string markdown(md, static_cast<size_t>(len));
  if (!js.is_null()) {
    len = std::snprintf(md, sizeof(md),
                        "| %s | %.2f | %.2f | - | %.2f | %lld |\n\n"
                        "Speed-up (best): **%.1fx** (goal >= 5x). Ids identical: %s.\n",
                        js["engine"].get<std::string>().c_str(), js["best_mb_per_second"].get<double>(),
                        js["median_mb_per_second"].get<double>(), js["load_seconds"].get<double>(),
                        static_cast<long long>(js["tokens"].get<int64_t>()), ratio, ids_match ? "yes" : "NO");
    markdown.append(md, static_cast<size_t>(len));
  }
  std::ofstream(out_dir + "/tokenizer.md") << markdown;
  std::printf("%s", markdown.c_str());
  if (!ids_match) {
    std::fprintf(stderr, "bench_tokenizer: C++ and JS ids differ on the benchmark corpus\n");
    return 1;
  }
  return 0;
}

}  // namespace
}  // namespace pdserve::bench

int main(int argc, char** argv) { return pdserve::bench::Main(argc, argv); }
