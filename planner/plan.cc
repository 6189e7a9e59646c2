#include "planner/plan.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <functional>
#include <memory>

namespace pdserve::planner {

namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
// The indexer's fp32 scores are bounded by a tile of keys per row (a fused kernel never holds a
// whole 128K row; pdserve's CPU engine scores up to a step's keys).
constexpr double kScoreTileKeys = 16384;

int64_t MaxLen(int64_t len, double range) {
  return std::max<int64_t>(1, static_cast<int64_t>(std::llround(static_cast<double>(len) * (1 + range))));
}

// fp32 activations a row keeps alive inside one layer (hidden + residual, q, q_lora, latent,
// absorbed queries, attention output, indexer queries, expert intermediates, router logits).
double ActivationBytesPerRow(const model::ModelConfig& c, int64_t tp) {
  const double H = static_cast<double>((c.num_attention_heads + tp - 1) / tp);
  const double per = 2.0 * c.hidden_size + H * (c.qk_nope_head_dim + c.qk_rope_head_dim) + c.q_lora_rank +
                     c.kv_lora_rank + c.qk_rope_head_dim + H * c.kv_lora_rank + H * c.v_head_dim +
                     static_cast<double>(c.index_n_heads) * (c.index_head_dim + 1) +
                     2.0 * c.num_experts_per_tok * c.moe_intermediate_size + c.n_routed_experts;
  return 4.0 * per;
}

struct Pool {
  PoolReport report;
  std::unique_ptr<StepCostModel> cost;
  int64_t kv_capacity_tokens = 0;  // per rank / DP unit
};

std::string PlanText(const comm::ParallelPlan& p) {
  return "cp=" + std::to_string(p.cp) + ",dp=" + std::to_string(p.dp) + ",ep=" + std::to_string(p.ep) +
         ",tp=" + std::to_string(p.tp);
}

}  // namespace

nlohmann::json RankMemory::ToJson() const {
  return {{"capacity_bytes", capacity},       {"weights_bytes", weights},
          {"mla_cache_bytes", mla_cache},     {"indexer_cache_bytes", indexer_cache},
          {"activations_bytes", activations}, {"reserved_bytes", reserved},
          {"headroom_bytes", Headroom()}};
}

nlohmann::json PoolReport::ToJson() const {
  return {{"role", role},
          {"instances", instances},
          {"plan", PlanText(plan)},
          {"ranks_per_instance", ranks_per_instance},
          {"devices", devices},
          {"nodes", nodes},
          {"weight_bytes_per_rank", weight_bytes_per_rank},
          {"memory_per_rank", memory.ToJson()},
          {"max_decode_batch_per_rank", max_decode_batch_per_rank},
          {"kv_capacity_tokens_per_rank", kv_capacity_tokens_per_rank},
          {"step", step.ToJson()}};
}

Result<model::ModelConfig> LoadModelConfig(const std::string& path) {
  std::error_code ec;
  std::string file = path;
  if (std::filesystem::is_directory(path, ec)) file = (std::filesystem::path(path) / "config.json").string();
  if (!std::filesystem::is_regular_file(file, ec))
    return Status::NotFound("no model config (a config.json or a directory holding one)", path);
  return model::ModelConfig::Load(file);
}

namespace {

class Planner {
 public:
  explicit Planner(const PlanSpec& spec) : spec_(spec) {}

  Result<PlanReport> Run() {
    PDSERVE_RETURN_IF_ERROR(CheckSpec());
    PDSERVE_ASSIGN_OR_RETURN(model::ModelConfig config, LoadModelConfig(spec_.model));
    PDSERVE_ASSIGN_OR_RETURN(hw_, HardwareProfile::Load(spec_.hardware));
    std::string wname = spec_.weights;
    if (wname.empty()) wname = config.weight_format == "w8a8_int8" ? "w8a8" : config.weight_format;
    PDSERVE_ASSIGN_OR_RETURN(WeightFormat wf, ParseWeightFormat(wname));
    PDSERVE_ASSIGN_OR_RETURN(KvFormat latent, ParseKvFormat(spec_.kv_format));
    std::string iname = spec_.index_format;
    if (iname.empty()) iname = latent == KvFormat::kInt8 ? "int8" : "fp8";
    PDSERVE_ASSIGN_OR_RETURN(KvFormat index, ParseIndexKeyFormat(iname));
    if (wf == WeightFormat::kW8a8 && !hw_.HasMath(MathType::kInt8))
      return Status::InvalidArgument("weights w8a8 need an int8 matmul rate in hardware profile '" + hw_.name +
                                     "' (device.matmul_tflops.int8)");
    PDSERVE_ASSIGN_OR_RETURN(shape_, ModelShape::Create(config, wf, latent, index, hw_.HasMath(MathType::kFp8)));
    report_.shape = shape_;
    report_.hardware = hw_;
    report_.spec = spec_;
    report_.model_name = std::filesystem::path(spec_.model).filename().string();
    if (shape_.fp8_dequantized)
      report_.notes.push_back("profile '" + hw_.name + "' has no fp8 matmul rate: FP8 weights are counted as BF16 "
                              "(dequantized at load, as pdserve's CPU loader does)");
    if (index == KvFormat::kBf16)
      report_.notes.push_back("indexer keys in bf16 (256 B per token and layer) is the reference's BF16 cache; "
                              "pdserve's engine stores fp8 or int8 keys (132 B)");
    report_.kv_bytes_per_token = static_cast<double>(shape_.KvBytesPerToken());
    report_.mla_bytes_per_token = static_cast<double>(shape_.MlaBytesPerToken());
    report_.indexer_bytes_per_token = static_cast<double>(shape_.IndexerBytesPerToken());

    if (spec_.colocated) {
      PDSERVE_ASSIGN_OR_RETURN(colo_, MakePool("colocated", spec_.colocated_plan_set, spec_.colocated_plan,
                                               spec_.colocated_instances, spec_.colocated_nodes));
    } else {
      PDSERVE_ASSIGN_OR_RETURN(prefill_, MakePool("prefill", spec_.prefill_plan_set, spec_.prefill_plan,
                                                  spec_.prefill_instances, spec_.prefill_nodes));
      PDSERVE_ASSIGN_OR_RETURN(decode_, MakePool("decode", spec_.decode_plan_set, spec_.decode_plan,
                                                 spec_.decode_instances, spec_.decode_nodes));
    }
    const Workload& w = spec_.workload;
    report_.sim = Simulate(w, PoolInstances());
    if (report_.sim.completed == 0) return Status::Internal("the simulation completed no request");
    report_.attainment = report_.sim.Attainment(spec_.slo.ttft_s, spec_.slo.tpot_s);
    {
      // Queues that grow through the run: the rate exceeds what the pools carry.
      const auto& t = report_.sim.ttft_s;
      const size_t n = t.size();
      double early = 0, late = 0;
      for (size_t i = 0; i < n / 2; ++i) early += t[i];
      for (size_t i = n - n / 4; i < n; ++i) late += t[i];
      if (n >= 8 && late / static_cast<double>(n / 4) > 2.0 * early / static_cast<double>(n / 2) + 0.05)
        report_.notes.push_back("TTFT grows through the simulated run (the last quarter's mean is more than twice "
                                "the first half's): the offered rate is beyond what these pools carry");
    }
    report_.goodput_rps = report_.sim.Goodput(spec_.slo.ttft_s, spec_.slo.tpot_s);
    FillPoolSteps();
    report_.max_goodput_rps = MaxGoodput(PoolInstances());
    const double devices = static_cast<double>(TotalDevices(PoolInstances()));
    report_.goodput_per_device = devices > 0 ? report_.max_goodput_rps / devices : 0;
    if (!spec_.colocated && spec_.search) Search();
    report_.pools.clear();
    if (spec_.colocated) {
      report_.pools.push_back(colo_.report);
    } else {
      report_.pools.push_back(prefill_.report);
      report_.pools.push_back(decode_.report);
    }
    return std::move(report_);
  }

 private:
  Status CheckSpec() const {
    const Workload& w = spec_.workload;
    if (spec_.model.empty()) return Status::InvalidArgument("missing --model (a config.json or a model directory)");
    if (w.input_len < 1) return Status::InvalidArgument("input length must be >= 1, got " + std::to_string(w.input_len));
    if (w.output_len < 1) return Status::InvalidArgument("output length must be >= 1, got " + std::to_string(w.output_len));
    if (!(w.range_ratio >= 0 && w.range_ratio < 1))
      return Status::InvalidArgument("range ratio must be in [0, 1), got " + std::to_string(w.range_ratio));
    if (!(w.rate_rps > 0)) return Status::InvalidArgument("request rate must be > 0 (req/s), got " + std::to_string(w.rate_rps));
    if (w.num_requests < 10 || w.num_requests > 1000000)
      return Status::InvalidArgument("simulated requests must be in [10, 1e6], got " + std::to_string(w.num_requests));
    if (w.warmup < 0 || w.warmup >= w.num_requests) return Status::InvalidArgument("warm-up must be in [0, requests)");
    if (!(spec_.slo.ttft_s > 0) || !(spec_.slo.tpot_s > 0))
      return Status::InvalidArgument("SLO TTFT and TPOT must be > 0");
    if (!(spec_.slo.attainment > 0 && spec_.slo.attainment <= 1))
      return Status::InvalidArgument("SLO attainment must be in (0, 1]");
    const SchedulerLimits& l = spec_.limits;
    if (l.max_num_seqs < 1 || l.max_step_tokens < 1 || l.prefill_chunk < 1 || l.prefill_chunk > l.max_step_tokens)
      return Status::InvalidArgument("engine limits need max_num_seqs, max_step_tokens >= 1 and 1 <= prefill_chunk <= "
                                     "max_step_tokens");
    for (int64_t v : {spec_.prefill_nodes, spec_.decode_nodes, spec_.colocated_nodes, spec_.prefill_instances,
                      spec_.decode_instances, spec_.colocated_instances, spec_.search_instances})
      if (v < 0 || v > 100000) return Status::InvalidArgument("pool sizes must be in [0, 100000]");
    return Status::Ok();
  }

  Result<Pool> MakePool(const std::string& role, bool plan_set, comm::ParallelPlan plan, int64_t instances,
                        int64_t nodes) {
    const model::ModelConfig& c = shape_.config;
    const int64_t dpn = hw_.devices_per_node;
    if (!plan_set) {
      plan = comm::ParallelPlan{};
      if (role == "prefill") {
        plan.cp = static_cast<int>(dpn);
      } else {
        plan.dp = static_cast<int>(dpn);
      }
      plan.ep = static_cast<int>(dpn);
      // EP must divide the experts: fall back to the largest divisor of both.
      while (c.n_routed_experts > 0 && c.n_routed_experts % plan.ep != 0) --plan.ep;
      while (dpn % plan.ep != 0) --plan.ep;
    }
    const int64_t world = plan.attention_ranks();
    comm::PlanModelDims dims{c.n_routed_experts, c.num_attention_heads, c.vocab_size};
    PDSERVE_RETURN_IF_ERROR(plan.Validate(static_cast<int>(world), dims).WithContext(role + " plan"));
    if (shape_.weights == WeightFormat::kW8a8 && plan.tp > 1)
      return Status::InvalidArgument(role + " plan: W8A8 weights need tp=1 (a W8A8 o_proj cannot be column-sharded, "
                                     "docs/parallel.md)");
    if (instances == 0) {
      const int64_t n = std::max<int64_t>(1, nodes);
      if ((n * dpn) % world != 0)
        return Status::InvalidArgument(role + ": " + std::to_string(n) + " node(s) of " + std::to_string(dpn) +
                                       " devices do not hold whole instances of " + std::to_string(world) +
                                       " ranks (plan " + PlanText(plan) + "); give --" + role + "-instances");
      instances = n * dpn / world;
    }
    Pool pool;
    PoolReport& r = pool.report;
    r.role = role;
    r.plan = plan;
    r.instances = instances;
    r.ranks_per_instance = world;
    r.devices = instances * world;
    r.nodes = (r.devices + dpn - 1) / dpn;
    r.weight_bytes_per_rank = shape_.WeightBytesPerRank(plan.tp, plan.ep);
    pool.cost = std::make_unique<StepCostModel>(shape_, hw_, plan);

    // Memory of one rank.
    const Workload& w = spec_.workload;
    const int64_t in_max = MaxLen(w.input_len, w.range_ratio), out_max = MaxLen(w.output_len, w.range_ratio);
    RankMemory& m = r.memory;
    m.capacity = hw_.memory_bytes;
    m.weights = r.weight_bytes_per_rank;
    m.reserved = hw_.memory_reserved_bytes;
    const double act_row = ActivationBytesPerRow(c, plan.tp);
    const double kv_tok = static_cast<double>(shape_.KvBytesPerToken());
    const double fixed = m.weights + m.reserved;
    if (fixed >= m.capacity)
      return Status::ResourceExhausted(
          role + " rank needs " + Gib(fixed) + " GiB for weights + runtime but has " + Gib(m.capacity) +
          " GiB (plan " + PlanText(plan) + "): split the experts over more ranks (ep) or quantize (--weights w8a8)");
    const int64_t seq_tokens = in_max + (role == "prefill" ? 0 : out_max);
    if (role == "prefill") {
      // The prompt being computed: every CP rank holds its whole KV; a chunked prefill holds the
      // prompts of a step. (With layer streaming a prompt's blocks are released a transfer tail
      // after its forward, so the next prompt's KV does not pile on top.)
      const int64_t rows = plan.cp > 1 ? (in_max + plan.cp - 1) / plan.cp : std::min(in_max, spec_.limits.max_step_tokens);
      const double tokens = static_cast<double>(plan.cp > 1 ? in_max : std::max(in_max, spec_.limits.max_step_tokens));
      m.mla_cache = tokens * static_cast<double>(shape_.MlaBytesPerToken());
      m.indexer_cache = tokens * static_cast<double>(shape_.IndexerBytesPerToken());
      m.activations = static_cast<double>(rows) * (act_row + std::min<double>(static_cast<double>(in_max), kScoreTileKeys) * 4.0);
      pool.kv_capacity_tokens = static_cast<int64_t>((m.capacity - fixed - m.activations) / kv_tok);
      if (m.Headroom() < 0)
        return Status::ResourceExhausted(role + " rank: a " + std::to_string(in_max) + "-token prompt needs " +
                                         Gib(m.mla_cache + m.indexer_cache + m.activations) + " GiB of KV and activations "
                                         "beside " + Gib(fixed) + " GiB of weights + runtime, over the " +
                                         Gib(m.capacity) + " GiB of a rank (plan " + PlanText(plan) + "): use more CP ranks");
    } else {
      // Rows of a full step on this rank; the rest holds KV.
      const double act = static_cast<double>(std::min(spec_.limits.max_step_tokens, spec_.limits.max_num_seqs)) * act_row;
      const double free = m.capacity - fixed - act;
      pool.kv_capacity_tokens = free > 0 ? static_cast<int64_t>(free / kv_tok) : 0;
      r.max_decode_batch_per_rank = pool.kv_capacity_tokens / seq_tokens;
      if (r.max_decode_batch_per_rank < 1)
        return Status::ResourceExhausted(role + " rank: one request of " + std::to_string(seq_tokens) + " tokens needs " +
                                         Gib(static_cast<double>(seq_tokens) * kv_tok) + " GiB of KV but only " +
                                         Gib(std::max(0.0, free)) + " GiB are left after " + Gib(fixed) +
                                         " GiB of weights + runtime (plan " + PlanText(plan) + ")");
      m.activations = act;
    }
    r.kv_capacity_tokens_per_rank = pool.kv_capacity_tokens;
    return pool;
  }

  static std::string Gib(double bytes) {
    char b[32];
    std::snprintf(b, sizeof(b), "%.2f", bytes / kGiB);
    return b;
  }

  struct Counts {
    int64_t p = 0, d = 0, c = 0;
  };
  Counts PoolInstances() const {
    if (spec_.colocated) return {0, 0, colo_.report.instances};
    return {prefill_.report.instances, decode_.report.instances, 0};
  }
  int64_t TotalDevices(const Counts& n) const {
    if (spec_.colocated) return n.c * colo_.report.ranks_per_instance;
    return n.p * prefill_.report.ranks_per_instance + n.d * decode_.report.ranks_per_instance;
  }

  SimResult Simulate(const Workload& w, const Counts& n) const {
    ClusterSpec cs;
    cs.colocated = spec_.colocated;
    cs.limits = spec_.limits;
    if (spec_.colocated) {
      cs.colocated_pool = {n.c, colo_.report.plan, colo_.kv_capacity_tokens};
      return SimulateCluster(cs, w, nullptr, nullptr, colo_.cost.get(), hw_, shape_);
    }
    cs.prefill = {n.p, prefill_.report.plan, 0};
    cs.decode = {n.d, decode_.report.plan, decode_.kv_capacity_tokens};
    return SimulateCluster(cs, w, prefill_.cost.get(), decode_.cost.get(), nullptr, hw_, shape_);
  }

  // The step costs shown in the report: one prompt alone on a prefill instance, one decode step
  // at the simulated mean batch; the decode rank's KV at that batch.
  void FillPoolSteps() {
    const Workload& w = spec_.workload;
    const int64_t ctx = w.input_len + w.output_len / 2;
    auto decode_side = [&](Pool& pool) {
      // sim.mean_decode_batch is rows per instance step; its DP units share them.
      const int64_t dp = std::max<int64_t>(1, pool.report.plan.dp);
      const double rows = std::max(1.0, report_.sim.mean_decode_batch / static_cast<double>(pool.report.instances));
      const int64_t batch = std::max<int64_t>(1, std::llround(rows / static_cast<double>(dp)));
      pool.report.step = pool.cost->Unit(std::vector<StepItem>(static_cast<size_t>(batch), StepItem{1, ctx - 1, true}),
                                         std::max<int64_t>(batch, std::llround(rows)));
      pool.report.step_at_max_batch = pool.cost->Decode(
          std::max<int64_t>(1, std::min(pool.report.max_decode_batch_per_rank, spec_.limits.max_num_seqs)), ctx);
      pool.report.memory.mla_cache = static_cast<double>(batch) * static_cast<double>(ctx) * static_cast<double>(shape_.MlaBytesPerToken());
      pool.report.memory.indexer_cache = static_cast<double>(batch) * static_cast<double>(ctx) * static_cast<double>(shape_.IndexerBytesPerToken());
    };
    if (spec_.colocated) {
      decode_side(colo_);
      return;
    }
    prefill_.report.step = prefill_.cost->Prompt(w.input_len);
    if (prefill_.report.plan.cp == 1 && w.input_len > spec_.limits.prefill_chunk) {
      // Chunked: the chunks of one prompt in turn.
      StepCost sum;
      for (int64_t s = 0; s < w.input_len; s += spec_.limits.prefill_chunk) {
        const int64_t n = std::min(spec_.limits.prefill_chunk, w.input_len - s);
        sum += prefill_.cost->Unit({StepItem{n, s, s + n == w.input_len}}, n);
      }
      prefill_.report.step = sum;
    }
    const double bytes = static_cast<double>(w.input_len) * report_.kv_bytes_per_token;
    const double bw = hw_.kv_transfer.bandwidth_bps;
    const double overlap = prefill_.report.step.total_s * static_cast<double>(shape_.layers() - 1) / static_cast<double>(shape_.layers());
    report_.ttft_kv_tail_s = hw_.kv_transfer.latency_s + std::max(bytes / static_cast<double>(shape_.layers()) / bw, bytes / bw - overlap);
    decode_side(decode_);
  }

  // The largest rate whose simulated SLO attainment reaches the target (DistServe's goodput).
  double MaxGoodput(const Counts& n) const {
    Workload w = spec_.workload;
    w.num_requests = std::min<int64_t>(w.num_requests, 300);
    w.warmup = std::min<int64_t>(w.warmup, w.num_requests / 10);
    auto ok = [&](double rate) {
      w.rate_rps = rate;
      return Simulate(w, n).Attainment(spec_.slo.ttft_s, spec_.slo.tpot_s) >= spec_.slo.attainment;
    };
    // A capacity guess: prompts/s of the prefill side vs requests/s the decode side carries.
    double guess = spec_.workload.rate_rps;
    if (!ok(guess * 1e-3)) return 0;  // the SLO is missed even without load
    double lo = guess * 1e-3, hi = guess;
    for (int i = 0; i < 20 && ok(hi); ++i) {
      lo = hi;
      hi *= 2;
    }
    for (int i = 0; i < 14 && hi / lo > 1.02; ++i) {
      const double mid = std::sqrt(lo * hi);
      (ok(mid) ? lo : hi) = mid;
    }
    return lo;
  }

  // Goodput against the P:D split, and the cheapest split carrying the workload's rate.
  void Search() {
    const int64_t given = prefill_.report.instances + decode_.report.instances;
    const int64_t total = spec_.search_instances > 0 ? spec_.search_instances : std::max<int64_t>(4, given);
    for (int64_t p = 1; p < total; ++p) {
      SweepPoint sp;
      sp.prefill_instances = p;
      sp.decode_instances = total - p;
      const Counts n{p, total - p, 0};
      sp.devices = TotalDevices(n);
      sp.max_goodput_rps = MaxGoodput(n);
      report_.sweep.push_back(sp);
    }
    Workload w = spec_.workload;
    w.num_requests = std::min<int64_t>(w.num_requests, 300);
    w.warmup = std::min<int64_t>(w.warmup, w.num_requests / 10);
    for (int64_t p = 1; p < total; ++p)
      for (int64_t d = 1; p + d <= total; ++d) {
        const Counts n{p, d, 0};
        const int64_t devices = TotalDevices(n);
        // Cheapest first; among equals the first found (fewer prefill instances).
        if (report_.best_found && devices >= report_.best.devices) continue;
        if (Simulate(w, n).Attainment(spec_.slo.ttft_s, spec_.slo.tpot_s) < spec_.slo.attainment) continue;
        report_.best = SweepPoint{p, d, devices, 0, true, ""};
        report_.best_found = true;
      }
    if (report_.best_found)
      report_.best.max_goodput_rps = MaxGoodput(Counts{report_.best.prefill_instances, report_.best.decode_instances, 0});
  }

  const PlanSpec& spec_;
  HardwareProfile hw_;
  ModelShape shape_;
  Pool prefill_, decode_, colo_;
  PlanReport report_;
};

}  // namespace

Result<PlanReport> MakePlan(const PlanSpec& spec) { return Planner(spec).Run(); }

}  // namespace pdserve::planner
