// bench_engine [--model DIR] [--out DIR] [--batches 1,4,16,64] [--contexts 1024,8192]
//              [--steps N] [--warmup N] [--threads N] [--kv-format fp8|bf16|int8] [--profile]
//              [--prefill 2048,8192,32768] [--chunk 512] [--copies 64] [--copy-tokens 32]
//
// Decode throughput of the Engine on the `small` preset (made under models/small if absent):
//   * one 1024-token prompt is prefilled once (its KV held, as a prefill worker would);
//   * for each context C and batch b, b requests of C prompt tokens are imported the way the
//     decode service imports KV (ReserveImport, block copy, CommitImport). Contexts above 1024
//     tile the prefilled blocks (the prompt ids are the 1024-token prompt repeated), so the
//     KV is synthetic but every byte and every top-k choice costs what a real one would;
//   * `steps` decode steps are timed (after `warmup`); every request decodes in every step.
// Roofline: bytes a step must read (every dense weight once: attention, indexer, dense and
// shared MLPs, router, lm_head; the routed experts the step actually ran; the KV the indexer
// scored and attention gathered) over the read bandwidth of a STREAM-like sum measured here.
// Compute: the step's FLOPs (engine_figures.h: linear + attention + indexer at the rows'
// context) per second, against the fp32 FMA peak measured here: the ceiling that matters once
// a batch reuses each weight many times.
// Ceiling: the lower of the roofline and the step's FLOPs at the FMA peak; each batch ratio
// also states the share of the FMA peak the batched row would need to meet its goal.
// Overhead: the engine's scheduler + sampling + event time as a share of step time.
// Ratios: decode tokens/s at batch 64 over batch 1 (context 1K) and batch 16 over batch 1
// (context 8K), from the same run.
// Prefill: one prompt of each --prefill length (random tokens) in chunks of --chunk, timed from
// AddRequest to its first token; its FLOPs (linear + attention + indexer, engine_figures.h)
// over the time, against the fp32 FMA peak of the same threads measured in the same run.
// Copies: `pdserve batch-generate`'s case: --copies copies of one 64-token prompt generating
// --copy-tokens tokens each, against one copy alone: tokens/s ratio, and every copy's tokens
// must equal the lone copy's.
// --profile prints (and stores) the share of step time per op for every row.
// The load average is recorded beside every figure.
#include <immintrin.h>

#include <charconv>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <random>
#include <sstream>

#include <nlohmann/json.hpp>

#include "common/heap_policy.h"
#include "engine/engine.h"
#include "kernels/isa.h"
#include "bench/engine/engine_figures.h"
#include "model/tools/make_model.h"
#include "model/profile_ops.h"

namespace pdserve {
namespace {

using Clock = std::chrono::steady_clock;
double Since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// A whole number >= min, or nullopt (the caller names the option).
std::optional<int64_t> ParseCount(const std::string& s, int64_t min) {
  int64_t v = 0;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || end != s.data() + s.size() || v < min) return std::nullopt;
  return v;
}

// "1,4,16": whole numbers >= 1, or nullopt.
std::optional<std::vector<int64_t>> ParseList(const std::string& s) {
  std::vector<int64_t> out;
  std::stringstream ss(s);
  std::string part;
  while (std::getline(ss, part, ',')) {
    const auto v = ParseCount(part, 1);
    if (!v) return std::nullopt;
    out.push_back(*v);
  }
  if (out.empty()) return std::nullopt;
  return out;
}

// Read bandwidth (GB/s): the best of `rounds` sums over a 1 GiB buffer on every pool thread.
double ReadBandwidth(ThreadPool* pool, int rounds) {
  const int64_t n = (int64_t{1} << 30) / 4;
  float* buf = static_cast<float*>(std::aligned_alloc(64, static_cast<size_t>(n) * 4));
  pool->ParallelFor(n, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) buf[i] = static_cast<float>(i & 7);
  }, 1 << 20);
  double best = 0.0;
  volatile float sink = 0.0f;
  for (int r = 0; r < rounds; ++r) {
    const auto t0 = Clock::now();
    std::vector<float> partial(64, 0.0f);
    pool->ParallelFor(64, [&](int64_t cb, int64_t ce) {
      for (int64_t c = cb; c < ce; ++c) {
        __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps(), a2 = _mm256_setzero_ps(), a3 = _mm256_setzero_ps();
        const float* p = buf + c * (n / 64);
        for (int64_t i = 0; i < n / 64; i += 32) {
          a0 = _mm256_add_ps(a0, _mm256_load_ps(p + i));
          a1 = _mm256_add_ps(a1, _mm256_load_ps(p + i + 8));
          a2 = _mm256_add_ps(a2, _mm256_load_ps(p + i + 16));
          a3 = _mm256_add_ps(a3, _mm256_load_ps(p + i + 24));
        }
        alignas(32) float l[8];
        _mm256_store_ps(l, _mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
        partial[static_cast<size_t>(c)] = l[0] + l[7];
      }
    });
    const double s = Since(t0);
    for (float v : partial) sink = sink + v;
    best = std::max(best, static_cast<double>(n) * 4 / s / 1e9);
  }
  std::free(buf);
  return best;
}

// Bytes a step reads for one weight: BF16/F32 values, or W8A8 int8 codes plus a scale per row.
int64_t Bytes(const model::Linear& w) {
  if (w.is_int8()) return w.int8.n_out * w.int8.n_in + w.int8.n_out * static_cast<int64_t>(sizeof(float));
  return w.view.n_out * w.view.n_in * static_cast<int64_t>(DTypeSize(w.view.dtype));
}
int64_t Bytes(const model::MlpWeights& m) { return Bytes(m.gate) + Bytes(m.up) + Bytes(m.down); }

struct Row {
  int64_t context, batch, steps;
  double seconds, tokens_per_s, step_ms, bytes_per_step, roofline_tokens_per_s, ratio, overhead_share;
  double experts_per_layer;
  double gflops = 0, peak_share = 0;  // CountDecodeStepFlops at the step's context, per second; of the FMA peak
  // The step's FLOPs at the FMA peak: tokens/s if compute ran at the peak; the ceiling is the
  // lower of that and the read roofline.
  double flop_bound_tokens_per_s = 0, ceiling_tokens_per_s = 0;
  nlohmann::json profile = nlohmann::json::object();  // op -> share of decode step time
  std::string load;
};

// What a batch ratio goal asks of the batched row: `goal` x batch 1's tokens/s at the batched
// row's FLOPs per token is this share of the FMA peak (and the ceiling's ratio, for scale).
struct RatioNeed {
  double needed_peak_share = 0, ceiling_ratio = 0;
};

struct PrefillRow {
  int64_t tokens = 0;
  double seconds = 0, tokens_per_s = 0;
  bench::ForwardFlops flops;
  double gflops = 0, peak_share = 0;
  nlohmann::json profile = nlohmann::json::object();
  std::string load;
};

nlohmann::json ProfileShares(const OpProfile& p, int phase) {
  nlohmann::json j = nlohmann::json::object();
  const double total = p.total_seconds(phase);
  for (int op = 0; op < p.n_ops(); ++op) j[p.op_name(op)] = total > 0 ? p.seconds(phase, op) / total : 0.0;
  return j;
}

int Run(int argc, char** argv) {
  std::string model_dir = std::string(PDSERVE_SOURCE_DIR) + "/models/small";
  std::string out_dir = std::string(PDSERVE_SOURCE_DIR) + "/bench/results";
  std::vector<int64_t> batches = {1, 4, 16, 64}, contexts = {1024, 8192};
  int64_t steps = 6, warmup = 2, threads = 0;
  std::string kv_format = "fp8";
  bool profile_on = false;
  std::vector<int64_t> prefills = {2048, 8192, 32768};
  int64_t chunk = 512, copies = 64, copy_tokens = 32;
  for (int i = 1; i < argc; i += 2) {
    const std::string k = argv[i];
    if (k == "--help" || k == "-h") {
      std::fprintf(stderr,
                   "bench_engine [--model DIR] [--out DIR] [--batches 1,4,16,64] [--contexts 1024,8192]\n"
                   "             [--steps N] [--warmup N] [--threads N] [--kv-format fp8|bf16|int8] [--profile]\n"
                   "             [--prefill 2048,8192,32768|none] [--chunk 512] [--copies 64|0] [--copy-tokens 32]\n"
                   "Decode tokens/s by batch and context against the read roofline, prefill against the FMA\n"
                   "peak, and batch-generate copies; writes <out>/engine.{json,md} (bench/engine/bench_engine.cc).\n");
      return 0;
    }
    if (k == "--profile") {
      profile_on = true;
      --i;
      continue;
    }
    if (i + 1 >= argc) {
      std::fprintf(stderr, "option %s wants a value\n", k.c_str());
      return 2;
    }
    const std::string v = argv[i + 1];
    bool ok = true;
    auto list = [&](std::vector<int64_t>* out) {
      const auto parsed = ParseList(v);
      if (parsed) *out = *parsed;
      ok = parsed.has_value();
    };
    auto count = [&](int64_t* out, int64_t min) {
      const auto parsed = ParseCount(v, min);
      if (parsed) *out = *parsed;
      ok = parsed.has_value();
    };
    if (k == "--model") model_dir = v;
    else if (k == "--out") out_dir = v;
    else if (k == "--batches") list(&batches);
    else if (k == "--contexts") list(&contexts);
    else if (k == "--steps") count(&steps, 1);
    else if (k == "--warmup") count(&warmup, 0);
    else if (k == "--threads") count(&threads, 0);
    else if (k == "--kv-format") kv_format = v;
    else if (k == "--prefill") v == "none" ? prefills.clear() : list(&prefills);
    else if (k == "--chunk") count(&chunk, 1);
    else if (k == "--copies") count(&copies, 0);
    else if (k == "--copy-tokens") count(&copy_tokens, 1);
    else {
      std::fprintf(stderr, "unknown option %s (--help lists them)\n", k.c_str());
      return 2;
    }
    if (!ok) {
      std::fprintf(stderr, "%s %s: expected %s\n", k.c_str(), v.c_str(),
                   k == "--batches" || k == "--contexts" || k == "--prefill"
                       ? "a comma-separated list of whole numbers >= 1 (--prefill: or none)"
                       : "a whole number (--steps, --chunk, --copy-tokens >= 1; --warmup, --threads, --copies >= 0)");
      return 2;
    }
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
  const std::string load_start = bench::LoadAverage();
  const double bw = ReadBandwidth(&pool, 5);
  const bench::FmaPeak peak = bench::MeasureFmaPeak(&pool);
  // Shares of the peak are taken against the kernels that run: with PDSERVE_ISA=avx2 on an
  // AVX-512 machine that is the AVX2 peak (the machine's best is printed beside it).
  const kernels::Isa active_isa = kernels::ActiveIsa();
  const double peak_active = active_isa >= kernels::Isa::kAvx512 ? peak.best() : peak.avx2_gflops;
  std::fprintf(stderr, "read bandwidth %.1f GB/s, fp32 FMA peak %.0f GFLOP/s (AVX2 %.0f, AVX-512 %.0f; shares against "
                       "the active %s kernels' %.0f), %d threads, load %s\n",
               bw, peak.best(), peak.avx2_gflops, peak.avx512_gflops, kernels::IsaName(active_isa), peak_active,
               pool.n_threads(), load_start.c_str());
  auto loaded = model::Model::Load(model_dir, &pool);
  if (!loaded.ok()) {
    std::fprintf(stderr, "%s\n", loaded.status().ToString().c_str());
    return 1;
  }
  const model::Model& m = **loaded;
  const model::ModelConfig& c = m.config();
  const model::ModelWeights& w = m.weights();
  // "W8A8" when the attention projections are int8 (pdserve convert --quant w8a8 / w8a8_all).
  const std::string weight_format = w.layer(0).o.is_int8() ? "W8A8" : "BF16";

  // Bytes every decode step reads once whatever the batch, and one routed expert's bytes.
  int64_t fixed = Bytes(w.lm_head());
  int64_t expert_bytes = 0;
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    const model::LayerWeights& lw = w.layer(l);
    fixed += Bytes(lw.q_a) + Bytes(lw.q_b) + Bytes(lw.kv_a) + Bytes(lw.kv_b) + Bytes(lw.o) + Bytes(lw.idx_wq_b) +
             Bytes(lw.idx_wk) + Bytes(lw.idx_weights_proj);
    if (lw.is_moe) {
      fixed += Bytes(lw.router) + (c.n_shared_experts > 0 ? Bytes(lw.shared) : 0);
      expert_bytes = Bytes(lw.experts[0]);
    } else {
      fixed += Bytes(lw.dense);
    }
  }

  const int64_t max_ctx = *std::max_element(contexts.begin(), contexts.end());
  const int64_t max_b = *std::max_element(batches.begin(), batches.end());
  const int64_t B = 64, base_len = 1024;
  engine::EngineOptions eo;
  eo.block_tokens = B;
  eo.latent_format = ParseLatentFormat(kv_format).value();
  const KvLayout layout = model::KvLayoutFor(c, B, eo.latent_format, eo.index_format);
  const int64_t max_prefill = prefills.empty() ? 0 : *std::max_element(prefills.begin(), prefills.end());
  const int64_t copy_prompt = 64;
  const int64_t blocks = std::max({max_b * layout.BlocksForTokens(max_ctx + warmup + steps + 4),
                                   layout.BlocksForTokens(max_prefill + 2),
                                   copies * layout.BlocksForTokens(copy_prompt + copy_tokens + 2)}) +
                         layout.BlocksForTokens(base_len);
  eo.kv_cache_gib = static_cast<double>(blocks * layout.BlockBytes()) / (1ull << 30) + 1e-6;
  eo.scheduler.max_num_seqs = std::max<int64_t>({max_b, copies, 1});
  eo.scheduler.max_step_tokens = std::max<int64_t>({chunk, max_b, copies});
  eo.scheduler.prefill_chunk = chunk;
  OpProfile profile = model::MakeForwardProfile();
  if (profile_on) eo.profile = &profile;
  auto eng = engine::Engine::Create(eo, &m);
  if (!eng.ok()) {
    std::fprintf(stderr, "%s\n", eng.status().ToString().c_str());
    return 1;
  }
  engine::Engine& e = **eng;

  // The prefix, prefilled once with its KV held.
  std::mt19937 rng(1);
  std::vector<int32_t> prefix(static_cast<size_t>(base_len));
  for (auto& t : prefix) t = static_cast<int32_t>(rng() % c.vocab_size);
  engine::RequestOptions pro;
  pro.sampling.temperature = 0.0f;
  pro.sampling.max_tokens = 1;
  pro.hold_kv = true;
  int32_t first = -1;
  pro.on_event = [&](const engine::TokenEvent& ev) { if (ev.token >= 0) first = ev.token; };
  profile.Reset();
  const auto tp = Clock::now();
  const engine::RequestId pid = e.AddRequest(prefix, pro).value();
  while (!e.Idle()) e.Step();
  const double prefill_s = Since(tp);
  const std::vector<int32_t> held = e.HeldBlocks(pid).value();
  std::fprintf(stderr, "prefill of %lld tokens: %.2f s (%.0f tokens/s)\n", static_cast<long long>(base_len), prefill_s,
               base_len / prefill_s);
  if (profile_on) std::fprintf(stderr, "op profile, prefill of %lld tokens:\n%s", static_cast<long long>(base_len),
                               profile.Table().c_str());

  std::vector<Row> rows;
  for (int64_t ctx : contexts) {
    std::vector<int32_t> prompt;
    for (int64_t i = 0; i < ctx; ++i) prompt.push_back(prefix[static_cast<size_t>(i % base_len)]);
    for (int64_t b : batches) {
      std::vector<engine::RequestId> ids;
      for (int64_t j = 0; j < b; ++j) {
        engine::RequestOptions ro;
        ro.sampling.temperature = 0.0f;
        ro.sampling.max_tokens = static_cast<int32_t>(warmup + steps + 2);
        auto imp = e.ReserveImport(prompt, ro);
        if (!imp.ok()) {
          std::fprintf(stderr, "%s\n", imp.status().ToString().c_str());
          return 1;
        }
        const int64_t per = base_len / B;
        for (size_t k = 0; k < static_cast<size_t>(layout.BlocksForTokens(ctx)); ++k)
          std::memcpy(e.pool().base() + imp->block_ids[k] * layout.BlockBytes(),
                      e.pool().base() + held[k % static_cast<size_t>(per)] * layout.BlockBytes(),
                      static_cast<size_t>(layout.BlockBytes()));
        // Distinct first tokens: the requests diverge, as real traffic does (routing, selections).
        PDSERVE_CHECK(e.CommitImport(imp->id, static_cast<int32_t>((first + 7919 * j) % c.vocab_size)).ok());
        ids.push_back(imp->id);
      }
      for (int64_t s = 0; s < warmup; ++s) e.Step();
      profile.Reset();
      const engine::EngineStats s0 = e.Stats();
      const auto t0 = Clock::now();
      for (int64_t s = 0; s < steps; ++s) e.Step();
      const double secs = Since(t0);
      const engine::EngineStats s1 = e.Stats();
      const double n_steps = static_cast<double>(s1.steps - s0.steps);
      const double tokens = static_cast<double>(s1.generated_tokens - s0.generated_tokens);
      const double bytes = n_steps * static_cast<double>(fixed) +
                           static_cast<double>(s1.routed_expert_runs - s0.routed_expert_runs) * expert_bytes +
                           static_cast<double>(s1.kv_bytes_read - s0.kv_bytes_read);
      Row r;
      r.context = ctx;
      r.batch = b;
      r.steps = static_cast<int64_t>(n_steps);
      r.seconds = secs;
      r.tokens_per_s = tokens / secs;
      r.step_ms = secs / n_steps * 1e3;
      r.bytes_per_step = bytes / n_steps;
      r.roofline_tokens_per_s = tokens / (bytes / (bw * 1e9));
      r.ratio = r.tokens_per_s / r.roofline_tokens_per_s;
      const double fwd = s1.forward_seconds - s0.forward_seconds;
      const double over = (s1.schedule_seconds - s0.schedule_seconds) + (s1.sample_seconds - s0.sample_seconds) +
                          (s1.event_seconds - s0.event_seconds);
      r.overhead_share = over / (fwd + over);
      r.experts_per_layer = static_cast<double>(s1.routed_expert_runs - s0.routed_expert_runs) / n_steps /
                            static_cast<double>(c.num_hidden_layers - c.first_k_dense_replace);
      // FLOPs at the middle of the measured steps' contexts (warmup steps came first).
      r.gflops = bench::CountDecodeStepFlops(c, ctx + warmup + steps / 2, b).total() * n_steps / secs / 1e9;
      r.peak_share = r.gflops / peak_active;
      r.flop_bound_tokens_per_s = r.tokens_per_s / r.peak_share;
      r.ceiling_tokens_per_s = std::min(r.flop_bound_tokens_per_s, r.roofline_tokens_per_s);
      std::fprintf(stderr, "ctx %5lld batch %3lld: %8.1f tok/s  step %8.1f ms  roofline %8.1f tok/s (%.0f%%)  "
                           "%.0f GFLOP/s (%.0f%% of the FMA peak)  overhead %.2f%%\n",
                   static_cast<long long>(ctx), static_cast<long long>(b), r.tokens_per_s, r.step_ms,
                   r.roofline_tokens_per_s, r.ratio * 100, r.gflops, r.peak_share * 100, r.overhead_share * 100);
      if (profile_on) {
        std::fprintf(stderr, "op profile, context %lld batch %lld:\n%s", static_cast<long long>(ctx),
                     static_cast<long long>(b), profile.Table().c_str());
        for (int op = 0; op < profile.n_ops(); ++op)
          r.profile[profile.op_name(op)] = profile.seconds(model::kPhaseDecode, op) / profile.total_seconds(model::kPhaseDecode);
      }
      r.load = bench::LoadAverage();
      rows.push_back(r);
      for (engine::RequestId id : ids) (void)e.Abort(id);
      while (!e.Idle()) e.Step();
    }
  }
  PDSERVE_CHECK(e.ReleaseKv(pid).ok());

  // Prefill of whole prompts.
  std::vector<PrefillRow> prefill_rows;
  for (int64_t P : prefills) {
    std::vector<int32_t> prompt(static_cast<size_t>(P));
    for (auto& t : prompt) t = static_cast<int32_t>(rng() % c.vocab_size);
    engine::RequestOptions ro;
    ro.sampling.temperature = 0.0f;
    ro.sampling.max_tokens = 1;
    profile.Reset();
    const auto t0 = Clock::now();
    PDSERVE_CHECK(e.AddRequest(prompt, ro).ok());
    while (!e.Idle()) e.Step();
    PrefillRow r;
    r.tokens = P;
    r.seconds = Since(t0);
    r.tokens_per_s = static_cast<double>(P) / r.seconds;
    r.flops = bench::CountPrefillFlops(c, P, chunk);
    r.gflops = r.flops.total() / r.seconds / 1e9;
    r.peak_share = r.gflops / peak_active;
    if (profile_on) r.profile = ProfileShares(profile, model::kPhasePrefill);
    r.load = bench::LoadAverage();
    std::fprintf(stderr, "prefill %6lld tokens: %.2f s (%.0f tokens/s), %.0f GFLOP/s = %.0f%% of the FMA peak "
                         "(linear %.2f, attention %.2f, indexer %.2f TFLOP), load %s\n",
                 static_cast<long long>(P), r.seconds, r.tokens_per_s, r.gflops, 100 * r.peak_share,
                 r.flops.linear / 1e12, r.flops.attention / 1e12, r.flops.indexer / 1e12, r.load.c_str());
    if (profile_on) std::fprintf(stderr, "op profile, prefill of %lld tokens:\n%s", static_cast<long long>(P),
                                 profile.Table().c_str());
    prefill_rows.push_back(r);
  }

  // Copies of one prompt (batch-generate): one alone, then `copies` together.
  double copy1_tps = 0, copyn_tps = 0;
  bool copies_identical = true;
  std::string copy_load;
  if (copies > 0) {
    std::vector<int32_t> prompt(static_cast<size_t>(copy_prompt));
    for (auto& t : prompt) t = static_cast<int32_t>(rng() % c.vocab_size);
    auto run_copies = [&](int64_t n, std::vector<std::vector<int32_t>>* out) {
      out->assign(static_cast<size_t>(n), {});
      std::vector<engine::RequestId> ids;
      std::map<engine::RequestId, size_t> slot;
      const engine::EngineStats s0 = e.Stats();
      const auto t0 = Clock::now();
      for (int64_t i = 0; i < n; ++i) {
        engine::RequestOptions ro;
        ro.sampling.temperature = 0.0f;
        ro.sampling.max_tokens = static_cast<int32_t>(copy_tokens);
        std::vector<int32_t>* dst = &(*out)[static_cast<size_t>(i)];
        ro.on_event = [dst](const engine::TokenEvent& ev) { if (ev.token >= 0) dst->push_back(ev.token); };
        PDSERVE_CHECK(e.AddRequest(prompt, ro).ok());
      }
      while (!e.Idle()) e.Step();
      const double secs = Since(t0);
      return static_cast<double>(e.Stats().generated_tokens - s0.generated_tokens) / secs;
    };
    std::vector<std::vector<int32_t>> one, many;
    copy1_tps = run_copies(1, &one);
    profile.Reset();
    copyn_tps = run_copies(copies, &many);
    for (const auto& t : many) copies_identical = copies_identical && t == one[0];
    copy_load = bench::LoadAverage();
    std::fprintf(stderr, "copies: 1 copy %.1f tokens/s, %lld copies %.1f tokens/s (%.2fx), tokens %s, load %s\n",
                 copy1_tps, static_cast<long long>(copies), copyn_tps, copyn_tps / copy1_tps,
                 copies_identical ? "identical" : "DIFFERENT", copy_load.c_str());
    if (profile_on) std::fprintf(stderr, "op profile, %lld copies:\n%s", static_cast<long long>(copies),
                                 profile.Table().c_str());
  }
  const std::string load_end = bench::LoadAverage();
  auto tps = [&](int64_t ctx, int64_t b) {
    for (const Row& r : rows)
      if (r.context == ctx && r.batch == b) return r.tokens_per_s;
    return 0.0;
  };
  const double ratio_64_1k = tps(1024, 1) > 0 ? tps(1024, 64) / tps(1024, 1) : 0.0;
  const double ratio_16_8k = tps(8192, 1) > 0 ? tps(8192, 16) / tps(8192, 1) : 0.0;
  auto need = [&](int64_t ctx, int64_t b, double goal) {
    RatioNeed n;
    const Row* one = nullptr;
    const Row* many = nullptr;
    for (const Row& r : rows) {
      if (r.context == ctx && r.batch == 1) one = &r;
      if (r.context == ctx && r.batch == b) many = &r;
    }
    if (one == nullptr || many == nullptr) return n;
    n.needed_peak_share = many->peak_share * goal * one->tokens_per_s / many->tokens_per_s;
    n.ceiling_ratio = many->ceiling_tokens_per_s / one->tokens_per_s;
    return n;
  };
  const RatioNeed need_64_1k = need(1024, 64, 8.0), need_16_8k = need(8192, 16, 4.0);

  std::filesystem::create_directories(out_dir);
  nlohmann::json j;
  j["model"] = model_dir;
  j["kv_format"] = kv_format;
  j["threads"] = pool.n_threads();
  j["read_bandwidth_gbps"] = bw;
  j["fma_peak_gflops"] = {{"avx2", peak.avx2_gflops}, {"avx512", peak.avx512_gflops}, {"best", peak.best()},
                          {"active_isa", kernels::IsaName(active_isa)}, {"active", peak_active}};
  j["load_average"] = {{"start", load_start}, {"end", load_end}};
  j["ratios"] = {{"decode_batch64_over_batch1_ctx1k", ratio_64_1k}, {"decode_batch16_over_batch1_ctx8k", ratio_16_8k},
                 {"copies_over_one", copy1_tps > 0 ? copyn_tps / copy1_tps : 0.0},
                 {"batch64_1k_peak_share_for_8x", need_64_1k.needed_peak_share},
                 {"batch64_1k_ceiling_over_batch1", need_64_1k.ceiling_ratio},
                 {"batch16_8k_peak_share_for_4x", need_16_8k.needed_peak_share},
                 {"batch16_8k_ceiling_over_batch1", need_16_8k.ceiling_ratio}};
  j["copies"] = {{"copies", copies}, {"prompt_tokens", copy_prompt}, {"tokens_each", copy_tokens},
                 {"one_tokens_per_s", copy1_tps}, {"all_tokens_per_s", copyn_tps}, {"identical", copies_identical},
                 {"load", copy_load}};
  for (const PrefillRow& r : prefill_rows)
    j["prefill"].push_back({{"tokens", r.tokens}, {"chunk", chunk}, {"seconds", r.seconds},
                            {"tokens_per_s", r.tokens_per_s}, {"linear_flops", r.flops.linear},
                            {"attention_flops", r.flops.attention}, {"indexer_flops", r.flops.indexer},
                            {"gflops", r.gflops}, {"peak_share", r.peak_share}, {"profile", r.profile},
                            {"load", r.load}});
  j["prefill_tokens_per_s"] = base_len / prefill_s;
  j["fixed_weight_bytes_per_step"] = fixed;
  j["routed_expert_bytes"] = expert_bytes;
  for (const Row& r : rows)
    j["results"].push_back({{"context", r.context}, {"batch", r.batch}, {"steps", r.steps}, {"seconds", r.seconds},
                            {"tokens_per_s", r.tokens_per_s}, {"step_ms", r.step_ms}, {"bytes_per_step", r.bytes_per_step},
                            {"roofline_tokens_per_s", r.roofline_tokens_per_s}, {"roofline_ratio", r.ratio},
                            {"overhead_share", r.overhead_share}, {"routed_experts_per_layer", r.experts_per_layer},
                            {"gflops", r.gflops}, {"peak_share", r.peak_share},
                            {"flop_bound_tokens_per_s", r.flop_bound_tokens_per_s},
                            {"ceiling_tokens_per_s", r.ceiling_tokens_per_s}, {"profile", r.profile}, {"load", r.load}});
  std::ofstream(out_dir + "/engine.json") << j.dump(2) << "\n";
  std::ostringstream md;
  char line[512];
  md << "# Engine throughput (`" << std::filesystem::path(model_dir).filename().string() << "`, "
     << weight_format << " linear weights, " << kv_format << " KV)\n\n";
  std::snprintf(line, sizeof line,
                "- %d threads; read bandwidth %.1f GB/s (1 GiB STREAM-like sum); fp32 FMA peak %.0f GFLOP/s "
                "(AVX2 %.0f, AVX-512 %.0f; \"of FMA peak\" below is of the active %s kernels' %.0f); load average %s "
                "at the start, %s at the end\n"
                "- bytes per step = dense weights once (%.0f MB) + routed experts run (%.2f MB each) + KV scored/gathered\n\n",
                pool.n_threads(), bw, peak.best(), peak.avx2_gflops, peak.avx512_gflops, kernels::IsaName(active_isa),
                peak_active, load_start.c_str(), load_end.c_str(), fixed / 1e6, expert_bytes / 1e6);
  md << line;
  md << "## Decode\n\n";
  md << "| context | batch | tokens/s | step ms | MB/step | roofline tokens/s | of roofline | GFLOP/s | of FMA peak | "
        "ceiling tokens/s | of ceiling | experts/layer | sched+sample overhead | load |\n";
  md << "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|\n";
  for (const Row& r : rows) {
    std::snprintf(line, sizeof line,
                  "| %lld | %lld | %.1f | %.1f | %.0f | %.1f | %.0f%% | %.0f | %.0f%% | %.1f | %.0f%% | %.1f | %.2f%% | %s |\n",
                  static_cast<long long>(r.context), static_cast<long long>(r.batch), r.tokens_per_s, r.step_ms,
                  r.bytes_per_step / 1e6, r.roofline_tokens_per_s, r.ratio * 100, r.gflops, r.peak_share * 100,
                  r.ceiling_tokens_per_s, 100 * r.tokens_per_s / r.ceiling_tokens_per_s, r.experts_per_layer,
                  r.overhead_share * 100, r.load.c_str());
    md << line;
  }
  md << "\nCeiling: the lower of the read roofline and the step's FLOPs at the FMA peak.\n";
  std::snprintf(line, sizeof line,
                "\nBatch ratios (tokens/s): batch 64 / batch 1 at context 1K: %.2fx (goal >= 8x: batch 64 at %.0f%% of the "
                "FMA peak; its ceiling / batch 1: %.2fx); batch 16 / batch 1 at context 8K: %.2fx (goal >= 4x: batch 16 at "
                "%.0f%% of the FMA peak; its ceiling / batch 1: %.2fx).\n",
                ratio_64_1k, 100 * need_64_1k.needed_peak_share, need_64_1k.ceiling_ratio, ratio_16_8k,
                100 * need_16_8k.needed_peak_share, need_16_8k.ceiling_ratio);
  md << line;
  if (!prefill_rows.empty()) {
    md << "\n## Prefill (chunks of " << chunk << " tokens)\n\n";
    md << "| prompt | seconds | tokens/s | linear TFLOP | attention TFLOP | indexer TFLOP | GFLOP/s | of FMA peak | load |\n";
    md << "|---:|---:|---:|---:|---:|---:|---:|---:|---|\n";
    for (const PrefillRow& r : prefill_rows) {
      std::snprintf(line, sizeof line, "| %lld | %.2f | %.0f | %.2f | %.2f | %.2f | %.0f | %.0f%% | %s |\n",
                    static_cast<long long>(r.tokens), r.seconds, r.tokens_per_s, r.flops.linear / 1e12,
                    r.flops.attention / 1e12, r.flops.indexer / 1e12, r.gflops, 100 * r.peak_share, r.load.c_str());
      md << line;
    }
  }
  if (copies > 0) {
    std::snprintf(line, sizeof line,
                  "\n## Copies of one prompt (batch-generate)\n\n%lld copies of a %lld-token prompt, %lld tokens each: "
                  "%.1f tokens/s against %.1f for one copy (%.2fx; goal >= 8x), tokens %s; load %s.\n",
                  static_cast<long long>(copies), static_cast<long long>(copy_prompt), static_cast<long long>(copy_tokens),
                  copyn_tps, copy1_tps, copy1_tps > 0 ? copyn_tps / copy1_tps : 0.0,
                  copies_identical ? "identical" : "DIFFERENT", copy_load.c_str());
    md << line;
  }
  std::ofstream(out_dir + "/engine.md") << md.str();
  std::printf("%s", md.str().c_str());
  return 0;
}

}  // namespace
}  // namespace pdserve

int main(int argc, char** argv) {
  pdserve::ApplyHeapPolicy("bench_engine");
  return pdserve::Run(argc, argv);
}
