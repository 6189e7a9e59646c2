#include "services/launch/autoscaler_loop.h"

#include <cmath>
#include <limits>
#include <sstream>

#include <fmt/format.h>
#include <httplib.h>
#include <nlohmann/json.hpp>

#include "common/logging.h"
#include "common/mapped_file.h"
#include "services/common/process_util.h"

namespace pdserve::launch {

namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

double Window(const std::optional<planner::HistogramCounts>& now, const std::optional<planner::HistogramCounts>& then,
              double q) {
  if (!now || !then) return kNaN;
  auto d = planner::Difference(*then, *now);
  return d ? planner::Quantile(*d, q) : kNaN;
}

}  // namespace

Result<std::unique_ptr<AutoscalerLoop>> AutoscalerLoop::Create(const ClusterConfig& config, std::string router_host,
                                                                int router_port, Hooks hooks) {
  std::unique_ptr<AutoscalerLoop> loop(new AutoscalerLoop(config, std::move(router_host), router_port, std::move(hooks)));
  if (!config.router.api_keys_file.empty()) {
    // The key file's format (api_auth.h): one key a line, '#' comments, whitespace trimmed.
    PDSERVE_ASSIGN_OR_RETURN(std::string keys, ReadFileToString(config.router.api_keys_file));
    std::istringstream in(keys);
    for (std::string line; loop->api_key_.empty() && std::getline(in, line);) {
      const size_t b = line.find_first_not_of(" \t\r");
      if (b == std::string::npos || line[b] == '#') continue;
      loop->api_key_ = line.substr(b, line.find_last_not_of(" \t\r") - b + 1);
    }
    if (loop->api_key_.empty())
      return Status::InvalidArgument("autoscaler: router.api_keys_file '" + config.router.api_keys_file + "' holds no key");
  }
  const std::string bind = config.autoscaler.metrics_host + ":" + std::to_string(config.autoscaler.metrics_port);
  PDSERVE_ASSIGN_OR_RETURN(loop->exposer_, services::MetricsExposer::Start(bind, loop->registry_));
  return loop;
}

AutoscalerLoop::AutoscalerLoop(const ClusterConfig& config, std::string router_host, int router_port, Hooks hooks)
    : settings_(config.autoscaler),
      host_(std::move(router_host)),
      port_(router_port),
      hooks_(std::move(hooks)),
      policy_(config.autoscaler.policy),
      registry_(std::make_shared<prometheus::Registry>()) {
  for (const auto& g : config.workers) multi_rank_[g.name] = g.plan.has_value();
  decisions_ = &prometheus::BuildCounter()
                    .Name("pdserve_planner_decisions_total")
                    .Help("Autoscaler decisions per pool: hold, scale_up, scale_down, blocked_at_max, blocked_at_min")
                    .Register(*registry_);
  workers_ = &prometheus::BuildGauge()
                  .Name("pdserve_planner_workers")
                  .Help("Processes the autoscaler counts in each pool")
                  .Register(*registry_);
  observed_ = &prometheus::BuildGauge()
                   .Name("pdserve_planner_window_seconds")
                   .Help("The percentile of the last window the autoscaler judged, per signal (ttft, tpot, queue)")
                   .Register(*registry_);
  scrape_failures_ = &prometheus::BuildCounter()
                          .Name("pdserve_planner_scrape_failures_total")
                          .Help("Router /metrics scrapes that failed (no decision that tick)")
                          .Register(*registry_)
                          .Add({});
  // Every series exists from the start (dashboards read zeros, not "no data").
  for (const auto& p : settings_.policy.pools) {
    for (auto a : {planner::ScaleAction::kHold, planner::ScaleAction::kScaleUp, planner::ScaleAction::kScaleDown,
                   planner::ScaleAction::kBlockedAtMax, planner::ScaleAction::kBlockedAtMin})
      decisions_->Add({{"pool", planner::PoolKindName(p.kind)}, {"action", planner::ScaleActionName(a)}});
    workers_->Add({{"pool", planner::PoolKindName(p.kind)}});
  }
}

std::unique_ptr<httplib::Client> AutoscalerLoop::RouterClient() const {
  auto cli = std::make_unique<httplib::Client>(host_, port_);
  cli->set_connection_timeout(std::chrono::seconds(1));
  cli->set_read_timeout(std::chrono::seconds(2));
  if (!api_key_.empty()) cli->set_bearer_token_auth(api_key_);
  return cli;
}

std::optional<AutoscalerLoop::Scrape> AutoscalerLoop::ScrapeRouter(Clock::time_point now) {
  auto r = RouterClient()->Get("/metrics");
  if (!r || r->status != 200) {
    scrape_failures_->Increment();
    return std::nullopt;
  }
  const planner::MetricsText m = planner::MetricsText::Parse(r->body);
  Scrape s;
  s.at = now;
  s.ttft = m.Histogram("pdserve_router_ttft_seconds");
  s.itl = m.Histogram("pdserve_router_inter_token_latency_seconds");
  s.queue = m.Histogram("pdserve_router_queue_time_seconds");
  s.finished = m.Sample("pdserve_router_requests_total").value_or(0);
  s.waiting = m.Sample("pdserve_router_waiting_requests").value_or(0);
  s.running = m.Sample("pdserve_router_running_requests").value_or(0);
  return s;
}

planner::WindowObservation AutoscalerLoop::Observe(const Scrape& now, const Scrape& then) const {
  const double q = settings_.policy.percentile;
  planner::WindowObservation o;
  o.ttft_s = Window(now.ttft, then.ttft, q);
  o.tpot_s = Window(now.itl, then.itl, q);
  o.queue_s = Window(now.queue, then.queue, q);
  o.finished = static_cast<int64_t>(std::llround(std::max(0.0, now.finished - then.finished)));
  o.waiting = now.waiting;
  o.running = now.running;
  for (const auto& p : settings_.policy.pools) o.workers[p.group] = hooks_.live(p.group);
  return o;
}

void AutoscalerLoop::Poll(Clock::time_point now) {
  if (now < next_tick_) return;
  next_tick_ = now + settings_.interval;
  auto s = ScrapeRouter(now);
  if (!s) return;
  scrapes_.push_back(*s);
  // Keep the newest scrape at least a window old (the window's start) and everything after it.
  while (scrapes_.size() > 2 && now - scrapes_[1].at >= settings_.window) scrapes_.pop_front();
  if (scrapes_.size() < 2 || now - scrapes_.front().at < settings_.window - settings_.interval / 2) return;
  const planner::WindowObservation obs = Observe(scrapes_.back(), scrapes_.front());
  auto set = [&](const char* signal, double v) {
    if (std::isfinite(v)) observed_->Add({{"signal", signal}}).Set(v);
  };
  set("ttft", obs.ttft_s);
  set("tpot", obs.tpot_s);
  set("queue", obs.queue_s);
  for (const planner::ScaleDecision& d : policy_.Tick(obs, now)) Apply(d);
}

std::pair<std::string, int64_t> AutoscalerLoop::LeastLoaded(const std::string& group) {
  auto r = RouterClient()->Get("/admin/workers");
  if (!r || r->status != 200) return {};
  const nlohmann::json j = nlohmann::json::parse(r->body, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object() || !j.contains("workers") || !j["workers"].is_array()) return {};
  std::string best;
  int64_t best_load = std::numeric_limits<int64_t>::max();
  for (const auto& w : j["workers"]) {
    const std::string id = w.value("id", "");
    if (id.rfind(group + "-", 0) != 0 || w.value("state", "") != "ready") continue;
    const int64_t load = w.value("outstanding_requests", int64_t{0});
    // Fewest outstanding requests; among equals the newest (highest index) goes first.
    if (load < best_load || (load == best_load && id > best)) {
      best = id;
      best_load = load;
    }
  }
  return {best, best.empty() ? 0 : best_load};
}

void AutoscalerLoop::Apply(const planner::ScaleDecision& d) {
  decisions_->Add({{"pool", d.pool}, {"action", planner::ScaleActionName(d.action)}}).Increment();
  workers_->Add({{"pool", d.pool}}).Set(d.from);
  const std::string head = fmt::format("autoscaler: {} pool (group '{}') {}", d.pool, d.group,
                                       planner::ScaleActionName(d.action));
  switch (d.action) {
    case planner::ScaleAction::kHold:
      GetLogger("planner")->debug("{}: {}", head, d.reason);
      return;
    case planner::ScaleAction::kBlockedAtMax:
    case planner::ScaleAction::kBlockedAtMin:
      hooks_.say(fmt::format("{} ({} workers): {}", head, d.from, d.reason));
      return;
    case planner::ScaleAction::kScaleUp: {
      hooks_.say(fmt::format("{} {} -> {}: {}", head, d.from, d.to, d.reason));
      if (Status s = hooks_.scale_to(d.group, d.to); !s.ok()) hooks_.say("autoscaler: scale-up failed: " + s.ToString());
      workers_->Add({{"pool", d.pool}}).Set(d.to);
      return;
    }
    case planner::ScaleAction::kScaleDown: {
      if (multi_rank_[d.group]) {
        hooks_.say(fmt::format("{} {} -> {}: {}", head, d.from, d.to, d.reason));
        if (Status s = hooks_.scale_to(d.group, d.to); !s.ok())
          hooks_.say("autoscaler: scale-down failed: " + s.ToString());
        workers_->Add({{"pool", d.pool}}).Set(d.to);
        return;
      }
      const auto [id, load] = LeastLoaded(d.group);
      if (id.empty()) {
        hooks_.say(fmt::format("{}: no ready worker of the group to drain (router unreachable?)", head));
        return;
      }
      const nlohmann::json body = {{"worker_id", id},
                                   {"timeout_ms", static_cast<uint64_t>(settings_.drain_timeout.count())}};
      auto r = RouterClient()->Post("/admin/drain", body.dump(), "application/json");
      if (!r || r->status != 200) {
        hooks_.say(fmt::format("{}: draining {} failed ({})", head, id, r ? r->body : std::string("no answer")));
        return;
      }
      hooks_.draining(id);
      hooks_.say(fmt::format("{} {} -> {}: draining {} (the least loaded: {} outstanding requests, which finish "
                             "first): {}",
                             head, d.from, d.to, id, load, d.reason));
      workers_->Add({{"pool", d.pool}}).Set(d.to);
      return;
    }
  }
}

}  // namespace pdserve::launch
