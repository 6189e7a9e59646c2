#include "services/router/worker_registry.h"

#include <gtest/gtest.h>

#include "services/worker/agent/listening_clock.h"

namespace pdserve::router {
namespace {

using services::RegisterMsg;
using services::WorkerRole;
using namespace std::chrono_literals;

RegisterMsg Reg(const std::string& id, WorkerRole role, uint64_t hash = 7, uint32_t ctx = 1000) {
  RegisterMsg m;
  m.worker_id = id;
  m.role = role;
  m.incarnation = 1;
  m.model_name = "m";
  m.compat_hash = hash;
  m.capacity = {16, 100, 100, 10, ctx, 1};
  return m;
}

TEST(WorkerRegistryTest, RefusesMismatches) {
  WorkerRegistry reg({"m", 0, 1000ms});
  const auto now = Clock::now();
  EXPECT_TRUE(reg.Register("p1", Reg("p", WorkerRole::kPrefill, 7), now).refusal.ok());
  // A decode worker with another model + KV layout hash cannot pair with that prefill.
  auto out = reg.Register("d1", Reg("d", WorkerRole::kDecode, 8), now);
  EXPECT_EQ(out.refusal.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(out.refusal.message().find("compatibility hash"), std::string::npos);
  EXPECT_TRUE(reg.Register("d2", Reg("d", WorkerRole::kDecode, 7), now).refusal.ok());
  EXPECT_TRUE(reg.Register("c1", Reg("c", WorkerRole::kColocated, 99), now).refusal.ok());  // exempt
  RegisterMsg wrong_model = Reg("x", WorkerRole::kColocated);
  wrong_model.model_name = "other";
  EXPECT_FALSE(reg.Register("x1", wrong_model, now).refusal.ok());
  RegisterMsg wrong_proto = Reg("y", WorkerRole::kColocated);
  wrong_proto.protocol_version = 99;
  EXPECT_FALSE(reg.Register("y1", wrong_proto, now).refusal.ok());
  // The last prefill/decode worker leaves: the hash is adopted afresh.
  reg.Remove("p1");
  reg.Remove("d2");
  EXPECT_TRUE(reg.Register("d3", Reg("d2", WorkerRole::kDecode, 8), now).refusal.ok());
}

TEST(WorkerRegistryTest, PinnedHash) {
  WorkerRegistry reg({"m", 42, 1000ms});
  EXPECT_FALSE(reg.Register("p1", Reg("p", WorkerRole::kPrefill, 7), Clock::now()).refusal.ok());
  EXPECT_TRUE(reg.Register("p1", Reg("p", WorkerRole::kPrefill, 42), Clock::now()).refusal.ok());
}

TEST(WorkerRegistryTest, RestartReplacesAndRetryIsIdempotent) {
  WorkerRegistry reg({"m", 0, 1000ms});
  const auto now = Clock::now();
  ASSERT_TRUE(reg.Register("a", Reg("w", WorkerRole::kColocated), now).refusal.ok());
  auto retry = reg.Register("a", Reg("w", WorkerRole::kColocated), now);
  EXPECT_TRUE(retry.duplicate);
  EXPECT_FALSE(retry.replaced);
  RegisterMsg restarted = Reg("w", WorkerRole::kColocated);
  restarted.incarnation = 2;
  auto out = reg.Register("b", restarted, now);
  ASSERT_TRUE(out.replaced.has_value());
  EXPECT_EQ(out.replaced->peer, "a");
  EXPECT_EQ(reg.size(), 1u);
  EXPECT_EQ(reg.FindById("w")->peer, "b");
}

TEST(WorkerRegistryTest, HeartbeatsAndExpiry) {
  WorkerRegistry reg({"m", 0, 1000ms});
  const auto t0 = Clock::now();
  reg.Register("a", Reg("a", WorkerRole::kColocated), t0);
  reg.Register("b", Reg("b", WorkerRole::kColocated), t0);
  services::HeartbeatMsg hb;
  hb.load.kv_blocks_free = 3;
  EXPECT_TRUE(reg.Heartbeat("a", hb, t0 + 900ms));
  EXPECT_FALSE(reg.Heartbeat("zzz", hb, t0));
  auto gone = reg.Expire(t0 + 1500ms);
  ASSERT_EQ(gone.size(), 1u);
  EXPECT_EQ(gone[0].id, "b");
  EXPECT_EQ(reg.FindById("a")->kv_free_estimate, 3);
  hb.draining = true;
  reg.Heartbeat("a", hb, t0 + 1600ms);
  EXPECT_EQ(reg.ReadyCount(WorkerRole::kColocated), 0u);
  EXPECT_EQ(reg.DrainingCount(WorkerRole::kColocated), 1u);
}

// The router's own stall (ListeningClock) is forgiven: silence is counted only in time the
// router was listening.
TEST(WorkerRegistryTest, RouterStallIsNotWorkerSilence) {
  WorkerRegistry reg({"m", 0, 1000ms});
  const auto t0 = Clock::now();
  ASSERT_TRUE(reg.Register("p", Reg("c", WorkerRole::kColocated), t0).refusal.ok());
  services::ListeningClock listening(250ms);
  EXPECT_EQ(listening.Tick(t0), Clock::duration(0));
  EXPECT_EQ(listening.Tick(t0 + 200ms), Clock::duration(0));  // on time
  // The router's thread did not run for 3 s: 2.75 s of it were not listening.
  const auto t1 = t0 + 3200ms;
  const auto stalled = listening.Tick(t1);
  EXPECT_EQ(stalled, Clock::duration(2750ms));
  reg.Forgive(stalled, t1);
  EXPECT_TRUE(reg.Expire(t1).empty());          // heard 450 ms of listening ago
  EXPECT_EQ(reg.Expire(t1 + 600ms).size(), 1u);  // silent 1.05 s while listening: gone
  // Forgiveness never moves a worker into the future.
  ASSERT_TRUE(reg.Register("q", Reg("d", WorkerRole::kColocated), t1).refusal.ok());
  reg.Forgive(10s, t1);
  EXPECT_EQ(reg.FindByPeer("q")->last_seen, t1);
}

TEST(WorkerRegistryTest, ChooseResolvesMaxTokensAndContext) {
  WorkerRegistry reg({"m", 0, 1000ms});
  uint64_t cursor = 0;
  EXPECT_EQ(reg.Choose(WorkerRole::kColocated, RoutingPolicy::kRoundRobin, 10, std::nullopt, 0, true, &cursor)
                .status()
                .code(),
            StatusCode::kUnavailable);
  reg.Register("a", Reg("a", WorkerRole::kColocated, 0, 100), Clock::now());
  auto c = reg.Choose(WorkerRole::kColocated, RoutingPolicy::kRoundRobin, 10, std::nullopt, 0, true, &cursor);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->max_tokens, 90u);  // up to the context
  EXPECT_EQ(c->blocks, 10);
  c = reg.Choose(WorkerRole::kColocated, RoutingPolicy::kRoundRobin, 10, std::nullopt, 32, true, &cursor);
  EXPECT_EQ(c->max_tokens, 32u);  // router.default_max_tokens
  auto too_long = reg.Choose(WorkerRole::kColocated, RoutingPolicy::kRoundRobin, 100, std::nullopt, 0, true, &cursor);
  EXPECT_EQ(too_long.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(too_long.status().message().find("maximum context length is 100"), std::string::npos);
  EXPECT_EQ(reg.Choose(WorkerRole::kColocated, RoutingPolicy::kRoundRobin, 10, 91u, 0, true, &cursor).status().code(),
            StatusCode::kInvalidArgument);
  reg.FindById("a")->kv_free_estimate = 0;
  EXPECT_EQ(reg.Choose(WorkerRole::kColocated, RoutingPolicy::kKvCapacityAware, 10, 5u, 0, true, &cursor)
                .status()
                .code(),
            StatusCode::kResourceExhausted);
}

}  // namespace
}  // namespace pdserve::router
