#include "planner/autoscaler.h"

#include <cmath>
#include <cstdio>

namespace pdserve::planner {

namespace {

std::string Fmt(const char* f, double a, double b) {
  char buf[160];
  std::snprintf(buf, sizeof(buf), f, a, b);
  return buf;
}

// "<name> p <v> s (SLO <slo> s)", or "no <name> sample (SLO ...)" for a window without one.
std::string Signal(const char* name, double v, double slo, int digits) {
  char buf[160];
  if (std::isfinite(v))
    std::snprintf(buf, sizeof(buf), "%s p %.*f s (SLO %.*f s)", name, digits, v, digits, slo);
  else
    std::snprintf(buf, sizeof(buf), "no %s sample (SLO %.*f s)", name, digits, slo);
  return buf;
}

}  // namespace

const char* PoolKindName(PoolKind k) {
  switch (k) {
    case PoolKind::kPrefill: return "prefill";
    case PoolKind::kDecode: return "decode";
    case PoolKind::kColocated: return "colocated";
  }
  return "?";
}

const char* ScaleActionName(ScaleAction a) {
  switch (a) {
    case ScaleAction::kHold: return "hold";
    case ScaleAction::kScaleUp: return "scale_up";
    case ScaleAction::kScaleDown: return "scale_down";
    case ScaleAction::kBlockedAtMax: return "blocked_at_max";
    case ScaleAction::kBlockedAtMin: return "blocked_at_min";
  }
  return "?";
}

Status AutoscalerConfig::Validate() const {
  if (!(slo_ttft_s > 0) || !(slo_tpot_s > 0) || !(slo_queue_s >= 0))
    return Status::InvalidArgument("autoscaler.slo: ttft_ms and tpot_ms must be > 0, queue_ms >= 0");
  if (!(percentile > 0 && percentile < 1)) return Status::InvalidArgument("autoscaler.percentile must be in (0, 1)");
  if (scale_up_after < 1 || scale_down_after < 1)
    return Status::InvalidArgument("autoscaler.scale_up_after and scale_down_after must be >= 1");
  if (!(low_water > 0 && low_water < 1)) return Status::InvalidArgument("autoscaler.low_water must be in (0, 1)");
  if (cooldown.count() < 0) return Status::InvalidArgument("autoscaler.cooldown_ms must be >= 0");
  if (min_requests < 1) return Status::InvalidArgument("autoscaler.min_requests must be >= 1");
  if (pools.empty()) return Status::InvalidArgument("autoscaler.pools: no pool to scale");
  for (size_t i = 0; i < pools.size(); ++i) {
    const Pool& p = pools[i];
    const std::string where = std::string("autoscaler.pools.") + PoolKindName(p.kind);
    if (p.group.empty()) return Status::InvalidArgument(where + ".group is required");
    if (p.min < 1) return Status::InvalidArgument(where + ".min must be >= 1 (a pool keeps one worker)");
    if (p.min > p.max) return Status::InvalidArgument(where + ": min > max");
    for (size_t j = 0; j < i; ++j)
      if (pools[j].kind == p.kind || pools[j].group == p.group)
        return Status::InvalidArgument(where + ": pool or group given twice");
  }
  return Status::Ok();
}

AutoscalerPolicy::AutoscalerPolicy(AutoscalerConfig config)
    : config_(std::move(config)), state_(config_.pools.size()) {}

std::vector<ScaleDecision> AutoscalerPolicy::Tick(const WindowObservation& obs, Clock::time_point now) {
  const AutoscalerConfig& c = config_;
  const bool idle = obs.finished == 0 && obs.waiting <= 0 && obs.running <= 0;
  const bool judged = idle || obs.finished >= c.min_requests;
  // Over / under the SLO for each watched signal (a signal without samples is neither).
  auto over = [](double v, double slo) { return slo > 0 && std::isfinite(v) && v > slo; };
  auto under = [&](double v, double slo) { return slo <= 0 || !std::isfinite(v) || v < c.low_water * slo; };
  const bool ttft_over = over(obs.ttft_s, c.slo_ttft_s) || over(obs.queue_s, c.slo_queue_s);
  const bool tpot_over = over(obs.tpot_s, c.slo_tpot_s);
  const bool ttft_low = under(obs.ttft_s, c.slo_ttft_s) && under(obs.queue_s, c.slo_queue_s);
  const bool tpot_low = under(obs.tpot_s, c.slo_tpot_s);

  std::vector<ScaleDecision> out;
  for (size_t i = 0; i < c.pools.size(); ++i) {
    const AutoscalerConfig::Pool& p = c.pools[i];
    PoolState& st = state_[i];
    ScaleDecision d;
    d.pool = PoolKindName(p.kind);
    d.group = p.group;
    auto it = obs.workers.find(p.group);
    if (it == obs.workers.end()) {
      d.reason = "no size known for group " + p.group;
      out.push_back(d);
      continue;
    }
    d.from = d.to = it->second;
    bool pressure = false, relief = false;
    std::string why;
    switch (p.kind) {
      case PoolKind::kPrefill:
        pressure = ttft_over;
        relief = idle || ttft_low;
        why = Signal("TTFT", obs.ttft_s, c.slo_ttft_s, 3);
        if (c.slo_queue_s > 0) why += ", " + Signal("queue", obs.queue_s, c.slo_queue_s, 3);
        break;
      case PoolKind::kDecode:
        pressure = tpot_over;
        relief = idle || tpot_low;
        why = Signal("TPOT", obs.tpot_s, c.slo_tpot_s, 4);
        break;
      case PoolKind::kColocated:
        pressure = ttft_over || tpot_over;
        relief = idle || (ttft_low && tpot_low);
        why = Signal("TTFT", obs.ttft_s, c.slo_ttft_s, 3) + ", " + Signal("TPOT", obs.tpot_s, c.slo_tpot_s, 4);
        break;
    }
    if (idle) why = "no traffic in the window";
    if (!judged) {
      d.reason = "too few requests finished in the window (" + std::to_string(obs.finished) + ")";
      out.push_back(d);
      continue;
    }
    st.pressure = pressure ? st.pressure + 1 : 0;
    st.relief = relief && !pressure ? st.relief + 1 : 0;
    const bool cooling = st.changed && now - st.last_change < c.cooldown;
    if (st.pressure >= c.scale_up_after && !cooling) {
      if (d.from < p.max) {
        d.action = ScaleAction::kScaleUp;
        d.to = d.from + 1;
      } else {
        d.action = ScaleAction::kBlockedAtMax;
      }
      d.reason = why + " over the SLO for " + std::to_string(st.pressure) + " windows";
      st.pressure = 0;
    } else if (st.relief >= c.scale_down_after && !cooling) {
      if (d.from > p.min) {
        d.action = ScaleAction::kScaleDown;
        d.to = d.from - 1;
      } else {
        d.action = ScaleAction::kBlockedAtMin;
      }
      d.reason = why + (idle ? "" : " under " + Fmt("%.0f%% of the SLO", c.low_water * 100, 0)) + " for " +
                 std::to_string(st.relief) + " windows";
      st.relief = 0;
    } else {
      d.reason = why + (cooling ? " (cooling down)" : "");
    }
    if (d.action == ScaleAction::kScaleUp || d.action == ScaleAction::kScaleDown) {
      st.changed = true;
      st.last_change = now;
    }
    out.push_back(d);
  }
  return out;
}

}  // namespace pdserve::planner
