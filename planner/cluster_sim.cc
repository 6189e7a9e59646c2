#include "planner/cluster_sim.h"

#include <algorithm>
#include <cmath>
#include <deque>
#include <functional>
#include <limits>
#include <queue>
#include <random>

namespace pdserve::planner {

namespace {

enum class Role { kPrefill, kDecode, kColocated };

struct Req {
  double arrival = 0;
  int64_t prompt = 0, output = 0;
  int64_t computed = 0;   // prompt tokens in the cache
  int64_t generated = 0;  // tokens sampled so far
  double first_client = -1, last_client = -1, first_sched = -1, job_at = 0;
  int p_inst = -1, p_unit = -1, d_inst = -1, d_unit = -1;
};

struct Unit {
  std::deque<int> waiting;
  std::vector<int> running;
  int64_t outstanding = 0;  // router's view: prompt tokens (prefill) or tokens owed (colocated)
  int64_t assigned = 0;     // decode: tokens of requests placed on this unit (KV it will hold)
  int64_t held = 0;         // decode: tokens of admitted requests
};

struct Instance {
  Role role = Role::kPrefill;
  const StepCostModel* cost = nullptr;
  std::vector<Unit> units;
  bool busy = false;
  double busy_s = 0;
  double transfer_free = 0;  // prefill: when its transfer thread is free
  std::vector<std::vector<std::pair<int, int64_t>>> step;  // per unit: (request, rows) of the step
  double step_s = 0;
};

struct Event {
  double t;
  int64_t seq;
  int kind;  // 0 arrival, 1 job reaches a prefill/colocated unit, 2 step end, 3 KV committed on decode
  int a, b;
  bool operator>(const Event& o) const { return t != o.t ? t > o.t : seq > o.seq; }
};

int64_t UniformLen(std::mt19937_64& rng, int64_t len, double range) {
  const int64_t lo = std::max<int64_t>(1, std::llround(static_cast<double>(len) * (1 - range)));
  const int64_t hi = std::max(lo, static_cast<int64_t>(std::llround(static_cast<double>(len) * (1 + range))));
  return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
}

class Sim {
 public:
  Sim(const ClusterSpec& spec, const Workload& w, const StepCostModel* prefill, const StepCostModel* decode,
      const StepCostModel* colocated, const HardwareProfile& hw, const ModelShape& shape)
      : spec_(spec), w_(w), hw_(hw), shape_(shape) {
    auto add = [&](Role role, const PoolSpec& pool, const StepCostModel* cost) {
      for (int64_t i = 0; i < pool.instances; ++i) {
        Instance in;
        in.role = role;
        in.cost = cost;
        in.units.resize(static_cast<size_t>(std::max(1, pool.plan.dp)));
        in.step.resize(in.units.size());
        insts_.push_back(std::move(in));
        caps_.push_back(pool.kv_capacity_tokens);
      }
    };
    if (spec.colocated) {
      add(Role::kColocated, spec.colocated_pool, colocated);
    } else {
      add(Role::kPrefill, spec.prefill, prefill);
      add(Role::kDecode, spec.decode, decode);
    }
  }

  SimResult Run() {
    std::mt19937_64 rng(w_.seed);
    reqs_.resize(static_cast<size_t>(w_.num_requests));
    for (auto& r : reqs_) {
      r.prompt = UniformLen(rng, w_.input_len, w_.range_ratio);
      r.output = UniformLen(rng, w_.output_len, w_.range_ratio);
    }
    const std::vector<double> arrivals = PoissonArrivals(w_.num_requests, w_.rate_rps, w_.seed);
    for (size_t i = 0; i < reqs_.size(); ++i) {
      reqs_[i].arrival = arrivals[i];
      Push(reqs_[i].arrival, 0, static_cast<int>(i), 0);
    }
    while (!events_.empty()) {
      const Event e = events_.top();
      events_.pop();
      now_ = e.t;
      switch (e.kind) {
        case 0: Arrive(e.a); break;
        case 1: JobReachesUnit(e.a); break;
        case 2: StepEnd(e.a); break;
        case 3: Committed(e.a); break;
      }
    }
    return Collect();
  }

 private:
  void Push(double t, int kind, int a, int b) { events_.push(Event{t, seq_++, kind, a, b}); }

  std::pair<int, int> Pick(Role role, const std::function<int64_t(const Unit&)>& load) const {
    std::pair<int, int> best{-1, -1};
    int64_t best_load = std::numeric_limits<int64_t>::max();
    for (size_t i = 0; i < insts_.size(); ++i) {
      if (insts_[i].role != role) continue;
      for (size_t u = 0; u < insts_[i].units.size(); ++u) {
        const int64_t l = load(insts_[i].units[u]);
        if (l < best_load) {
          best_load = l;
          best = {static_cast<int>(i), static_cast<int>(u)};
        }
      }
    }
    return best;
  }

  void Arrive(int id) {
    Req& r = reqs_[static_cast<size_t>(id)];
    const double at = now_ + hw_.request_overhead_s;
    if (spec_.colocated) {
      auto [i, u] = Pick(Role::kColocated, [](const Unit& x) { return x.outstanding; });
      r.p_inst = i;
      r.p_unit = u;
      insts_[static_cast<size_t>(i)].units[static_cast<size_t>(u)].outstanding += r.prompt + r.output;
      r.job_at = at;
      Push(at, 1, id, 0);
      return;
    }
    auto [di, du] = Pick(Role::kDecode, [](const Unit& x) { return x.assigned; });
    r.d_inst = di;
    r.d_unit = du;
    insts_[static_cast<size_t>(di)].units[static_cast<size_t>(du)].assigned += r.prompt + r.output;
    auto [pi, pu] = Pick(Role::kPrefill, [](const Unit& x) { return x.outstanding; });
    r.p_inst = pi;
    r.p_unit = pu;
    insts_[static_cast<size_t>(pi)].units[static_cast<size_t>(pu)].outstanding += r.prompt;
    r.job_at = at + hw_.pd_overhead_s;
    Push(r.job_at, 1, id, 0);
  }

  void JobReachesUnit(int id) {
    Req& r = reqs_[static_cast<size_t>(id)];
    Instance& in = insts_[static_cast<size_t>(r.p_inst)];
    in.units[static_cast<size_t>(r.p_unit)].waiting.push_back(id);
    TryStart(r.p_inst);
  }

  void Committed(int id) {
    Req& r = reqs_[static_cast<size_t>(id)];
    if (r.generated >= r.output) {  // a one-token request ends at its first token
      insts_[static_cast<size_t>(r.d_inst)].units[static_cast<size_t>(r.d_unit)].assigned -= r.prompt + r.output;
      return;
    }
    insts_[static_cast<size_t>(r.d_inst)].units[static_cast<size_t>(r.d_unit)].waiting.push_back(id);
    TryStart(r.d_inst);
  }

  // The next prompt chunk of r on the grid [kC, (k+1)C) (a whole prompt when `whole`).
  int64_t NextChunk(const Req& r, bool whole) const {
    if (whole) return r.prompt - r.computed;
    const int64_t C = spec_.limits.prefill_chunk;
    const int64_t end = std::min(r.prompt, (r.computed / C + 1) * C);
    return end - r.computed;
  }

  // Builds unit u's batch for the next step (the engine's scheduler). Returns rows.
  int64_t Schedule(int idx, size_t u) {
    Instance& in = insts_[static_cast<size_t>(idx)];
    Unit& unit = in.units[u];
    auto& batch = in.step[u];
    batch.clear();
    const SchedulerLimits& lim = spec_.limits;
    const int64_t cap = caps_[static_cast<size_t>(idx)];
    int64_t budget = lim.max_step_tokens, rows = 0;
    if (in.role == Role::kDecode) {
      while (!unit.waiting.empty() && static_cast<int64_t>(unit.running.size()) < lim.max_num_seqs) {
        const Req& r = reqs_[static_cast<size_t>(unit.waiting.front())];
        if (cap > 0 && unit.held + r.prompt + r.output > cap && !unit.running.empty()) break;
        unit.held += r.prompt + r.output;
        unit.running.push_back(unit.waiting.front());
        unit.waiting.pop_front();
      }
      for (int id : unit.running) batch.emplace_back(id, 1);
      return static_cast<int64_t>(batch.size());
    }
    // A prefill instance with cp > 1 runs one whole prompt per step.
    const bool whole = in.role == Role::kPrefill && in.cost->plan().cp > 1;
    if (whole) {
      if (unit.running.empty() && !unit.waiting.empty()) {
        unit.running.push_back(unit.waiting.front());
        unit.waiting.pop_front();
      }
      for (int id : unit.running) {
        const int64_t n = NextChunk(reqs_[static_cast<size_t>(id)], true);
        batch.emplace_back(id, n);
        rows += n;
      }
      return rows;
    }
    for (int id : unit.running) {
      const Req& r = reqs_[static_cast<size_t>(id)];
      const int64_t n = r.computed < r.prompt ? NextChunk(r, false) : 1;
      if (n > budget) continue;
      batch.emplace_back(id, n);
      budget -= n;
      rows += n;
    }
    while (!unit.waiting.empty() && static_cast<int64_t>(unit.running.size()) < lim.max_num_seqs) {
      const int id = unit.waiting.front();
      const Req& r = reqs_[static_cast<size_t>(id)];
      if (in.role == Role::kColocated && cap > 0 && unit.held + r.prompt + r.output > cap && !unit.running.empty())
        break;
      const int64_t n = NextChunk(r, false);
      if (n > budget) break;
      unit.waiting.pop_front();
      unit.running.push_back(id);
      unit.held += r.prompt + r.output;
      batch.emplace_back(id, n);
      budget -= n;
      rows += n;
    }
    return rows;
  }

  void TryStart(int idx) {
    Instance& in = insts_[static_cast<size_t>(idx)];
    if (in.busy) return;
    int64_t instance_rows = 0;
    for (size_t u = 0; u < in.units.size(); ++u) instance_rows += Schedule(idx, u);
    if (instance_rows == 0) return;
    double step = 0;
    for (size_t u = 0; u < in.units.size(); ++u) {
      std::vector<StepItem> items;
      for (auto [id, n] : in.step[u]) {
        Req& r = reqs_[static_cast<size_t>(id)];
        if (r.first_sched < 0) r.first_sched = now_;
        if (r.computed < r.prompt) items.push_back(StepItem{n, r.computed, r.computed + n == r.prompt});
        else items.push_back(StepItem{1, r.prompt + r.generated - 1, true});
      }
      const StepCost c = items.empty() ? in.cost->Dummy(instance_rows) : in.cost->Unit(items, instance_rows);
      step = std::max(step, c.total_s);
    }
    in.busy = true;
    in.step_s = step;
    in.busy_s += step;
    if (in.role != Role::kPrefill) {
      // Decode rows only (a colocated step's prompt chunks are not part of the decode batch).
      int64_t decode_rows = 0;
      for (const auto& unit_batch : in.step)
        for (auto [id, n] : unit_batch)
          if (reqs_[static_cast<size_t>(id)].computed >= reqs_[static_cast<size_t>(id)].prompt) ++decode_rows;
      if (decode_rows > 0) {
        rows_sum_ += static_cast<double>(decode_rows);
        ++steps_;
      }
    }
    Push(now_ + step, 2, idx, 0);
  }

  void Token(Req& r, double client_t) {
    ++r.generated;
    if (r.first_client < 0) r.first_client = client_t;
    r.last_client = client_t;
  }

  void StepEnd(int idx) {
    Instance& in = insts_[static_cast<size_t>(idx)];
    in.busy = false;
    const double client = now_ + hw_.token_delivery_s;
    for (size_t u = 0; u < in.units.size(); ++u) {
      Unit& unit = in.units[u];
      std::vector<int> finished;
      for (auto [id, n] : in.step[u]) {
        Req& r = reqs_[static_cast<size_t>(id)];
        if (r.computed < r.prompt) {
          r.computed += n;
          if (in.role == Role::kPrefill) unit.outstanding -= n;
          if (in.role == Role::kColocated) unit.outstanding -= n;
          if (r.computed < r.prompt) continue;
          if (in.role == Role::kPrefill) {
            // First token sampled; the KV tail, then the decode unit commits it and the router
            // relays the token. The transfer thread finishes one transfer at a time.
            const double tail = KvTail(r.prompt, in.step_s);
            const double start = std::max(now_, in.transfer_free);
            in.transfer_free = start + tail;
            ++r.generated;
            r.first_client = r.last_client = in.transfer_free + hw_.token_delivery_s;
            finished.push_back(id);
            Push(in.transfer_free, 3, id, 0);
            continue;
          }
          Token(r, client);  // colocated: the prompt's last chunk samples the first token
          unit.outstanding -= 1;
        } else {
          Token(r, client);
          if (in.role == Role::kColocated) unit.outstanding -= 1;
        }
        if (r.generated >= r.output) finished.push_back(id);
      }
      for (int id : finished) {
        Req& r = reqs_[static_cast<size_t>(id)];
        unit.running.erase(std::find(unit.running.begin(), unit.running.end(), id));
        if (in.role != Role::kPrefill) unit.held -= r.prompt + r.output;
        if (in.role == Role::kColocated) unit.outstanding -= std::max<int64_t>(0, r.output - r.generated);
        if (in.role == Role::kDecode) unit.assigned -= r.prompt + r.output;
      }
    }
    TryStart(idx);
  }

  // What moving a prompt's KV adds after its forward: layer streaming overlaps all but the last
  // layer with the forward, unless the link is slower than the forward produces the layers.
  double KvTail(int64_t prompt, double forward_s) const {
    const double bytes = static_cast<double>(prompt) * static_cast<double>(shape_.KvBytesPerToken());
    const double layer = bytes / static_cast<double>(shape_.layers());
    const double bw = hw_.kv_transfer.bandwidth_bps;
    const double overlap = forward_s * static_cast<double>(shape_.layers() - 1) / static_cast<double>(shape_.layers());
    return hw_.kv_transfer.latency_s + std::max(layer / bw, bytes / bw - overlap);
  }

  SimResult Collect() const {
    SimResult res;
    double t0 = std::numeric_limits<double>::max(), t1 = 0;
    std::vector<double> queue;
    double out_tokens = 0;
    for (size_t i = static_cast<size_t>(std::max<int64_t>(0, w_.warmup)); i < reqs_.size(); ++i) {
      const Req& r = reqs_[i];
      if (r.generated < r.output || r.first_client < 0) continue;
      ++res.completed;
      t0 = std::min(t0, r.arrival);
      t1 = std::max(t1, r.last_client);
      res.ttft_s.push_back(r.first_client - r.arrival);
      res.tpot_s.push_back(r.output > 1 ? (r.last_client - r.first_client) / static_cast<double>(r.output - 1) : 0);
      queue.push_back(std::max(0.0, r.first_sched - r.job_at));
      out_tokens += static_cast<double>(r.output);
    }
    if (res.completed == 0) return res;
    res.duration_s = std::max(1e-9, t1 - t0);
    auto pct = [](const std::vector<double>& v) {
      Percentiles p;
      p.p50 = Percentile(v, 0.5);
      p.p90 = Percentile(v, 0.9);
      p.p99 = Percentile(v, 0.99);
      double s = 0;
      for (double x : v) s += x;
      p.mean = s / static_cast<double>(v.size());
      return p;
    };
    res.ttft = pct(res.ttft_s);
    std::vector<double> tpot;
    for (size_t i = 0; i < res.tpot_s.size(); ++i)
      if (res.tpot_s[i] > 0) tpot.push_back(res.tpot_s[i]);
    if (!tpot.empty()) res.tpot = pct(tpot);
    res.queue = pct(queue);
    res.throughput_rps = static_cast<double>(res.completed) / res.duration_s;
    res.output_tokens_per_s = out_tokens / res.duration_s;
    res.mean_decode_batch = steps_ > 0 ? rows_sum_ / static_cast<double>(steps_) : 0;
    double pb = 0, db = 0, pn = 0, dn = 0;
    for (const auto& in : insts_) {
      if (in.role == Role::kPrefill) { pb += in.busy_s; pn += 1; }
      else { db += in.busy_s; dn += 1; }
    }
    if (pn > 0) res.prefill_busy = std::min(1.0, pb / pn / res.duration_s);
    if (dn > 0) res.decode_busy = std::min(1.0, db / dn / res.duration_s);
    return res;
  }

  const ClusterSpec& spec_;
  const Workload& w_;
  const HardwareProfile& hw_;
  const ModelShape& shape_;
  std::vector<Instance> insts_;
  std::vector<int64_t> caps_;
  std::vector<Req> reqs_;
  std::priority_queue<Event, std::vector<Event>, std::greater<Event>> events_;
  double now_ = 0;
  int64_t seq_ = 0;
  double rows_sum_ = 0;
  int64_t steps_ = 0;
};

}  // namespace

std::vector<double> PoissonArrivals(int64_t n, double rate_rps, uint64_t seed) {
  std::mt19937_64 rng(seed ^ 0x9e3779b97f4a7c15ull);
  const bool burst = !(rate_rps > 0) || std::isinf(rate_rps);
  std::exponential_distribution<double> gap(burst ? 1.0 : rate_rps);
  std::vector<double> out(static_cast<size_t>(std::max<int64_t>(0, n)));
  double t = 0;
  for (double& a : out) {
    a = burst ? 0 : t;
    if (!burst) t += gap(rng);
  }
  return out;
}

double Percentile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const double pos = q * static_cast<double>(v.size() - 1);
  const size_t lo = static_cast<size_t>(std::floor(pos));
  const size_t hi = std::min(v.size() - 1, lo + 1);
  return v[lo] + (v[hi] - v[lo]) * (pos - static_cast<double>(lo));
}

double SimResult::Attainment(double slo_ttft_s, double slo_tpot_s) const {
  if (ttft_s.empty()) return 0;
  int64_t ok = 0;
  for (size_t i = 0; i < ttft_s.size(); ++i)
    if (ttft_s[i] <= slo_ttft_s && tpot_s[i] <= slo_tpot_s) ++ok;
  return static_cast<double>(ok) / static_cast<double>(ttft_s.size());
}

double SimResult::Goodput(double slo_ttft_s, double slo_tpot_s) const {
  return duration_s > 0 ? Attainment(slo_ttft_s, slo_tpot_s) * static_cast<double>(completed) / duration_s : 0;
}

SimResult SimulateCluster(const ClusterSpec& spec, const Workload& w, const StepCostModel* prefill,
                          const StepCostModel* decode, const StepCostModel* colocated, const HardwareProfile& hw,
                          const ModelShape& shape) {
  Sim sim(spec, w, prefill, decode, colocated, hw, shape);
  return sim.Run();
}

}  // namespace pdserve::planner
