// bench_decode: one-token decode step of a model (default: the `small` preset, created under
// models/small if absent) at batch 1, against the memory-bandwidth roofline measured in the
// same run: the bytes the step must read (every dense weight, the routed experts a token
// selects, lm_head, and the KV the indexer and the sparse attention touch) / read bandwidth.
//   build/bin/bench_decode [--model DIR] [--context N] [--steps N] [--threads N]
#include <cstring>
#include <filesystem>

#include "bench/common/bench_util.h"
#include "common/cpu_features.h"
#include "common/heap_policy.h"
#include "model/tools/make_model.h"
#include "model/model.h"

namespace pdserve::bench {
namespace {

// Bytes one decode step at context T reads, for BF16 weights (2 bytes each).
double StepBytes(const model::ModelConfig& c, int64_t T) {
  const double D = c.hidden_size, H = c.num_attention_heads, Lq = c.q_lora_rank, Lkv = c.kv_lora_rank;
  const double dn = c.qk_nope_head_dim, dr = c.qk_rope_head_dim, dv = c.v_head_dim;
  const double IH = c.index_n_heads, ID = c.index_head_dim;
  const double attn = Lq * D + H * (dn + dr) * Lq + (Lkv + dr) * D + H * (dn + dv) * Lkv + D * H * dv +
                      IH * ID * Lq + ID * D + IH * D;
  double weights = 0;
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    weights += attn;
    if (c.IsMoeLayer(l)) {
      weights += c.n_routed_experts * D + c.num_experts_per_tok * 3.0 * D * c.moe_intermediate_size +
                 3.0 * D * c.n_shared_experts * c.moe_intermediate_size;
    } else {
      weights += 3.0 * D * c.intermediate_size;
    }
  }
  weights += c.vocab_size * D + D;  // lm_head + one embedding row
  const double kv_record = Lkv + Lkv / 128 * 4 + dr * 2;  // latent codes + scales + k_pe
  const double kv = c.num_hidden_layers * (T * (ID + 4) + std::min<double>(T, c.index_topk) * kv_record);
  return weights * 2.0 + kv;
}

int Main(int argc, char** argv) {
  RequireCpuFeatures();
  std::string model_dir = "models/small";
  int64_t context = 1024, steps = 16, threads = 2;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--model")) model_dir = argv[i + 1];
    else if (!std::strcmp(argv[i], "--context")) context = std::atoll(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--steps")) steps = std::atoll(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--threads")) threads = std::atoll(argv[i + 1]);
  }
  if (!std::filesystem::exists(model_dir + "/config.json")) {
    std::printf("making the small preset in %s ...\n", model_dir.c_str());
    model::MakeModelOptions o;
    o.preset = "small";
    o.out_dir = model_dir;
    if (Status s = model::MakeModel(o); !s.ok()) return std::fprintf(stderr, "%s\n", s.ToString().c_str()), 1;
  }
  ThreadPool pool(static_cast<int>(threads));
  auto m = model::Model::Load(model_dir, &pool);
  if (!m.ok()) return std::fprintf(stderr, "%s\n", m.status().ToString().c_str()), 1;
  const auto& cfg = (*m)->config();
  model::SequenceKvCache cache(cfg);
  std::vector<int32_t> prompt(static_cast<size_t>(context));
  for (int64_t i = 0; i < context; ++i) prompt[i] = static_cast<int32_t>((i * 7919 + 13) % cfg.vocab_size);
  std::vector<float> logits(static_cast<size_t>(cfg.vocab_size));
  const auto t0 = Clock::now();
  if (Status s = (*m)->Forward(prompt.data(), context, &cache, logits.data()); !s.ok())
    return std::fprintf(stderr, "%s\n", s.ToString().c_str()), 1;
  const double prefill_s = SecondsSince(t0);
  std::vector<double> times;
  for (int64_t s = 0; s < steps; ++s) {
    const int32_t next = static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
    const auto t1 = Clock::now();
    if (Status st = (*m)->Forward(&next, 1, &cache, logits.data()); !st.ok())
      return std::fprintf(stderr, "%s\n", st.ToString().c_str()), 1;
    times.push_back(SecondsSince(t1));
  }
  std::sort(times.begin(), times.end());
  const double step_s = times[times.size() / 2];
  const double bw = ReadBandwidthGBps(static_cast<int>(threads));
  const double bytes = StepBytes(cfg, context + steps / 2);
  const double roofline_s = bytes / (bw * 1e9);
  nlohmann::json j = {{"bench", "decode_step"}, {"model", model_dir}, {"context", context}, {"threads", threads},
                      {"prefill_seconds", prefill_s}, {"prefill_tokens_per_s", context / prefill_s},
                      {"step_ms_median", step_s * 1e3}, {"step_ms_min", times.front() * 1e3},
                      {"bytes_per_step", bytes}, {"read_bandwidth_gbps", bw},
                      {"roofline_ms", roofline_s * 1e3}, {"fraction_of_roofline", roofline_s / step_s},
                      {"machine", MachineName()}, {"commit", GitRevision()}};
  char md[1024];
  std::snprintf(md, sizeof(md),
                "# Decode step, batch 1 (%s, context %lld, %lld threads)\n\n"
                "| step (median) | bytes read | read BW | roofline | fraction of roofline | prefill |\n"
                "|---|---|---|---|---|---|\n"
                "| %.2f ms | %.1f MB | %.1f GB/s | %.2f ms | %.0f%% | %.0f tok/s |\n\n%s, commit %s\n",
                model_dir.c_str(), static_cast<long long>(context), static_cast<long long>(threads), step_s * 1e3,
                bytes / 1e6, bw, roofline_s * 1e3, 100 * roofline_s / step_s, context / prefill_s,
                MachineName().c_str(), GitRevision().c_str());
  WriteResults("decode", j, md);
  return 0;
}

}  // namespace
}  // namespace pdserve::bench

int main(int argc, char** argv) {
  pdserve::ApplyHeapPolicy("bench_decode");
  return pdserve::bench::Main(argc, argv);
}
