// bench_prefix_cache [--model DIR] [--out DIR] [--prompt 2048] [--cached 1920] [--repeats 3]
//                    [--threads N] [--chunk 256] [--disk-tier DIR]
//
// Time to first token of one prompt with and without a cached prefix (engine/prefix_cache.h,
// docs/prefix-cache.md), on the `small` preset (made under models/small if absent), the engine
// stepped on this thread with its default block size (64) and the given prefill chunk:
//   * cold: a `prompt`-token prompt of random ids on an engine with the prefix cache off;
//   * warm: the same engine geometry with the cache on; a donor request of `cached` shared
//     tokens plus other tokens runs first (its blocks stay cached), then the timed request:
//     the shared tokens plus `prompt - cached` new ones. `cached` should be a multiple of the
//     block size and at least the chunk (the hit the scheduler may take).
//   * disk (with --disk-tier DIR): the cache on with its disk tier in DIR and a pool of one
//     prompt; after the donor, a KV import reservation as long as the pool (ReserveImport,
//     then Abort: nothing is computed) evicts every idle block, so the donor's blocks go to
//     disk; the timed request then reads the shared prefix back from the files.
// Each is timed from AddRequest to the first token, `repeats` times with fresh ids (the
// median is reported); the warm and disk first tokens must equal the cold engine's for the
// same prompt.
// Baselines measured in the same run: the fp32 FMA peak (the cold prefill's share of it) and
// the ratio cold / warm. The load average is recorded beside every figure.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>

#include <nlohmann/json.hpp>

#include "common/heap_policy.h"
#include "bench/engine/engine_figures.h"
#include "engine/engine.h"
#include "model/tools/make_model.h"

namespace pdserve {
namespace {

using Clock = std::chrono::steady_clock;

struct Timed {
  double seconds = 0;
  int32_t token = -1;
  int64_t cached = 0;
};

// AddRequest to first token of one greedy single-token request, stepped here.
Timed FirstToken(engine::Engine* e, const std::vector<int32_t>& prompt) {
  Timed t;
  engine::RequestOptions ro;
  ro.sampling.temperature = 0.0f;
  ro.sampling.max_tokens = 1;
  ro.on_event = [&t](const engine::TokenEvent& ev) {
    if (ev.token >= 0) t.token = ev.token;
    if (ev.finished) t.cached = ev.cached_prompt_tokens;
  };
  const auto t0 = Clock::now();
  PDSERVE_CHECK(e->AddRequest(prompt, ro).ok());
  while (t.token < 0 && !e->Idle()) e->Step();
  t.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  while (!e->Idle()) e->Step();
  return t;
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

int Run(int argc, char** argv) {
  std::string model_dir = std::string(PDSERVE_SOURCE_DIR) + "/models/small";
  std::string out_dir = std::string(PDSERVE_SOURCE_DIR) + "/bench/results";
  int64_t prompt_len = 2048, cached_len = 1920, repeats = 3, threads = 0, chunk = 256;
  std::string disk_dir;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--model") model_dir = v;
    else if (k == "--out") out_dir = v;
    else if (k == "--prompt") prompt_len = std::stoll(v);
    else if (k == "--cached") cached_len = std::stoll(v);
    else if (k == "--repeats") repeats = std::stoll(v);
    else if (k == "--threads") threads = std::stoll(v);
    else if (k == "--chunk") chunk = std::stoll(v);
    else if (k == "--disk-tier") disk_dir = v;
    else {
      std::fprintf(stderr, "unknown option %s\n", k.c_str());
      return 2;
    }
  }
  if (argc % 2 == 0) {
    std::fprintf(stderr, "every option wants a value\n");
    return 2;
  }
  if (cached_len >= prompt_len || repeats < 1) {
    std::fprintf(stderr, "--cached must be below --prompt, --repeats at least 1\n");
    return 2;
  }
  if (!std::filesystem::exists(model_dir + "/config.json")) {
    std::fprintf(stderr, "making the small preset in %s ...\n", model_dir.c_str());
    model::MakeModelOptions mo;
    mo.preset = "small";
    mo.out_dir = model_dir;
    if (Status s = model::MakeModel(mo); !s.ok()) {
      std::fprintf(stderr, "%s\n", s.ToString().c_str());
      return 1;
    }
  }
  ThreadPool pool(threads > 0 ? static_cast<int>(threads) : ThreadPool::Default().n_threads());
  const bench::FmaPeak peak = bench::MeasureFmaPeak(&pool);
  auto loaded = model::Model::Load(model_dir, &pool);
  if (!loaded.ok()) {
    std::fprintf(stderr, "%s\n", loaded.status().ToString().c_str());
    return 1;
  }
  const model::Model& m = **loaded;
  const int64_t V = m.config().vocab_size;

  engine::EngineOptions eo;
  eo.scheduler.prefill_chunk = chunk;
  eo.scheduler.max_step_tokens = std::max<int64_t>(eo.scheduler.max_step_tokens, chunk);
  const KvLayout layout = model::KvLayoutFor(m.config(), eo.block_tokens, eo.latent_format, eo.index_format);
  // Room for the donors and timed prompts of every repeat (the warm engine keeps them cached).
  const auto blocks = static_cast<int64_t>(layout.BlocksForTokens(static_cast<uint64_t>(prompt_len + 2))) * (2 * repeats + 2);
  eo.kv_cache_gib = static_cast<double>(blocks * static_cast<int64_t>(layout.BlockBytes())) / (1ull << 30) + 1e-6;
  engine::EngineOptions cold_options = eo;
  cold_options.prefix_cache = false;
  auto cold_engine = engine::Engine::Create(cold_options, &m);
  auto warm_engine = engine::Engine::Create(eo, &m);
  if (!cold_engine.ok() || !warm_engine.ok()) {
    std::fprintf(stderr, "%s\n", (cold_engine.ok() ? warm_engine.status() : cold_engine.status()).ToString().c_str());
    return 1;
  }
  engine::Engine& cold = **cold_engine;
  engine::Engine& warm = **warm_engine;
  std::unique_ptr<engine::Engine> disk;
  if (!disk_dir.empty()) {
    engine::EngineOptions d = eo;
    // One prompt (and its first token) fits, so the eviction below pushes out every idle block.
    const auto one = static_cast<int64_t>(layout.BlocksForTokens(static_cast<uint64_t>(prompt_len + 2)));
    d.kv_cache_gib = static_cast<double>(one * static_cast<int64_t>(layout.BlockBytes())) / (1ull << 30) + 1e-6;
    d.prefix_cache_disk_dir = disk_dir;
    d.prefix_cache_disk_bytes = 4 * one * static_cast<int64_t>(layout.BlockBytes() + 4096);
    auto created = engine::Engine::Create(d, &m);
    if (!created.ok()) {
      std::fprintf(stderr, "%s\n", created.status().ToString().c_str());
      return 1;
    }
    disk = std::move(created).value();
  }

  std::mt19937 rng(7);
  auto random_ids = [&](int64_t n) {
    std::vector<int32_t> v(static_cast<size_t>(n));
    for (auto& t : v) t = static_cast<int32_t>(rng() % V);
    return v;
  };
  FirstToken(&cold, random_ids(prompt_len));  // warm-up: page in the weights, spin the pool
  const std::string load_start = bench::LoadAverage();
  std::vector<double> cold_s, warm_s, disk_s;
  std::vector<std::string> loads;
  bool identical = true;
  int64_t hit = 0, disk_hit = 0;
  for (int64_t r = 0; r < repeats; ++r) {
    const std::vector<int32_t> shared = random_ids(cached_len);
    std::vector<int32_t> donor = shared, prompt = shared;
    for (int32_t t : random_ids(prompt_len - cached_len)) donor.push_back(t);
    for (int32_t t : random_ids(prompt_len - cached_len)) prompt.push_back(t);
    const Timed c = FirstToken(&cold, prompt);
    FirstToken(&warm, donor);
    const Timed w = FirstToken(&warm, prompt);
    identical = identical && c.token == w.token;
    hit = w.cached;
    cold_s.push_back(c.seconds);
    warm_s.push_back(w.seconds);
    if (disk) {
      FirstToken(disk.get(), donor);
      // Evict every idle block (to disk) without computing anything: reserve blocks for an
      // import as long as the pool allows, then give them back.
      auto reserved = disk->ReserveImport(random_ids(disk->max_sequence_length() - 1), {});
      PDSERVE_CHECK(reserved.ok(), reserved.status().ToString());
      PDSERVE_CHECK(disk->Abort(reserved->id).ok());
      while (!disk->Idle()) disk->Step();
      const int64_t restored_before = disk->Stats().prefix_tier_restored_tokens;
      const Timed d = FirstToken(disk.get(), prompt);
      const int64_t restored = disk->Stats().prefix_tier_restored_tokens - restored_before;
      identical = identical && c.token == d.token && restored == d.cached;
      disk_hit = d.cached;
      disk_s.push_back(d.seconds);
      std::fprintf(stderr, "repeat %lld: disk %.3f s (%lld prompt tokens cached, %lld of them read from disk), first token %s\n",
                   static_cast<long long>(r), d.seconds, static_cast<long long>(d.cached),
                   static_cast<long long>(restored), c.token == d.token ? "equal" : "DIFFERENT");
    }
    loads.push_back(bench::LoadAverage());
    std::fprintf(stderr, "repeat %lld: cold %.3f s, warm %.3f s (%lld prompt tokens cached), first token %s, load %s\n",
                 static_cast<long long>(r), c.seconds, w.seconds, static_cast<long long>(w.cached),
                 c.token == w.token ? "equal" : "DIFFERENT", loads.back().c_str());
  }
  const double cold_med = Median(cold_s), warm_med = Median(warm_s);
  const bench::ForwardFlops flops = bench::CountPrefillFlops(m.config(), prompt_len, chunk);
  const double cold_gflops = flops.total() / cold_med / 1e9;
  const std::string load_end = bench::LoadAverage();
  std::fprintf(stderr,
               "TTFT of %lld tokens: cold %.3f s (%.0f GFLOP/s = %.0f%% of the %.0f GFLOP/s FMA peak), warm with %lld "
               "cached %.3f s: %.2fx; first tokens %s; load %s -> %s\n",
               static_cast<long long>(prompt_len), cold_med, cold_gflops, 100 * cold_gflops / peak.best(), peak.best(),
               static_cast<long long>(hit), warm_med, cold_med / warm_med, identical ? "equal" : "DIFFERENT",
               load_start.c_str(), load_end.c_str());
  double disk_med = 0;
  if (disk) {
    disk_med = Median(disk_s);
    const engine::EngineStats ds = disk->Stats();
    std::fprintf(stderr,
                 "disk tier: TTFT with %lld tokens read from disk %.3f s: cold / disk %.2fx, disk / warm %.2fx; "
                 "%lld blocks stored (%.1f MiB), %lld tokens restored, %lld corrupt\n",
                 static_cast<long long>(disk_hit), disk_med, cold_med / disk_med, disk_med / warm_med,
                 static_cast<long long>(ds.prefix_tier_stored_blocks),
                 static_cast<double>(ds.prefix_tier_stored_bytes) / (1 << 20),
                 static_cast<long long>(ds.prefix_tier_restored_tokens),
                 static_cast<long long>(ds.prefix_tier_corrupt_files));
  }
  nlohmann::json j;
  j["model"] = model_dir;
  j["threads"] = pool.n_threads();
  j["prompt_tokens"] = prompt_len;
  j["cached_tokens"] = hit;
  j["chunk"] = chunk;
  j["block_tokens"] = eo.block_tokens;
  j["cold_seconds"] = cold_s;
  j["warm_seconds"] = warm_s;
  j["cold_median_seconds"] = cold_med;
  j["warm_median_seconds"] = warm_med;
  j["ratio_cold_over_warm"] = cold_med / warm_med;
  j["cold_gflops"] = cold_gflops;
  j["fma_peak_gflops"] = peak.best();
  if (disk) {
    j["disk_cached_tokens"] = disk_hit;
    j["disk_seconds"] = disk_s;
    j["disk_median_seconds"] = disk_med;
    j["ratio_cold_over_disk"] = cold_med / disk_med;
    j["ratio_disk_over_warm"] = disk_med / warm_med;
  }
  j["first_tokens_equal"] = identical;
  j["load_average"] = {{"start", load_start}, {"end", load_end}, {"repeats", loads}};
  std::filesystem::create_directories(out_dir);
  std::ofstream(out_dir + "/prefix_cache.json") << j.dump(2) << "\n";
  return identical && hit > 0 && (!disk || disk_hit > 0) ? 0 : 1;
}

}  // namespace
}  // namespace pdserve

int main(int argc, char** argv) {
  pdserve::ApplyHeapPolicy("bench_prefix_cache");
  return pdserve::Run(argc, argv);
}
