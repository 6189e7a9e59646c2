// bench_w8a8: measures the W8A8 path against the BF16 one on this machine.
//
//   gemm:      prefill shapes (m = 512, 2048): GemmInt8 (and with the activation quantization
//              that ApplyLinear adds) vs the BF16 and F32 Gemm on the same shapes, GFLOP/s;
//              decode shapes (m = 1): weights rotated over 256 MiB so they come from DRAM, GB/s.
//   crossover: GemmInt8's two paths for m = 1..16 (sets kGemmInt8SmallMMax).
//   decode:    one decode step at batch 1, BF16 vs W8A8 (and W8A8 "all"), on the `small` preset
//              and on `v32-slice` (V3.2's layer shapes), with the speed-up their bytes allow.
//   convert:   FP8/BF16 `small` -> W8A8/BF16 in a fresh process: input GB/s and its peak RSS.
//   accuracy:  `small` W8A8 vs BF16: per-layer cos, logits cos, top-1 over 100 greedy steps.
// Every timing alternates the contenders over several rounds and keeps the best median: the
// 2-core VM is shared, single runs are noisy.
//
// Usage: bench_w8a8 [--only gemm|crossover|decode|convert|accuracy] [--threads N] [--rounds R]
//                   [--models DIR] [--context N]
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <random>

#include "bench/common/bench_util.h"
#include "common/cpu_features.h"
#include "kernels/gemm.h"
#include "kernels/gemm_int8.h"
#include "kernels/gemm_int8_internal.h"
#include "kernels/quantize.h"
#include "model/checkpoint.h"
#include "model/convert.h"
#include "model/convert_accuracy.h"
#include "model/test_hooks.h"
#include "model/make_model.h"
#include "model/model.h"

namespace pdserve::bench {
namespace {

struct Opts {
  std::string only;
  int threads = 2;
  int rounds = 3;
  std::string models = "models";
  int64_t context = 256;
};

// Best over rounds of the median of `reps` calls.
double Best(const std::function<void()>& fn, int reps, int rounds) {
  double best = 1e30;
  for (int r = 0; r < rounds; ++r) best = std::min(best, MedianSeconds(fn, reps));
  return best;
}

struct Shape {
  int64_t n_out, n_in;
  const char* what;
};
// Weight shapes of the `small` preset and of the real model's scale (per the MoE expert).
const Shape kShapes[] = {{1024, 1024, "small: o_proj/2"},   {2048, 1024, "small: o_proj^T"},
                         {3072, 384, "small: q_b_proj"},    {256, 1024, "small: expert gate/up"},
                         {1024, 256, "small: expert down"}, {2048, 7168, "V3.2: expert gate/up"},
                         {7168, 2048, "V3.2: expert down"}};

// The compute ceilings of the two GEMMs' inner loops on this machine, in the same run: what
// INT8/BF16 can reach at most on prefill shapes (exact int8 products without VNNI take a
// vpmaddwd plus the vpaddd that accumulates it per 16 MACs, fp32 one FMA per 8).
nlohmann::json CeilingProbe(const Opts& o, std::string* md, double* ceiling_ratio) {
  const int rounds = 2 * o.rounds + 1;
  const double fma = PeakGmacs(&FmaLoopGmacs, o.threads, rounds);
  const double madd = PeakGmacs(&Int16MaddAddLoopGmacs, o.threads, rounds);
  const double ubs_sign = PeakGmacs(&Int8MaddubsLoopGmacs<true>, o.threads, rounds);
  const double ubs_7bit = PeakGmacs(&Int8MaddubsLoopGmacs<false>, o.threads, rounds);
  *ceiling_ratio = std::max(madd, ubs_sign) / fma;
  char line[1024];
  std::snprintf(line, sizeof(line),
                "Compute ceilings, %d threads (register-only loops, GMAC/s and x fp32 FMA):\n\n"
                "| inner loop | exact for | GMAC/s | x FMA |\n|---|---|---|---|\n"
                "| fp32 vfmadd231ps (the BF16 GEMM) | - | %.1f | 1.00x |\n"
                "| vpmaddwd + vpaddd (the INT8 GEMM) | int8 x int8 | %.1f | **%.2fx** |\n"
                "| vpsignb + vpmaddubsw + vpmaddwd(1) + vpaddd | int8 x int8 | %.1f | %.2fx |\n"
                "| vpmaddubsw + vpmaddwd(1) + vpaddd | 7-bit operands only | %.1f | %.2fx |\n\n"
                "INT8/BF16 ceiling for exact int8 products: **%.2fx**.\n\n",
                o.threads, fma, madd, madd / fma, ubs_sign, ubs_sign / fma, ubs_7bit, ubs_7bit / fma, *ceiling_ratio);
  *md += line;
  std::printf("%s", line);
  return {{"fma_gmacs", fma}, {"int16_madd_add_gmacs", madd}, {"int8_sign_maddubs_gmacs", ubs_sign},
          {"int7_maddubs_gmacs", ubs_7bit}, {"int8_over_bf16_ceiling", *ceiling_ratio}};
}

nlohmann::json GemmBench(const Opts& o, ThreadPool* pool, std::string* md) {
  nlohmann::json out = nlohmann::json::array();
  *md += "## GEMM: INT8 (W8A8) vs BF16 / F32 weights, " + std::to_string(o.threads) + " threads\n\n";
  double ceiling = 0;
  nlohmann::json ceilings = CeilingProbe(o, md, &ceiling);
  *md += "| m | n_out x n_in | shape | F32 GF/s | BF16 GF/s | INT8 GOP/s | INT8+quant GOP/s | INT8/BF16 | of ceiling | INT8+quant/BF16 | INT8/F32 |\n"
         "|---|---|---|---|---|---|---|---|---|---|---|\n";
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  for (int64_t m : {512, 2048}) {
    for (const Shape& s : kShapes) {
      std::vector<float> x(static_cast<size_t>(m * s.n_in)), y(static_cast<size_t>(m * s.n_out)), wf(static_cast<size_t>(s.n_out * s.n_in));
      for (auto& v : x) v = dist(rng);
      for (auto& v : wf) v = dist(rng);
      std::vector<uint16_t> wb(wf.size());
      for (size_t i = 0; i < wf.size(); ++i) wb[i] = F32ToBf16Bits(wf[i]);
      std::vector<int8_t> wq(wf.size()), xq(x.size());
      std::vector<float> ws(static_cast<size_t>(s.n_out)), xs(static_cast<size_t>(m));
      kernels::QuantizeRowsInt8(wf.data(), s.n_out, s.n_in, s.n_in, wq.data(), s.n_in, ws.data());
      kernels::QuantizeRowsInt8(x.data(), m, s.n_in, s.n_in, xq.data(), s.n_in, xs.data());
      const kernels::WeightView vf{DType::kF32, wf.data(), s.n_out, s.n_in, s.n_in};
      const kernels::WeightView vb{DType::kBF16, wb.data(), s.n_out, s.n_in, s.n_in};
      const kernels::Int8WeightView vi{wq.data(), ws.data(), s.n_out, s.n_in, s.n_in};
      const int reps = m * s.n_out * s.n_in > (int64_t{1} << 31) ? 3 : 7;
      const double tf = Best([&] { kernels::Gemm(x.data(), m, s.n_in, vf, y.data(), s.n_out, pool); }, reps, o.rounds);
      const double tb = Best([&] { kernels::Gemm(x.data(), m, s.n_in, vb, y.data(), s.n_out, pool); }, reps, o.rounds);
      const double ti = Best([&] { kernels::GemmInt8(xq.data(), xs.data(), m, s.n_in, vi, y.data(), s.n_out, pool); }, reps, o.rounds);
      const double tq = Best([&] {
        pool->ParallelFor(m, [&](int64_t b, int64_t e) {
          kernels::QuantizeRowsInt8(x.data() + b * s.n_in, e - b, s.n_in, s.n_in, xq.data() + b * s.n_in, s.n_in, xs.data() + b);
        });
        kernels::GemmInt8(xq.data(), xs.data(), m, s.n_in, vi, y.data(), s.n_out, pool);
      }, reps, o.rounds);
      const double fl = 2.0 * m * s.n_out * s.n_in / 1e9;
      out.push_back({{"m", m}, {"n_out", s.n_out}, {"n_in", s.n_in}, {"f32_gflops", fl / tf}, {"bf16_gflops", fl / tb},
                     {"int8_gops", fl / ti}, {"int8_with_quant_gops", fl / tq}, {"int8_over_bf16", tb / ti},
                     {"int8_quant_over_bf16", tb / tq}, {"int8_over_f32", tf / ti}, {"share_of_ceiling", tb / ti / ceiling}});
      char line[320];
      std::snprintf(line, sizeof(line), "| %lld | %lldx%lld | %s | %.1f | %.1f | %.1f | %.1f | %.2fx | %.0f%% | %.2fx | %.2fx |\n",
                    static_cast<long long>(m), static_cast<long long>(s.n_out), static_cast<long long>(s.n_in), s.what,
                    fl / tf, fl / tb, fl / ti, fl / tq, tb / ti, 100 * tb / ti / ceiling, tb / tq, tf / ti);
      *md += line;
      std::printf("%s", line);
      std::fflush(stdout);
    }
  }
  // Decode (m = 1): weights from DRAM, as in a decode step where they were long evicted.
  *md += "\n## GEMV (m = 1), weights from DRAM: GB/s of weight bytes and time per call\n\n"
         "| n_out x n_in | BF16 us | BF16 GB/s | INT8 us | INT8 GB/s | speed-up |\n|---|---|---|---|---|---|\n";
  for (const Shape& s : kShapes) {
    const int64_t per = s.n_out * s.n_in;
    const int64_t copies = std::max<int64_t>(2, (int64_t{256} << 20) / (per * 2));
    std::vector<uint16_t> wb(static_cast<size_t>(per * copies), F32ToBf16Bits(0.5f));
    std::vector<int8_t> wq(static_cast<size_t>(per * copies * 2), 3);  // same 512 MiB rotation span
    std::vector<float> ws(static_cast<size_t>(s.n_out), 0.01f), x(static_cast<size_t>(s.n_in), 0.25f), y(static_cast<size_t>(s.n_out));
    std::vector<int8_t> xq(static_cast<size_t>(s.n_in), 5);
    float xs = 0.01f;
    int64_t cb = 0, ci = 0;
    const double tb = Best([&] {
      kernels::WeightView v{DType::kBF16, wb.data() + (cb++ % copies) * per, s.n_out, s.n_in, s.n_in};
      kernels::Gemm(x.data(), 1, s.n_in, v, y.data(), s.n_out, pool);
    }, 41, o.rounds);
    const double ti = Best([&] {
      kernels::Int8WeightView v{wq.data() + (ci++ % (2 * copies)) * per, ws.data(), s.n_out, s.n_in, s.n_in};
      kernels::QuantizeRowsInt8(x.data(), 1, s.n_in, s.n_in, xq.data(), s.n_in, &xs);
      kernels::GemmInt8(xq.data(), &xs, 1, s.n_in, v, y.data(), s.n_out, pool);
    }, 41, o.rounds);
    out.push_back({{"m", 1}, {"n_out", s.n_out}, {"n_in", s.n_in}, {"bf16_us", tb * 1e6}, {"int8_us", ti * 1e6},
                   {"bf16_gbps", per * 2 / tb / 1e9}, {"int8_gbps", per / ti / 1e9}, {"int8_over_bf16", tb / ti}});
    char line[256];
    std::snprintf(line, sizeof(line), "| %lldx%lld | %.1f | %.1f | %.1f | %.1f | %.2fx |\n", static_cast<long long>(s.n_out),
                  static_cast<long long>(s.n_in), tb * 1e6, per * 2 / tb / 1e9, ti * 1e6, per / ti / 1e9, tb / ti);
    *md += line;
    std::printf("%s", line);
  }
  return {{"ceilings", ceilings}, {"shapes", out}};
}

nlohmann::json CrossoverBench(const Opts& o, ThreadPool* pool, std::string* md) {
  // Both internal paths on the same problem, single-threaded: where the tiled path starts to win.
  const int64_t n_out = 2048, n_in = 1024;
  std::vector<int8_t> w(static_cast<size_t>(n_out * n_in), 3);
  std::vector<float> ws(static_cast<size_t>(n_out), 0.01f);
  std::vector<int16_t> x16(static_cast<size_t>(16 * n_in) + 32, 2);
  int16_t* xa = x16.data();
  while (reinterpret_cast<uintptr_t>(xa) % 32) ++xa;
  std::vector<float> y(static_cast<size_t>(16 * n_out)), xs(16, 0.01f);
  nlohmann::json out = nlohmann::json::array();
  *md += "\n## Decode vs tiled path of GemmInt8 (2048x1024, 1 thread, weights in cache)\n\n| m | decode us | tiled us |\n|---|---|---|\n";
  for (int64_t m = 1; m <= 16; ++m) {
    kernels::internal::Int8Problem p;
    p.xp = xa;  // the avx2 level's widened x (n_in is a multiple of 16: its row stride)
    p.x_scales = xs.data();
    p.m = m;
    p.w = {w.data(), ws.data(), n_out, n_in, n_in};
    p.y = y.data();
    p.ldy = n_out;
    const double ts = Best([&] { kernels::internal::GemmInt8SmallM(p, 0, m, 0, n_out); }, 21, o.rounds);
    const double tt = Best([&] { kernels::internal::GemmInt8Tiled(p, 0, m, 0, n_out); }, 21, o.rounds);
    out.push_back({{"m", m}, {"decode_us", ts * 1e6}, {"tiled_us", tt * 1e6}});
    char line[96];
    std::snprintf(line, sizeof(line), "| %lld | %.1f | %.1f |\n", static_cast<long long>(m), ts * 1e6, tt * 1e6);
    *md += line;
    std::printf("%s", line);
  }
  (void)pool;
  return out;
}

Status EnsureModels(const Opts& o, std::string* bf16, std::string* fp8, std::string* w8, std::string* w8all) {
  *bf16 = o.models + "/small";
  *fp8 = o.models + "/small-fp8";
  *w8 = o.models + "/small-w8a8";
  *w8all = o.models + "/small-w8a8-all";
  for (const auto& [dir, dtype] : {std::pair{*bf16, "bf16"}, std::pair{*fp8, "fp8"}}) {
    if (std::filesystem::exists(dir + "/config.json")) continue;
    std::printf("making the small preset (%s) in %s ...\n", dtype, dir.c_str());
    model::MakeModelOptions mo;
    mo.preset = "small";
    mo.out_dir = dir;
    mo.dtype = dtype;
    PDSERVE_RETURN_IF_ERROR(model::MakeModel(mo));
  }
  for (const auto& [dir, quant] : {std::pair{*w8, "w8a8"}, std::pair{*w8all, "w8a8_all"}}) {
    if (std::filesystem::exists(dir + "/config.json")) continue;
    model::ConvertOptions co;
    co.in_dir = *bf16;
    co.out_dir = dir;
    co.quant = quant;
    co.pool = &ThreadPool::Default();
    PDSERVE_RETURN_IF_ERROR(model::Convert(co).status());
  }
  return Status::Ok();
}

// Weight bytes one decode step at batch 1 reads from the checkpoint in `dir`: every matrix
// (with its scales) once, except the embedding (one row) and the routed experts (top_k of
// n_routed per MoE layer). The step is memory-bound, so the ratio of two models' figures is
// the speed-up their weights allow.
Result<double> DecodeWeightBytes(const std::string& dir) {
  PDSERVE_ASSIGN_OR_RETURN(auto ckpt, model::Checkpoint::Open(dir));
  const model::ModelConfig& c = ckpt->config();
  double bytes = 0;
  for (const auto& [name, t] : ckpt->tensors()) {
    int layer = -1;
    if (std::sscanf(name.c_str(), "model.layers.%d.", &layer) == 1 && layer >= c.num_hidden_layers) continue;  // MTP
    double share = 1;
    if (name.rfind("model.embed_tokens.", 0) == 0) share = 1.0 / static_cast<double>(c.vocab_size);
    if (name.find(".mlp.experts.") != std::string::npos)
      share = static_cast<double>(c.num_experts_per_tok) / static_cast<double>(c.n_routed_experts);
    bytes += share * static_cast<double>(t->n_bytes);
  }
  return bytes;
}

struct DecodeRun {
  std::string name, dir;
  bool per_expert = false;  // routed experts one Mlp each instead of the grouped INT8 GEMMs
};

// One decode step at batch 1 after a `context`-token prompt, for each run: best median step
// time, the weight bytes it reads and the speed-up those bytes allow, as a markdown table
// under `title`. The first run is the baseline.
nlohmann::json TimeDecodeSteps(const Opts& o, ThreadPool* pool, const std::string& title,
                               const std::vector<DecodeRun>& specs, std::string* md) {
  struct Run {
    DecodeRun spec;
    std::unique_ptr<model::Model> m;
    std::unique_ptr<model::SequenceKvCache> cache;
    std::vector<float> logits;
    double bytes = 0;
    double best = 1e30;
  };
  std::vector<Run> runs;
  for (const DecodeRun& spec : specs) {
    auto m = model::Model::Load(spec.dir, pool);
    if (!m.ok()) return {{"error", m.status().ToString()}};
    auto bytes = DecodeWeightBytes(spec.dir);
    if (!bytes.ok()) return {{"error", bytes.status().ToString()}};
    Run r{spec, std::move(*m), nullptr, {}, *bytes};
    r.cache = std::make_unique<model::SequenceKvCache>(r.m->config());
    r.logits.resize(static_cast<size_t>(r.m->config().vocab_size));
    std::vector<int32_t> prompt(static_cast<size_t>(o.context));
    for (int64_t i = 0; i < o.context; ++i) prompt[i] = static_cast<int32_t>((i * 7919 + 13) % r.m->config().vocab_size);
    if (Status s = r.m->Forward(prompt.data(), o.context, r.cache.get(), r.logits.data()); !s.ok()) return {{"error", s.ToString()}};
    runs.push_back(std::move(r));
  }
  // Rounds alternate the models; each round times 8 steps per model (same token fed to all, so
  // the contexts stay the same length) and keeps its median.
  const int32_t token = 42;
  for (int round = 0; round < 4 * o.rounds; ++round)
    for (Run& r : runs) {
      model::TEST_SetPerExpertMoe(r.spec.per_expert);
      std::vector<double> t;
      for (int s = 0; s < 8; ++s) {
        const auto t0 = Clock::now();
        if (!r.m->Forward(&token, 1, r.cache.get(), r.logits.data()).ok()) return {{"error", "forward"}};
        t.push_back(SecondsSince(t0));
      }
      std::sort(t.begin(), t.end());
      r.best = std::min(r.best, t[t.size() / 2]);
      model::TEST_SetPerExpertMoe(false);
    }
  nlohmann::json out;
  *md += "\n## Decode step, " + title + ", batch 1, context " + std::to_string(o.context) + ", " +
         std::to_string(o.threads) + " threads\n\nIdeal: the speed-up the weight bytes read per step allow "
         "(memory-bound step).\n\n| weights | step ms | speed-up vs BF16 | weight MB per step | ideal speed-up | weight GB/s |\n"
         "|---|---|---|---|---|---|\n";
  const Run& base = runs[0];
  for (const Run& r : runs) {
    out[r.spec.name] = {{"step_ms", r.best * 1e3}, {"speedup", base.best / r.best}, {"weight_mb_per_step", r.bytes / 1e6},
                        {"ideal_speedup", base.bytes / r.bytes}, {"weight_gbps", r.bytes / r.best / 1e9}};
    char line[200];
    std::snprintf(line, sizeof(line), "| %s | %.2f | %.2fx | %.1f | %.2fx | %.1f |\n", r.spec.name.c_str(), r.best * 1e3,
                  base.best / r.best, r.bytes / 1e6, base.bytes / r.bytes, r.bytes / r.best / 1e9);
    *md += line;
    std::printf("%s", line);
  }
  return out;
}

// The `v32-slice` preset (V3.2's layer shapes, 2 layers) in BF16 and W8A8 under `models`.
Status EnsureSliceModels(const Opts& o, std::string* bf16, std::string* w8) {
  *bf16 = o.models + "/v32-slice";
  *w8 = o.models + "/v32-slice-w8a8";
  if (!std::filesystem::exists(*bf16 + "/config.json")) {
    std::printf("making the v32-slice preset in %s ...\n", bf16->c_str());
    model::MakeModelOptions mo;
    mo.preset = "v32-slice";
    mo.out_dir = *bf16;
    PDSERVE_RETURN_IF_ERROR(model::MakeModel(mo));
  }
  if (!std::filesystem::exists(*w8 + "/config.json")) {
    model::ConvertOptions co;
    co.in_dir = *bf16;
    co.out_dir = *w8;
    co.quant = "w8a8";
    co.pool = &ThreadPool::Default();
    PDSERVE_RETURN_IF_ERROR(model::Convert(co).status());
  }
  return Status::Ok();
}

nlohmann::json DecodeBench(const Opts& o, ThreadPool* pool, std::string* md) {
  std::string bf16, fp8, w8, w8all, slice, slice_w8;
  if (Status s = EnsureModels(o, &bf16, &fp8, &w8, &w8all); !s.ok()) return {{"error", s.ToString()}};
  if (Status s = EnsureSliceModels(o, &slice, &slice_w8); !s.ok()) return {{"error", s.ToString()}};
  nlohmann::json out;
  out["small"] = TimeDecodeSteps(o, pool, "`small` preset",
                                 {{"BF16", bf16}, {"W8A8", w8}, {"W8A8-all", w8all},
                                  {"W8A8, experts one by one (before grouping)", w8, true}},
                                 md);
  out["v32_slice"] = TimeDecodeSteps(o, pool, "`v32-slice` preset (V3.2's layer shapes, 2 layers, 16 experts)",
                                     {{"BF16", slice}, {"W8A8", slice_w8}}, md);
  return out;
}

nlohmann::json ConvertBench(const Opts& o, std::string* md) {
  std::string bf16, fp8, w8, w8all;
  if (Status s = EnsureModels(o, &bf16, &fp8, &w8, &w8all); !s.ok()) return {{"error", s.ToString()}};
  nlohmann::json out = nlohmann::json::array();
  *md += "\n## Converter (`small` preset), one fresh process each, its peak RSS (VmHWM)\n\n"
         "| input | output | ep-size | threads | input MB | output MB | seconds | input GB/s | peak RSS MB |\n"
         "|---|---|---|---|---|---|---|---|---|\n";
  for (const auto& [in, quant, ep, threads] : {std::tuple{fp8, "w8a8", 1, o.threads}, std::tuple{bf16, "w8a8", 1, o.threads},
                                               std::tuple{fp8, "w8a8", 4, o.threads}, std::tuple{fp8, "bf16", 1, o.threads},
                                               std::tuple{fp8, "w8a8", 1, 1}}) {
    const std::string dst = o.models + "/.bench-convert-out";
    std::filesystem::remove_all(dst);
    // A fresh process (fork + exec of this binary): a plain fork would count the parent's
    // resident pages in the child's peak RSS.
    int fds[2];
    if (pipe(fds) != 0) return {{"error", "pipe"}};
    const std::string ep_s = std::to_string(ep), th_s = std::to_string(threads);
    const pid_t pid = fork();
    if (pid == 0) {
      close(fds[0]);
      dup2(fds[1], 1);
      execl("/proc/self/exe", "bench_w8a8", "--convert-child", in.c_str(), dst.c_str(), quant, ep_s.c_str(), th_s.c_str(),
            static_cast<char*>(nullptr));
      _exit(127);
    }
    close(fds[1]);
    double msg[4] = {-1, 0, 0, 0};
    if (read(fds[0], msg, sizeof(msg)) != sizeof(msg)) msg[0] = -1;
    close(fds[0]);
    int status = 0;
    waitpid(pid, &status, 0);
    std::filesystem::remove_all(dst);
    if (msg[0] < 0) return {{"error", "conversion failed"}};
    const double rss_mb = msg[3] / 1024.0;
    out.push_back({{"input", in}, {"quant", quant}, {"ep_size", ep}, {"threads", threads}, {"seconds", msg[0]},
                   {"bytes_in", msg[1]}, {"bytes_out", msg[2]}, {"gbps_in", msg[1] / msg[0] / 1e9}, {"peak_rss_mb", rss_mb}});
    char line[256];
    std::snprintf(line, sizeof(line), "| %s | %s | %d | %d | %.0f | %.0f | %.2f | %.2f | %.0f |\n",
                  std::filesystem::path(in).filename().c_str(), quant, ep, threads, msg[1] / 1e6, msg[2] / 1e6, msg[0],
                  msg[1] / msg[0] / 1e9, rss_mb);
    *md += line;
    std::printf("%s", line);
  }
  return out;
}

nlohmann::json AccuracyBench(const Opts& o, ThreadPool* pool, std::string* md) {
  std::string bf16, fp8, w8, w8all;
  if (Status s = EnsureModels(o, &bf16, &fp8, &w8, &w8all); !s.ok()) return {{"error", s.ToString()}};
  std::vector<int32_t> prompt;
  for (int i = 0; i < 48; ++i) prompt.push_back((i * 7919 + 13) % 32000);
  nlohmann::json out;
  *md += "\n## Accuracy vs the BF16 engine (`small`, 48-token prompt, 100 greedy steps)\n\n"
         "| weights | per-layer cos alone, reference inputs (min) | per-layer cos (min) | logits cos | top-1 agreement (teacher-forced) | step logits cos min / mean | free-run identical steps "
         "| prompt expert flips | routing+top-k pinned: per-layer cos (min) | pinned: logits cos |\n"
         "|---|---|---|---|---|---|---|---|---|---|\n";
  for (const auto& [name, dir] : {std::pair{"W8A8", w8}, std::pair{"W8A8-all", w8all}}) {
    auto r = model::CompareW8A8(bf16, dir, prompt, 100, pool);
    if (!r.ok()) return {{"error", r.status().ToString()}};
    out[name] = {{"isolated_layer_cos", r->isolated_layer_cos}, {"layer_cos", r->layer_cos}, {"logits_cos", r->logits_cos}, {"top1_agree", r->top1_agree},
                 {"steps", r->steps}, {"min_step_logits_cos", r->min_step_logits_cos},
                 {"mean_step_logits_cos", r->mean_step_logits_cos}, {"free_run_prefix", r->free_run_prefix},
                 {"expert_flips", r->expert_flips}, {"expert_slots", r->expert_slots},
                 {"pinned_layer_cos", r->pinned_layer_cos}, {"pinned_logits_cos", r->pinned_logits_cos}};
    auto join = [](const std::vector<double>& v) {
      std::string s;
      for (double c : v) s += (s.empty() ? "" : " ") + std::to_string(c).substr(0, 6);
      return s;
    };
    char line[768];
    std::snprintf(line, sizeof(line), "| %s | %s (%.4f) | %s (%.4f) | %.4f | %lld/%lld | %.4f / %.4f | %lld | %lld/%lld | %s (%.4f) | %.4f |\n",
                  name, join(r->isolated_layer_cos).c_str(), r->isolated_min_layer_cos, join(r->layer_cos).c_str(), r->min_layer_cos, r->logits_cos, static_cast<long long>(r->top1_agree),
                  static_cast<long long>(r->steps), r->min_step_logits_cos, r->mean_step_logits_cos,
                  static_cast<long long>(r->free_run_prefix), static_cast<long long>(r->expert_flips),
                  static_cast<long long>(r->expert_slots), join(r->pinned_layer_cos).c_str(), r->pinned_min_layer_cos,
                  r->pinned_logits_cos);
    *md += line;
    std::printf("%s", line);
  }
  return out;
}

// The converter child of ConvertBench: argv = --convert-child IN OUT QUANT EP THREADS; writes
// {seconds, bytes_in, bytes_out, peak RSS KB} as 4 doubles to stdout.
int ConvertChild(char** argv) {
  ThreadPool pool(std::atoi(argv[6]));
  model::ConvertOptions co;
  co.in_dir = argv[2];
  co.out_dir = argv[3];
  co.quant = argv[4];
  co.ep_size = std::atoll(argv[5]);
  co.pool = &pool;
  co.max_shard_bytes = int64_t{1} << 30;
  auto st = model::Convert(co);
  if (!st.ok()) std::fprintf(stderr, "%s\n", st.status().ToString().c_str());
  // VmHWM: the peak RSS of this process image. getrusage/wait4 would not do: Linux carries the
  // RSS the child had before exec (the parent's pages, shared after fork) into ru_maxrss.
  double hwm_kb = 0;
  if (FILE* f = std::fopen("/proc/self/status", "r")) {
    char line[256];
    while (std::fgets(line, sizeof(line), f))
      if (!std::strncmp(line, "VmHWM:", 6)) hwm_kb = std::atof(line + 6);
    std::fclose(f);
  }
  const double msg[4] = {st.ok() ? st->seconds : -1, st.ok() ? double(st->bytes_in) : 0,
                         st.ok() ? double(st->bytes_out) : 0, hwm_kb};
  return write(1, msg, sizeof(msg)) == sizeof(msg) && st.ok() ? 0 : 1;
}

int Main(int argc, char** argv) {
  RequireCpuFeatures();
  if (argc == 7 && !std::strcmp(argv[1], "--convert-child")) return ConvertChild(argv);
  Opts o;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--only")) o.only = argv[i + 1];
    else if (!std::strcmp(argv[i], "--threads")) o.threads = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--rounds")) o.rounds = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--models")) o.models = argv[i + 1];
    else if (!std::strcmp(argv[i], "--context")) o.context = std::atoll(argv[i + 1]);
  }
  ThreadPool pool(o.threads);
  nlohmann::json j = {{"bench", "w8a8"}, {"threads", o.threads}, {"machine", MachineName()}, {"commit", GitRevision()}};
  std::string md = "# W8A8 INT8 vs BF16 (" + MachineName() + ", commit " + GitRevision() + ")\n\n";
  auto want = [&](const char* s) { return o.only.empty() || o.only == s; };
  if (want("gemm")) j["gemm"] = GemmBench(o, &pool, &md);
  if (want("crossover")) j["crossover"] = CrossoverBench(o, &pool, &md);
  if (want("decode")) j["decode"] = DecodeBench(o, &pool, &md);
  if (want("convert")) j["convert"] = ConvertBench(o, &md);
  if (want("accuracy")) j["accuracy"] = AccuracyBench(o, &pool, &md);
  WriteResults(o.only.empty() ? "w8a8" : "w8a8_" + o.only, j, md);
  return 0;
}

}  // namespace
}  // namespace pdserve::bench

int main(int argc, char** argv) { return pdserve::bench::Main(argc, argv); }
