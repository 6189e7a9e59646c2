// PlanReport::ToJson / ToMarkdown (planner/plan.h).
#include <cmath>
#include <cstdio>
#include <sstream>

#include "planner/plan.h"

namespace pdserve::planner {

namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

std::string Fmt(const char* f, double v) {
  char b[64];
  std::snprintf(b, sizeof(b), f, v);
  return b;
}
std::string Ms(double s) { return Fmt(s < 0.01 ? "%.3f" : s < 1 ? "%.1f" : "%.0f", s * 1e3); }
std::string Gib(double b) { return Fmt("%.2f", b / kGiB); }
std::string PlanText(const comm::ParallelPlan& p) {
  std::string s;
  auto add = [&](const char* k, int v) {
    if (v > 1) s += (s.empty() ? "" : ",") + std::string(k) + "=" + std::to_string(v);
  };
  add("cp", p.cp);
  add("dp", p.dp);
  add("ep", p.ep);
  add("tp", p.tp);
  return s.empty() ? "1 rank" : s;
}

nlohmann::json Pct(const Percentiles& p) { return {{"p50", p.p50}, {"p90", p.p90}, {"p99", p.p99}, {"mean", p.mean}}; }

}  // namespace

nlohmann::json PlanReport::ToJson() const {
  const model::ModelConfig& c = shape.config;
  nlohmann::json j;
  j["model"] = {{"name", model_name},
                {"layers", c.num_hidden_layers},
                {"hidden_size", c.hidden_size},
                {"routed_experts", c.n_routed_experts},
                {"experts_per_token", c.num_experts_per_tok},
                {"index_topk", c.index_topk},
                {"total_params", shape.TotalParams()},
                {"active_params", shape.ActiveParams()}};
  j["hardware"] = hardware.ToJson();
  j["precision"] = {{"weights", WeightFormatName(shape.weights)},
                    {"kv_format", KvFormatName(shape.latent_format)},
                    {"index_format", KvFormatName(shape.index_format)},
                    {"fp8_dequantized", shape.fp8_dequantized}};
  j["kv_bytes_per_token"] = kv_bytes_per_token;
  j["kv_bytes_per_token_mla"] = mla_bytes_per_token;
  j["kv_bytes_per_token_indexer"] = indexer_bytes_per_token;
  j["mode"] = spec.colocated ? "colocated" : "disaggregated";
  nlohmann::json pools_j = nlohmann::json::object(), weights_j = nlohmann::json::object();
  for (const auto& p : pools) {
    pools_j[p.role] = p.ToJson();
    weights_j[p.role] = p.weight_bytes_per_rank;
  }
  j["pools"] = pools_j;
  j["weight_bytes_per_rank"] = weights_j;
  j["workload"] = {{"input_len", spec.workload.input_len},   {"output_len", spec.workload.output_len},
                   {"range_ratio", spec.workload.range_ratio}, {"rate_rps", spec.workload.rate_rps},
                   {"simulated_requests", spec.workload.num_requests}};
  j["slo"] = {{"ttft_s", spec.slo.ttft_s}, {"tpot_s", spec.slo.tpot_s}, {"attainment", spec.slo.attainment}};
  j["ttft_p50_s"] = sim.ttft.p50;
  j["ttft_p90_s"] = sim.ttft.p90;
  j["ttft_p99_s"] = sim.ttft.p99;
  j["tpot_p50_s"] = sim.tpot.p50;
  j["tpot_p90_s"] = sim.tpot.p90;
  j["tpot_p99_s"] = sim.tpot.p99;
  j["ttft_s"] = Pct(sim.ttft);
  j["tpot_s"] = Pct(sim.tpot);
  j["queue_s"] = Pct(sim.queue);
  j["kv_transfer_tail_s"] = ttft_kv_tail_s;
  j["throughput_rps"] = sim.throughput_rps;
  j["output_tokens_per_s"] = sim.output_tokens_per_s;
  j["mean_decode_batch"] = sim.mean_decode_batch;
  j["busy"] = {{"prefill", sim.prefill_busy}, {"decode", sim.decode_busy}};
  j["slo_attainment"] = attainment;
  j["goodput_rps"] = goodput_rps;
  j["max_goodput_rps"] = max_goodput_rps;
  j["goodput_per_device_rps"] = goodput_per_device;
  nlohmann::json sw = nlohmann::json::array();
  for (const auto& s : sweep)
    sw.push_back({{"prefill_instances", s.prefill_instances}, {"decode_instances", s.decode_instances},
                  {"devices", s.devices}, {"max_goodput_rps", s.max_goodput_rps}});
  j["ratio_sweep"] = sw;
  if (best_found) {
    j["best_plan"] = {{"prefill_instances", best.prefill_instances},
                      {"decode_instances", best.decode_instances},
                      {"devices", best.devices},
                      {"max_goodput_rps", best.max_goodput_rps},
                      {"cost_per_hour", hardware.cost_per_device_hour * static_cast<double>(best.devices)}};
  } else {
    j["best_plan"] = nullptr;
  }
  j["notes"] = notes;
  return j;
}

std::string PlanReport::ToMarkdown() const {
  const model::ModelConfig& c = shape.config;
  std::ostringstream md;
  md << "# pdserve plan: " << model_name << " on " << hardware.name << "\n\n";
  md << "Model: " << c.num_hidden_layers << " layers, hidden " << c.hidden_size << ", " << c.n_routed_experts
     << " routed experts (" << c.num_experts_per_tok << " per token), index top-k " << c.index_topk << "; "
     << Fmt("%.1f", shape.TotalParams() / 1e9) << "B parameters, " << Fmt("%.1f", shape.ActiveParams() / 1e9)
     << "B active. Weights " << WeightFormatName(shape.weights) << ", KV latent " << KvFormatName(shape.latent_format)
     << ", indexer keys " << KvFormatName(shape.index_format) << ".\n\n";
  md << "KV per token (all layers): **" << Fmt("%.0f", kv_bytes_per_token) << " B** = MLA "
     << Fmt("%.0f", mla_bytes_per_token) << " B + indexer keys " << Fmt("%.0f", indexer_bytes_per_token) << " B.\n\n";
  md << "Workload: " << spec.workload.input_len << " -> " << spec.workload.output_len << " tokens";
  if (spec.workload.range_ratio > 0) md << " (+-" << Fmt("%.0f", spec.workload.range_ratio * 100) << "%)";
  md << ", " << Fmt("%g", spec.workload.rate_rps) << " req/s (Poisson), " << spec.workload.num_requests
     << " simulated requests. SLO: TTFT <= " << Ms(spec.slo.ttft_s) << " ms, TPOT <= " << Ms(spec.slo.tpot_s)
     << " ms for " << Fmt("%.0f", spec.slo.attainment * 100) << "% of requests.\n\n";

  md << "## Pools and memory per rank\n\n"
     << "| pool | instances x plan | devices (nodes) | weights GiB | MLA cache GiB | indexer cache GiB | "
        "activations GiB | reserved GiB | headroom GiB | max decode batch / rank |\n"
     << "|---|---|---|---|---|---|---|---|---|---|\n";
  for (const auto& p : pools) {
    md << "| " << p.role << " | " << p.instances << " x " << PlanText(p.plan) << " | " << p.devices << " (" << p.nodes
       << ") | " << Gib(p.memory.weights) << " | " << Gib(p.memory.mla_cache) << " | " << Gib(p.memory.indexer_cache)
       << " | " << Gib(p.memory.activations) << " | " << Gib(p.memory.reserved) << " | " << Gib(p.memory.Headroom())
       << " | " << (p.role == "prefill" ? std::string("-") : std::to_string(p.max_decode_batch_per_rank)) << " |\n";
  }
  md << "\nMemory at the predicted load (prefill: the prompt being computed; decode: the mean "
        "batch at mid-output context). Capacity "
     << Gib(hardware.memory_bytes) << " GiB per device.\n\n";

  md << "## Predicted latency\n\n| | p50 | p90 | p99 |\n|---|---|---|---|\n";
  md << "| TTFT ms | " << Ms(sim.ttft.p50) << " | " << Ms(sim.ttft.p90) << " | " << Ms(sim.ttft.p99) << " |\n";
  md << "| TPOT ms | " << Ms(sim.tpot.p50) << " | " << Ms(sim.tpot.p90) << " | " << Ms(sim.tpot.p99) << " |\n";
  md << "| queue ms | " << Ms(sim.queue.p50) << " | " << Ms(sim.queue.p90) << " | " << Ms(sim.queue.p99) << " |\n\n";
  auto parts = [&](const StepCost& s) {
    std::ostringstream o;
    o << "linear " << Ms(s.linear_s) << ", experts " << Ms(s.experts_s) << ", attention " << Ms(s.attention_s)
      << ", indexer " << Ms(s.indexer_s) << ", lm_head " << Ms(s.lm_head_s);
    if (s.ep_comm_s > 0) o << ", EP all-to-all " << Ms(s.ep_comm_s);
    if (s.tp_comm_s > 0) o << ", TP reductions " << Ms(s.tp_comm_s);
    if (s.cp_comm_s > 0) o << ", CP exchange " << Ms(s.cp_comm_s);
    if (s.dp_sync_s > 0) o << ", DP vote " << Ms(s.dp_sync_s);
    o << ", overhead " << Ms(s.overhead_s) << " (ms)";
    return o.str();
  };
  for (const auto& p : pools) {
    if (p.role == "prefill") {
      md << "- One " << spec.workload.input_len << "-token prompt alone on a prefill instance: **" << Ms(p.step.total_s)
         << " ms** = " << parts(p.step) << "; then the KV transfer tail " << Ms(ttft_kv_tail_s)
         << " ms and " << Ms(hardware.request_overhead_s + hardware.pd_overhead_s + hardware.token_delivery_s)
         << " ms of router / control path.\n";
    } else {
      md << "- One " << p.role << " step at the mean batch (" << Fmt("%.1f", sim.mean_decode_batch)
         << " rows per instance step): **" << Ms(p.step.total_s) << " ms** = " << parts(p.step) << ".\n";
      md << "- At the largest batch memory allows (" << std::min(p.max_decode_batch_per_rank, spec.limits.max_num_seqs)
         << " rows per DP unit, mid-output context): **" << Ms(p.step_at_max_batch.total_s) << " ms** per token = "
         << parts(p.step_at_max_batch) << ".\n";
    }
  }
  md << "\n## Throughput and goodput\n\n"
     << "At " << Fmt("%g", spec.workload.rate_rps) << " req/s: " << Fmt("%.2f", sim.throughput_rps) << " req/s, "
     << Fmt("%.0f", sim.output_tokens_per_s) << " output tok/s, SLO attainment " << Fmt("%.1f", attainment * 100)
     << "%, goodput " << Fmt("%.2f", goodput_rps) << " req/s (busy: prefill " << Fmt("%.0f", sim.prefill_busy * 100)
     << "%, decode " << Fmt("%.0f", sim.decode_busy * 100) << "%).\n"
     << "Max goodput (largest rate with >= " << Fmt("%.0f", spec.slo.attainment * 100)
     << "% within the SLO): **" << Fmt("%.3g", max_goodput_rps) << " req/s**, "
     << Fmt("%.3g", goodput_per_device) << " req/s per device.\n\n";
  if (!sweep.empty()) {
    md << "## Goodput vs prefill:decode split\n\n| P:D instances | devices | max goodput req/s | per device |\n"
          "|---|---|---|---|\n";
    for (const auto& s : sweep)
      md << "| " << s.prefill_instances << ":" << s.decode_instances << " | " << s.devices << " | "
         << Fmt("%.3g", s.max_goodput_rps) << " | " << Fmt("%.3g", s.devices ? s.max_goodput_rps / s.devices : 0) << " |\n";
    md << "\n";
  }
  if (!spec.colocated) {
    if (best_found) {
      md << "**Best plan for " << Fmt("%g", spec.workload.rate_rps) << " req/s within the SLO:** " << best.prefill_instances
         << " prefill + " << best.decode_instances << " decode instances (" << best.devices << " devices";
      if (hardware.cost_per_device_hour > 0)
        md << ", " << Fmt("%.2f", hardware.cost_per_device_hour * static_cast<double>(best.devices)) << " per hour";
      md << "), max goodput " << Fmt("%.3g", best.max_goodput_rps) << " req/s.\n\n";
    } else if (spec.search) {
      md << "**No split searched carries " << Fmt("%g", spec.workload.rate_rps) << " req/s within the SLO.**\n\n";
    }
  }
  for (const auto& n : notes) md << "Note: " << n << "\n\n";
  md << "Profile `" << hardware.name << "`: " << hardware.description << "\n";
  return md.str();
}

}  // namespace pdserve::planner
