// AutoscalerPolicy (hysteresis, cooldown, bounds, idle shrink, which signal moves which pool)
// and the window percentiles it is fed (Prometheus text, bucket differences, quantiles).
// To add a case: a sequence of observations and the decisions it must produce.
#include "planner/autoscaler.h"

#include <cmath>

#include <gtest/gtest.h>

#include "planner/metrics_window.h"

namespace pdserve::planner {
namespace {

using Clock = AutoscalerPolicy::Clock;
using std::chrono::milliseconds;

AutoscalerConfig Config() {
  AutoscalerConfig c;
  c.slo_ttft_s = 1.0;
  c.slo_tpot_s = 0.05;
  c.scale_up_after = 2;
  c.scale_down_after = 3;
  c.low_water = 0.5;
  c.cooldown = milliseconds(5000);
  c.min_requests = 2;
  c.pools = {{PoolKind::kPrefill, "p", 1, 3}, {PoolKind::kDecode, "d", 1, 2}};
  return c;
}

WindowObservation Obs(double ttft, double tpot, uint32_t p, uint32_t d, int64_t finished = 10) {
  WindowObservation o;
  o.ttft_s = ttft;
  o.tpot_s = tpot;
  o.finished = finished;
  o.running = 1;
  o.workers = {{"p", p}, {"d", d}};
  return o;
}

ScaleAction ActionOf(const std::vector<ScaleDecision>& ds, const std::string& pool) {
  for (const auto& d : ds)
    if (d.pool == pool) return d.action;
  return ScaleAction::kHold;
}

TEST(AutoscalerPolicyTest, TtftMovesPrefillTpotMovesDecodeAfterTheirStreaks) {
  AutoscalerPolicy pol(Config());
  Clock::time_point t{};
  // One window over the TTFT SLO is not enough; the second is.
  EXPECT_EQ(ActionOf(pol.Tick(Obs(1.5, 0.03, 1, 1), t), "prefill"), ScaleAction::kHold);
  auto ds = pol.Tick(Obs(1.5, 0.03, 1, 1), t += milliseconds(1000));
  EXPECT_EQ(ActionOf(ds, "prefill"), ScaleAction::kScaleUp);
  EXPECT_EQ(ds[0].from, 1u);
  EXPECT_EQ(ds[0].to, 2u);
  EXPECT_NE(ds[0].reason.find("TTFT"), std::string::npos) << ds[0].reason;
  EXPECT_EQ(ActionOf(ds, "decode"), ScaleAction::kHold);  // TPOT 30 ms: neither over nor under 25 ms
  // Cooling down: still over, nothing moves for 5 s.
  for (int i = 0; i < 3; ++i) EXPECT_EQ(ActionOf(pol.Tick(Obs(1.5, 0.03, 2, 1), t += milliseconds(1000)), "prefill"),
                                        ScaleAction::kHold);
  EXPECT_EQ(ActionOf(pol.Tick(Obs(1.5, 0.03, 2, 1), t += milliseconds(2500)), "prefill"), ScaleAction::kScaleUp);
  // TPOT over its SLO moves the decode pool only.
  pol.Tick(Obs(0.7, 0.08, 3, 1), t += milliseconds(1000));
  ds = pol.Tick(Obs(0.7, 0.08, 3, 1), t += milliseconds(1000));
  EXPECT_EQ(ActionOf(ds, "decode"), ScaleAction::kScaleUp);
  EXPECT_EQ(ActionOf(ds, "prefill"), ScaleAction::kHold);
}

TEST(AutoscalerPolicyTest, BoundsAndShrinkAfterRelief) {
  AutoscalerPolicy pol(Config());
  Clock::time_point t{};
  // At the max: a blocked decision, counted once per streak.
  pol.Tick(Obs(2.0, 0.01, 3, 1), t);
  auto ds = pol.Tick(Obs(2.0, 0.01, 3, 1), t += milliseconds(1000));
  EXPECT_EQ(ActionOf(ds, "prefill"), ScaleAction::kBlockedAtMax);
  EXPECT_EQ(ActionOf(pol.Tick(Obs(2.0, 0.01, 3, 1), t += milliseconds(1000)), "prefill"), ScaleAction::kHold);
  // Relief (TTFT under 50% of the SLO) for 3 windows drains one; a window in between that is
  // neither (between 50% and 100%) resets the streak.
  pol.Tick(Obs(0.2, 0.01, 3, 1), t += milliseconds(1000));
  pol.Tick(Obs(0.2, 0.01, 3, 1), t += milliseconds(1000));
  pol.Tick(Obs(0.7, 0.01, 3, 1), t += milliseconds(1000));
  pol.Tick(Obs(0.2, 0.01, 3, 1), t += milliseconds(1000));
  pol.Tick(Obs(0.2, 0.01, 3, 1), t += milliseconds(1000));
  ds = pol.Tick(Obs(0.2, 0.01, 3, 1), t += milliseconds(1000));
  EXPECT_EQ(ActionOf(ds, "prefill"), ScaleAction::kScaleDown);
  EXPECT_EQ(ds[0].to, 2u);
  // The decode pool at its min: relief is blocked there.
  EXPECT_EQ(ActionOf(ds, "decode"), ScaleAction::kBlockedAtMin);
}

TEST(AutoscalerPolicyTest, IdleShrinksAndThinWindowsJudgeNothing) {
  AutoscalerPolicy pol(Config());
  Clock::time_point t{};
  WindowObservation idle = Obs(NAN, NAN, 2, 2, 0);
  idle.running = 0;
  pol.Tick(idle, t);
  pol.Tick(idle, t += milliseconds(1000));
  auto ds = pol.Tick(idle, t += milliseconds(1000));
  EXPECT_EQ(ActionOf(ds, "prefill"), ScaleAction::kScaleDown);
  EXPECT_EQ(ActionOf(ds, "decode"), ScaleAction::kScaleDown);
  EXPECT_NE(ds[0].reason.find("no traffic"), std::string::npos);
  // Traffic, but no request started in the window: no TTFT sample, which relieves prefill.
  AutoscalerPolicy p1(Config());
  for (int i = 0; i < 2; ++i) p1.Tick(Obs(NAN, 0.01, 2, 1), t += milliseconds(1000));
  ds = p1.Tick(Obs(NAN, 0.01, 2, 1), t += milliseconds(1000));
  EXPECT_EQ(ActionOf(ds, "prefill"), ScaleAction::kScaleDown);
  EXPECT_NE(ds[0].reason.find("no TTFT sample"), std::string::npos) << ds[0].reason;
  // One request finished, others still running: no judgement, however slow it was.
  AutoscalerPolicy p2(Config());
  for (int i = 0; i < 5; ++i)
    EXPECT_EQ(ActionOf(p2.Tick(Obs(9.0, 1.0, 1, 1, 1), t += milliseconds(1000)), "prefill"), ScaleAction::kHold);
  // A colocated pool reacts to either signal.
  AutoscalerConfig cc = Config();
  cc.pools = {{PoolKind::kColocated, "c", 1, 4}};
  AutoscalerPolicy p3(cc);
  WindowObservation o = Obs(0.1, 0.2, 0, 0);
  o.workers = {{"c", 2}};
  p3.Tick(o, t);
  EXPECT_EQ(ActionOf(p3.Tick(o, t += milliseconds(1000)), "colocated"), ScaleAction::kScaleUp);
}

TEST(AutoscalerPolicyTest, ConfigErrors) {
  AutoscalerConfig c = Config();
  EXPECT_TRUE(c.Validate().ok());
  c.pools[0].min = 0;
  EXPECT_NE(c.Validate().message().find("min must be >= 1"), std::string::npos);
  c = Config();
  c.pools[1].min = 3;
  EXPECT_NE(c.Validate().message().find("min > max"), std::string::npos);
  c = Config();
  c.pools[1].group = "p";
  EXPECT_NE(c.Validate().message().find("twice"), std::string::npos);
  c = Config();
  c.percentile = 1.5;
  EXPECT_FALSE(c.Validate().ok());
  c = Config();
  c.pools.clear();
  EXPECT_FALSE(c.Validate().ok());
}

TEST(MetricsWindowTest, WindowQuantilesFromTwoScrapes) {
  const char* before = R"(# HELP pdserve_router_ttft_seconds x
# TYPE pdserve_router_ttft_seconds histogram
pdserve_router_ttft_seconds_bucket{le="0.1"} 10
pdserve_router_ttft_seconds_bucket{le="1"} 20
pdserve_router_ttft_seconds_bucket{le="+Inf"} 20
pdserve_router_ttft_seconds_sum 5
pdserve_router_ttft_seconds_count 20
pdserve_router_running_requests 3
pdserve_router_workers{role="prefill",state="ready"} 2
pdserve_router_workers{role="decode",state="ready"} 1
)";
  const char* after = R"(pdserve_router_ttft_seconds_bucket{le="0.1"} 10
pdserve_router_ttft_seconds_bucket{le="1"} 30
pdserve_router_ttft_seconds_bucket{le="+Inf"} 40
pdserve_router_ttft_seconds_sum 30
pdserve_router_ttft_seconds_count 40
)";
  auto b = MetricsText::Parse(before).Histogram("pdserve_router_ttft_seconds");
  auto a = MetricsText::Parse(after).Histogram("pdserve_router_ttft_seconds");
  ASSERT_TRUE(a && b);
  auto d = Difference(*b, *a);
  ASSERT_TRUE(d);
  EXPECT_DOUBLE_EQ(d->count, 20);
  // 10 new observations in (0.1, 1], 10 beyond 1: the median is the top of the (0.1, 1] bucket,
  // the 25th percentile halfway into it, the 90th at the last finite bound.
  EXPECT_NEAR(Quantile(*d, 0.5), 1.0, 1e-12);
  EXPECT_NEAR(Quantile(*d, 0.25), 0.55, 1e-12);
  EXPECT_NEAR(Quantile(*d, 0.9), 1.0, 1e-12);
  EXPECT_TRUE(std::isnan(Quantile(*Difference(*a, *a), 0.5)));
  EXPECT_FALSE(Difference(*a, *b));  // went backwards: a restarted router
  const MetricsText m = MetricsText::Parse(before);
  EXPECT_EQ(m.Sample("pdserve_router_running_requests"), 3.0);
  EXPECT_EQ(m.Sample("pdserve_router_workers", "role=\"prefill\""), 2.0);
  EXPECT_EQ(m.Sample("pdserve_router_workers"), 3.0);
  EXPECT_FALSE(m.Sample("absent"));
  EXPECT_FALSE(m.Histogram("absent"));
}

}  // namespace
}  // namespace pdserve::planner
