// ChargeLedger: the per-worker counters equal the open charges; every charge closes exactly
// once (charge_ledger.h).
#include "services/router/charge_ledger.h"

#include <gtest/gtest.h>

namespace pdserve::router {
namespace {

using services::RegisterMsg;
using services::WorkerRole;
using namespace std::chrono_literals;

RegisterMsg Reg(const std::string& id, WorkerRole role) {
  RegisterMsg m;
  m.worker_id = id;
  m.role = role;
  m.incarnation = 1;
  m.model_name = "m";
  m.compat_hash = 7;
  m.capacity = {16, 100, 100, 10, 1000, 1};
  return m;
}

class ChargeLedgerTest : public ::testing::Test {
 protected:
  WorkerEntry& Add(const std::string& peer, const std::string& id, WorkerRole role) {
    EXPECT_TRUE(registry_.Register(peer, Reg(id, role), Clock::now()).refusal.ok());
    return *registry_.FindByPeer(peer);
  }
  void ExpectCounters(const std::string& peer, int64_t requests, int64_t tokens, int64_t kv_free) {
    const WorkerEntry* w = registry_.FindByPeer(peer);
    ASSERT_NE(w, nullptr) << peer;
    EXPECT_EQ(w->outstanding_requests, requests) << peer;
    EXPECT_EQ(w->outstanding_tokens, tokens) << peer;
    EXPECT_EQ(w->kv_free_estimate, kv_free) << peer;
  }

  WorkerRegistry registry_{{"m", 0, 1000ms}};
  ChargeLedger ledger_{&registry_};
};

TEST_F(ChargeLedgerTest, ChargeConsumeRelease) {
  WorkerEntry& d = Add("d", "d0", WorkerRole::kDecode);
  WorkerEntry& p = Add("p", "p0", WorkerRole::kPrefill);
  ledger_.Charge(1, AttemptSide::kOutput, d, 20, 3);
  ledger_.Charge(1, AttemptSide::kPrefill, p, 8, 0);
  ledger_.Charge(2, AttemptSide::kOutput, d, 5, 1);
  EXPECT_EQ(ledger_.open(), 3u);
  ExpectCounters("d", 2, 25, 96);
  ExpectCounters("p", 1, 8, 100);
  EXPECT_TRUE(ledger_.Audit().ok()) << ledger_.Audit().ToString();

  // Output consumes the output charge, never below zero.
  EXPECT_EQ(ledger_.Consume(1, AttemptSide::kOutput, 4), 4);
  EXPECT_EQ(ledger_.Find(1, AttemptSide::kOutput)->tokens, 16);
  ExpectCounters("d", 2, 21, 96);
  EXPECT_EQ(ledger_.Consume(2, AttemptSide::kOutput, 9), 5) << "more output than charged";
  EXPECT_EQ(ledger_.Consume(2, AttemptSide::kOutput, 1), 0);
  EXPECT_EQ(ledger_.Consume(3, AttemptSide::kOutput, 1), 0) << "no such charge";
  EXPECT_EQ(ledger_.Consume(1, AttemptSide::kOutput, 0), 0);
  ExpectCounters("d", 2, 16, 96);
  EXPECT_TRUE(ledger_.Audit().ok());

  // The prefill worker sent the first token: its charge closes alone.
  EXPECT_TRUE(ledger_.Release(1, AttemptSide::kPrefill));
  ExpectCounters("p", 0, 0, 100);
  EXPECT_FALSE(ledger_.Release(1, AttemptSide::kPrefill)) << "released twice";
  ExpectCounters("p", 0, 0, 100);
  // The attempt ends: what remains closes, once.
  EXPECT_EQ(ledger_.ReleaseAttempt(1), 1);
  EXPECT_EQ(ledger_.ReleaseAttempt(1), 0);
  EXPECT_EQ(ledger_.ReleaseAttempt(2), 1);
  EXPECT_EQ(ledger_.open(), 0u);
  // Requests and tokens come back; the KV estimate waits for the next heartbeat.
  ExpectCounters("d", 0, 0, 96);
  EXPECT_TRUE(ledger_.Audit().ok());
  services::HeartbeatMsg hb;
  hb.load.kv_blocks_free = 100;
  hb.load.kv_blocks_total = 100;
  ASSERT_TRUE(registry_.Heartbeat("d", hb, Clock::now()));
  ExpectCounters("d", 0, 0, 100);
  EXPECT_FALSE(ledger_.Release(2, AttemptSide::kOutput));
  EXPECT_EQ(ledger_.Consume(2, AttemptSide::kOutput, 1), 0);
}

TEST_F(ChargeLedgerTest, WorkerGoneClosesItsChargesOnly) {
  WorkerEntry& d = Add("d", "d0", WorkerRole::kDecode);
  WorkerEntry& p = Add("p", "p0", WorkerRole::kPrefill);
  ledger_.Charge(1, AttemptSide::kOutput, d, 20, 3);
  ledger_.Charge(1, AttemptSide::kPrefill, p, 8, 0);
  ledger_.Charge(2, AttemptSide::kPrefill, p, 4, 0);
  auto gone = registry_.Remove("p");
  ASSERT_TRUE(gone);
  // Before the ledger hears of it, the audit sees charges on a worker that left.
  EXPECT_EQ(ledger_.Audit().code(), StatusCode::kInternal);
  EXPECT_EQ(ledger_.ForgetWorker(*gone), 2);
  EXPECT_EQ(ledger_.open(), 1u);
  EXPECT_TRUE(ledger_.Audit().ok()) << ledger_.Audit().ToString();
  EXPECT_FALSE(ledger_.Release(1, AttemptSide::kPrefill));
  EXPECT_EQ(ledger_.ReleaseAttempt(1), 1);
  ExpectCounters("d", 0, 0, 97);
  EXPECT_EQ(ledger_.ForgetWorker(*gone), 0);
}

// Prefill charges drive the worker's pace: a served prefill teaches it, and kv_aware then sees a
// holder partway through a long prompt as that much less busy (prefill_pace.h).
TEST_F(ChargeLedgerTest, ServedPrefillsTeachThePaceKvAwareRoutesBy) {
  WorkerEntry& holder = Add("p0", "p0", WorkerRole::kPrefill);
  Add("p1", "p1", WorkerRole::kPrefill);
  const Clock::time_point t0 = Clock::now();
  // A 1000-token prompt served in 5 s: 200 tokens/s. A failed one teaches nothing.
  ledger_.Charge(1, AttemptSide::kPrefill, holder, 1000, 0, t0);
  EXPECT_TRUE(ledger_.Served(1, AttemptSide::kPrefill, t0 + 5s));
  ledger_.Charge(2, AttemptSide::kPrefill, holder, 50, 0, t0 + 6s);
  EXPECT_TRUE(ledger_.Release(2, AttemptSide::kPrefill, t0 + 6100ms));
  EXPECT_DOUBLE_EQ(holder.prefill_pace.tokens_per_second(), 200.0);
  EXPECT_FALSE(ledger_.Served(2, AttemptSide::kPrefill, t0 + 7s)) << "closed twice";
  // Output charges never touch the pace.
  WorkerEntry& d = Add("d", "d0", WorkerRole::kDecode);
  ledger_.Charge(3, AttemptSide::kOutput, d, 40, 1, t0);
  EXPECT_EQ(d.prefill_pace.open_jobs(), 0);
  // The holder starts a 900-token prompt at 10 s; the next request shares 800 tokens of it.
  ledger_.Charge(4, AttemptSide::kPrefill, holder, 900, 0, t0 + 10s);
  EXPECT_TRUE(ledger_.Audit().ok()) << ledger_.Audit().ToString();
  const PredictHitFn predict = [&](const WorkerEntry& w) { return PredictedHit(&w == &holder ? 800 : 0); };
  uint64_t cursor = 0;
  auto choose = [&](Clock::time_point now) {
    auto c = registry_.Choose(WorkerRole::kPrefill, RoutingPolicy::kKvAware, 900, std::nullopt, 0, false, &cursor,
                              {}, predict, now);
    return c.ok() ? c->worker->id : c.status().ToString();
  };
  // Just started (100 + 900 to wait for > 900 to compute cold): the idle worker.
  EXPECT_EQ(choose(t0 + 10s), "p1");
  // 3 s in, ~600 tokens done: 100 + ~300 < 900, the holder.
  EXPECT_EQ(choose(t0 + 13s), "p0");
  // Plain accounting still sees the whole charge.
  EXPECT_EQ(registry_.Choose(WorkerRole::kPrefill, RoutingPolicy::kLeastOutstandingTokens, 900, std::nullopt, 0,
                             false, &cursor, {}, predict, t0 + 13s)
                ->worker->id,
            "p1");
  EXPECT_TRUE(ledger_.Served(4, AttemptSide::kPrefill, t0 + 20s));
  EXPECT_EQ(holder.prefill_pace.open_tokens(), 0);
  EXPECT_TRUE(ledger_.Audit().ok()) << ledger_.Audit().ToString();
}

// A worker that registers again (a restart at the same peer, or the same id elsewhere) starts
// from zero: releasing a charge of its earlier registration must not touch the new counters.
TEST_F(ChargeLedgerTest, ChargesBelongToOneRegistration) {
  WorkerEntry& first = Add("c", "c0", WorkerRole::kColocated);
  ledger_.Charge(1, AttemptSide::kOutput, first, 30, 4);
  const uint64_t old_registration = first.registration;
  RegisterMsg restarted = Reg("c0", WorkerRole::kColocated);
  restarted.incarnation = 2;
  auto outcome = registry_.Register("c", restarted, Clock::now());
  ASSERT_TRUE(outcome.refusal.ok());
  ASSERT_EQ(outcome.replaced.size(), 1u);
  WorkerEntry& second = *registry_.FindByPeer("c");
  EXPECT_NE(second.registration, old_registration);
  ExpectCounters("c", 0, 0, 100);
  ledger_.Charge(2, AttemptSide::kOutput, second, 10, 2);
  // The old charge names a registration that is gone: the audit says so, and a release of it
  // leaves the new registration's counters alone.
  EXPECT_EQ(ledger_.Audit().code(), StatusCode::kInternal);
  EXPECT_EQ(ledger_.Consume(1, AttemptSide::kOutput, 5), 5);
  EXPECT_TRUE(ledger_.Release(1, AttemptSide::kOutput));
  ExpectCounters("c", 1, 10, 98);
  EXPECT_TRUE(ledger_.Audit().ok()) << ledger_.Audit().ToString();
  // Forgetting the old registration (what RouterCore does with outcome.replaced) closes none of
  // the new one's.
  EXPECT_EQ(ledger_.ForgetWorker(outcome.replaced[0]), 0);
  EXPECT_EQ(ledger_.open(), 1u);
}

// The audit is what catches a leak: counters changed behind the ledger's back, or a charge
// never released, show as a mismatch naming the worker.
TEST_F(ChargeLedgerTest, AuditFindsCountersThatDisagree) {
  WorkerEntry& c = Add("c", "c0", WorkerRole::kColocated);
  ledger_.Charge(1, AttemptSide::kOutput, c, 30, 4);
  EXPECT_TRUE(ledger_.Audit().ok());
  c.outstanding_requests += 1;  // a second place that counts
  Status s = ledger_.Audit();
  EXPECT_EQ(s.code(), StatusCode::kInternal);
  EXPECT_NE(s.message().find("c0"), std::string::npos) << s.ToString();
  c.outstanding_requests -= 1;
  c.outstanding_tokens -= 30;  // released without the ledger: the charge leaks
  EXPECT_EQ(ledger_.Audit().code(), StatusCode::kInternal);
  c.outstanding_tokens += 30;
  EXPECT_TRUE(ledger_.Audit().ok());
}

TEST_F(ChargeLedgerTest, ChargingTwiceOrAnUnregisteredWorkerIsAProgrammingError) {
  WorkerEntry& c = Add("c", "c0", WorkerRole::kColocated);
  ledger_.Charge(1, AttemptSide::kOutput, c, 1, 1);
  EXPECT_DEATH(ledger_.Charge(1, AttemptSide::kOutput, c, 1, 1), "already open");
  WorkerEntry stray;
  stray.peer = "nowhere";
  EXPECT_DEATH(ledger_.Charge(2, AttemptSide::kOutput, stray, 1, 1), "not registered");
}

}  // namespace
}  // namespace pdserve::router
