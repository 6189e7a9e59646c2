#include "planner/step_cost.h"

#include <algorithm>
#include <cmath>

namespace pdserve::planner {

namespace {

// Sum over positions p in [s, s + n) of min(p + 1, K): the keys each row's sparse attention
// reads.
double SumSelected(int64_t s, int64_t n, int64_t K) {
  const double a = static_cast<double>(s) + 1, b = static_cast<double>(s + n);  // p + 1 in [a, b]
  const double k = static_cast<double>(K);
  if (b <= k) return (a + b) * (b - a + 1) / 2;
  if (a > k) return k * static_cast<double>(n);
  return (a + k) * (k - a + 1) / 2 + k * (b - k);
}

// Sum over positions p in [s, s + n) of (p + 1): the keys each row's indexer scores.
double SumKeys(int64_t s, int64_t n) {
  const double a = static_cast<double>(s) + 1, b = static_cast<double>(s + n);
  return (a + b) * static_cast<double>(n) / 2;
}

}  // namespace

StepCost& StepCost::operator+=(const StepCost& o) {
  linear_s += o.linear_s;
  experts_s += o.experts_s;
  attention_s += o.attention_s;
  indexer_s += o.indexer_s;
  lm_head_s += o.lm_head_s;
  ep_comm_s += o.ep_comm_s;
  tp_comm_s += o.tp_comm_s;
  cp_comm_s += o.cp_comm_s;
  dp_sync_s += o.dp_sync_s;
  overhead_s += o.overhead_s;
  Finish();
  return *this;
}

nlohmann::json StepCost::ToJson() const {
  return {{"total_s", total_s},         {"linear_s", linear_s},       {"experts_s", experts_s},
          {"attention_s", attention_s}, {"indexer_s", indexer_s},     {"lm_head_s", lm_head_s},
          {"ep_comm_s", ep_comm_s},     {"tp_comm_s", tp_comm_s},     {"cp_comm_s", cp_comm_s},
          {"dp_sync_s", dp_sync_s},     {"overhead_s", overhead_s}};
}

StepCostModel::StepCostModel(const ModelShape& shape, const HardwareProfile& hw, const comm::ParallelPlan& plan)
    : shape_(shape), hw_(hw), plan_(plan) {}

double StepCostModel::Gemm(const MatrixSpec& m, int64_t rows, int64_t n_out) const {
  if (rows <= 0) return 0;
  const double flops = 2.0 * static_cast<double>(rows) * static_cast<double>(n_out) * static_cast<double>(m.n_in);
  const double bytes = static_cast<double>(n_out) * static_cast<double>(m.n_in) * m.bytes_per_param;
  const MathType t = hw_.HasMath(m.math) ? m.math : MathType::kBf16;
  return std::max(flops / hw_.GemmFlops(t, rows), bytes / hw_.memory_bandwidth_bps);
}

// A ring collective over `group` ranks moving `bytes_per_rank` per rank in `steps` latency-bound
// rounds.
double StepCostModel::Collective(int64_t group, double bytes_per_rank, int64_t steps) const {
  if (group <= 1) return 0;
  const LinkSpec& link = hw_.LinkFor(group);
  return static_cast<double>(steps) * link.latency_s + bytes_per_rank / link.bandwidth_bps;
}

StepCost StepCostModel::Unit(const std::vector<StepItem>& items, int64_t instance_rows) const {
  const model::ModelConfig& c = shape_.config;
  const int64_t cp = plan_.cp, tp = plan_.tp, ep = plan_.ep;
  const int64_t L = c.num_hidden_layers, D = c.hidden_size, K = c.index_topk;
  const int64_t H = (c.num_attention_heads + tp - 1) / tp;  // heads on this rank
  const int64_t Lkv = c.kv_lora_rank, dn = c.qk_nope_head_dim, dr = c.qk_rope_head_dim, dv = c.v_head_dim;
  const int64_t IH = c.index_n_heads, ID = c.index_head_dim;
  StepCost out;
  int64_t rows = 0, sampled = 0;
  for (const auto& it : items) {
    rows += it.n_rows;
    sampled += it.samples ? 1 : 0;
  }
  if (rows == 0) return Dummy(instance_rows);
  // Rows this rank computes: CP splits a prompt's rows over the CP ranks.
  const int64_t m = (rows + cp - 1) / cp;

  // The weight passes of the projections: every row in one pass, or (decode_row_group G > 0,
  // pdserve's CPU engine) the rows of chunks longer than G in one tiled pass and the others in
  // passes of at most G rows, each reading the weights again.
  std::vector<int64_t> passes;
  const int64_t G = hw_.decode_row_group;
  if (G > 0 && cp == 1) {
    int64_t tiled = 0;
    for (const auto& it : items)
      if (it.n_rows > G) tiled += it.n_rows;
    if (tiled > 0) passes.push_back(tiled);
    for (int64_t rest = rows - tiled; rest > 0; rest -= G) passes.push_back(std::min(G, rest));
  } else {
    passes.push_back(m);
  }
  auto gemm_passes = [&](const MatrixSpec& w, int64_t n_out, int64_t div) {
    double t = 0;
    for (int64_t p : passes) t += Gemm(w, (p + div - 1) / div, n_out);
    return t;
  };
  // Projections of every layer (split by heads over TP), dense FFN layers, router + shared
  // experts of MoE layers (a TP unit's replicas split the rows they dispatch).
  for (const auto& w : shape_.attention) {
    const int64_t n_out = w.split == Split::kHeads ? (w.n_out + tp - 1) / tp : w.n_out;
    out.linear_s += gemm_passes(w, n_out, 1) * static_cast<double>(L);
  }
  for (const auto& w : shape_.dense_ffn) out.linear_s += gemm_passes(w, w.n_out, 1) * static_cast<double>(shape_.n_dense_layers);
  const int64_t m_disp = (m + tp - 1) / tp;
  for (const auto& w : shape_.shared_ffn)
    out.linear_s += gemm_passes(w, w.n_out, tp) * static_cast<double>(shape_.n_moe_layers);

  // Routed experts: T tokens over the instance pick k of E experts each; this rank holds E/ep.
  if (shape_.n_moe_layers > 0 && instance_rows > 0) {
    const double E = static_cast<double>(c.n_routed_experts), k = static_cast<double>(c.num_experts_per_tok);
    const double T = static_cast<double>(instance_rows);
    const double local = E / static_cast<double>(ep);
    const double touched = local * (1.0 - std::pow(1.0 - k / E, T));
    const double routed_rows = T * k / static_cast<double>(ep);
    if (touched > 0) {
      const double per_expert = routed_rows / touched;
      const int64_t m_e = std::max<int64_t>(1, static_cast<int64_t>(std::llround(per_expert)));
      // Flops follow the real row count; the path (gemv vs tiled) follows the rounded one.
      const MatrixSpec& w = shape_.routed;
      const double flops = 2.0 * routed_rows * static_cast<double>(w.n_out) * static_cast<double>(w.n_in);
      const double bytes = touched * static_cast<double>(w.n_out) * static_cast<double>(w.n_in) * w.bytes_per_param;
      const MathType t = hw_.HasMath(w.math) ? w.math : MathType::kBf16;
      // Each touched expert is its own roofline; summed, the compute and memory sides add up.
      const double per = std::max(flops / touched / hw_.GemmFlops(t, m_e), bytes / touched / hw_.memory_bandwidth_bps);
      out.experts_s = per * touched * static_cast<double>(shape_.n_moe_layers);
    }
  }

  // Attention and indexer, per row, over the keys it reads (CP ranks share the work evenly).
  const double latent_bytes = static_cast<double>(shape_.LatentBytesPerTokenLayer());
  const double index_bytes = static_cast<double>(shape_.IndexBytesPerTokenLayer());
  // The absorption of queries through W_uk and of the output through W_uv (absorbed form), or
  // the expansion of a first chunk's keys through kv_b (expanded form), is the kv_b_proj GEMM
  // counted with the projections above: the same FLOPs (2 H (dn + dv) Lkv per row) and one read
  // of kv_b per pass. What is left is the attention over the selected keys.
  double attn_flops = 0, attn_bytes = 0, exp_flops = 0, idx_flops = 0, idx_bytes = 0, topk_keys = 0;
  for (const auto& it : items) {
    const double sel = SumSelected(it.start, it.n_rows, K);
    const double keys = SumKeys(it.start, it.n_rows);
    if (hw_.first_chunk_expanded && it.start == 0 && it.n_rows > 1) {
      // Scores over [k_nope, k_pe] and values of dv per selected key, per head.
      exp_flops += static_cast<double>(H) * sel * (2.0 * (dn + dr) + 2.0 * dv);
    } else {
      // Scores over the latent + k_pe, values over the latent, per head and selected key.
      attn_flops += static_cast<double>(H) * sel * (2.0 * (Lkv + dr) + 2.0 * Lkv);
      attn_bytes += sel * latent_bytes;
    }
    idx_flops += keys * 2.0 * static_cast<double>(IH) * static_cast<double>(ID);
    // A chunk's rows share its keys (read once); a decode row reads its own context.
    idx_bytes += static_cast<double>(it.start + it.n_rows) * index_bytes;
    topk_keys += keys;
  }
  const double dcp = static_cast<double>(cp), dL = static_cast<double>(L);
  out.attention_s = (std::max(attn_flops / dcp / hw_.attention_flops, attn_bytes / dcp / hw_.memory_bandwidth_bps) +
                     exp_flops / dcp / hw_.expanded_attention_flops) * dL;
  out.indexer_s = std::max(idx_flops / dcp / hw_.indexer_flops, idx_bytes / hw_.memory_bandwidth_bps) * dL;
  if (hw_.topk_keys_per_s > 0) out.indexer_s += topk_keys / dcp / hw_.topk_keys_per_s * dL;

  // lm_head for the rows that sample (vocabulary rows split over TP; pdserve's CPU engine runs
  // it in passes of at most G rows).
  const int64_t vocab = (shape_.lm_head.n_out + tp - 1) / tp;
  if (G > 0) {
    for (int64_t rest = sampled; rest > 0; rest -= G) out.lm_head_s += Gemm(shape_.lm_head, std::min(G, rest), vocab);
  } else {
    out.lm_head_s = Gemm(shape_.lm_head, sampled, vocab);
  }

  // Communication.
  const double act = static_cast<double>(hw_.act_bytes);
  if (ep > 1 && shape_.n_moe_layers > 0) {
    // Each dispatched row goes once to every rank holding one of its k experts: the remote ones
    // are (ep-1)/ep of ep * (1 - (1 - 1/ep)^k). Dispatch + combine, each with a count exchange.
    const double dests = static_cast<double>(ep) * (1.0 - std::pow(1.0 - 1.0 / ep, c.num_experts_per_tok)) *
                         (static_cast<double>(ep) - 1) / static_cast<double>(ep);
    const double bytes = static_cast<double>(m_disp) * static_cast<double>(D) * act * dests;
    out.ep_comm_s = 2.0 * Collective(ep, bytes, 2) * static_cast<double>(shape_.n_moe_layers);
  }
  if (tp > 1) {
    // o_proj partial sums (ring all-reduce), the embedding sum, the lm_head column gather.
    const double ar = 2.0 * (tp - 1) / static_cast<double>(tp) * static_cast<double>(m) * D * act;
    out.tp_comm_s = Collective(tp, ar, 2 * (tp - 1)) * (dL + 1) +
                    Collective(tp, static_cast<double>(sampled) * c.vocab_size * 4.0 * (tp - 1) / tp, tp - 1);
  }
  if (cp > 1) {
    // Every CP rank gathers the other ranks' KV records of each layer (latent, k_pe, index key);
    // with the expanded first chunk also their expanded keys.
    double bytes = static_cast<double>(rows) * (dcp - 1) / dcp * static_cast<double>(shape_.KvBytesPerTokenLayer());
    if (hw_.first_chunk_expanded)
      bytes += static_cast<double>(rows) * (dcp - 1) / dcp * static_cast<double>(c.num_attention_heads) * (dn + dv) * act;
    out.cp_comm_s = Collective(cp, bytes, cp - 1) * dL;
  }
  if (world() > 1) out.dp_sync_s = 2.0 * hw_.LinkFor(world()).latency_s;
  out.overhead_s = hw_.step_overhead_s + hw_.row_overhead_s * static_cast<double>(rows) +
                   hw_.row_layer_overhead_s * static_cast<double>(m) * dL;
  out.Finish();
  return out;
}

StepCost StepCostModel::Dummy(int64_t instance_rows) const {
  StepCost out;
  if (instance_rows <= 0) return out;
  // Experts this rank holds still run on the rows other units route to them.
  StepCost full = Unit({StepItem{1, 0, false}}, instance_rows);
  out.experts_s = full.experts_s;
  out.ep_comm_s = full.ep_comm_s;
  out.dp_sync_s = full.dp_sync_s;
  out.overhead_s = hw_.step_overhead_s;
  out.Finish();
  return out;
}

StepCost StepCostModel::Decode(int64_t batch, int64_t context) const {
  std::vector<StepItem> items(static_cast<size_t>(batch), StepItem{1, std::max<int64_t>(0, context - 1), true});
  return Unit(items, batch * plan_.dp);
}

}  // namespace pdserve::planner
