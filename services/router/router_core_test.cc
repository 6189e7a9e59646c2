// RouterCore without sockets (RouterCore::CreateDetached): the test plays the workers, feeding
// encoded control messages in and reading what the core sends out. Every flow of router_core.h
// (colocated, disaggregated, ends at the first token, cancel, worker loss, retriable failures,
// stalls, migration limits, stale messages) is checked for the messages the workers get and
// for the accounting: after every step the ledger agrees with the per-worker counters, and once
// the requests are over every counter is back at zero (a leaked charge fails the test).
#include "services/router/router_core.h"

#include <algorithm>
#include <map>

#include <gtest/gtest.h>
#include <prometheus/registry.h>

#include "common/block_hash.h"
#include "services/control/control_codec.h"

namespace pdserve::router {
namespace {

using services::AbortMsg;
using services::ControlMessage;
using pdserve::FinishReason;
using services::FirstTokenMsg;
using services::JobMsg;
using services::JobPhase;
using services::KvReservedMsg;
using services::RegisterMsg;
using services::TokenEventMsg;
using services::WorkerRole;
using namespace std::chrono_literals;

struct Sent {
  std::string peer;
  ControlMessage message;
};

RouterCoreOptions TestOptions() {
  RouterCoreOptions o;
  o.model_name = "m";
  o.heartbeat_timeout = 60s;  // expiry only when a test moves the clock on
  o.stall_timeout = 0ms;      // stall detection only in its own test
  o.max_migrations = 3;
  return o;
}

TokenEventMsg Tokens(uint64_t job, std::vector<int32_t> tokens, FinishReason finish = FinishReason::kNone,
                     Status error = Status::Ok()) {
  TokenEventMsg ev;
  ev.request_id = job;
  ev.tokens = std::move(tokens);
  ev.finish = finish;
  ev.error = std::move(error);
  return ev;
}

class RouterCoreTest : public ::testing::Test {
 protected:
  void SetUp() override { Make(TestOptions()); }
  void TearDown() override {
    if (core_) {
      EXPECT_TRUE(core_->AuditAccounting().ok()) << core_->AuditAccounting().ToString();
    }
  }

  void Make(RouterCoreOptions options) {
    core_.reset();
    sent_.clear();
    core_ = RouterCore::CreateDetached(std::move(options), &metrics_,
                                       [this](const std::string& peer, const ControlMessage& m) {
                                         sent_.push_back({peer, m});
                                       });
  }

  // A message from the worker at `peer`, encoded as on the wire.
  void From(const std::string& peer, const ControlMessage& m) {
    auto bytes = services::EncodeControlMessage(m);
    ASSERT_TRUE(bytes.ok()) << bytes.status().ToString();
    core_->HandleMessage(peer, *bytes);
    ExpectBalanced();
  }
  // A worker with 100 KV blocks of 10 tokens; `kv_namespace`: its prefix cache's (0: none).
  // `instance_id`: a DP rank of that multi-rank instance (of 2 ranks); "": a one-process worker.
  void Register(const std::string& peer, WorkerRole role, uint32_t incarnation = 1, uint64_t kv_namespace = 0,
                const std::string& instance_id = "") {
    RegisterMsg m;
    m.worker_id = peer + "-id";
    m.role = role;
    m.incarnation = incarnation;
    m.model_name = "m";
    m.compat_hash = 7;
    m.capacity = {16, 100, 100, 10, 1000, instance_id.empty() ? 1u : 2u};
    m.instance_id = instance_id;
    m.kv_namespace = kv_namespace;
    if (role != WorkerRole::kColocated) m.transfer_address = peer + "-transfer";
    From(peer, m);
    ASSERT_EQ(Take<services::RegisterAckMsg>(peer).size(), 1u) << peer;
  }
  // Submits `prompt` for 4 tokens (the prefix-cache tests' requests); null (and a failure) when
  // refused.
  std::shared_ptr<ActiveRequest> SubmitPrompt(const std::vector<int32_t>& prompt, const std::string& tag) {
    SubmitSpec spec;
    spec.tag = tag;
    spec.prompt = prompt;
    spec.max_tokens = 4;
    auto r = core_->Submit(std::move(spec));
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    return r.ok() ? *r : nullptr;
  }
  // `constraint` and `affinity`: SubmitSpec's (the defaults: none).
  std::shared_ptr<ActiveRequest> Submit(size_t prompt_len = 5, uint32_t max_tokens = 20,
                                        const grammar::Constraint& constraint = {}, uint64_t affinity = 0) {
    SubmitSpec spec;
    spec.tag = "req";
    spec.prompt.assign(prompt_len, 3);
    spec.max_tokens = max_tokens;
    spec.arrival = std::chrono::steady_clock::now();
    spec.constraint = constraint;
    spec.affinity = affinity;
    auto r = core_->Submit(std::move(spec));
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    ExpectBalanced();
    return r.ok() ? *r : nullptr;
  }

  // Removes and returns the messages of type T sent to `peer` ("" : to anyone).
  template <typename T>
  std::vector<T> Take(const std::string& peer = "") {
    std::vector<T> out;
    std::vector<Sent> rest;
    for (auto& s : sent_) {
      if ((peer.empty() || s.peer == peer) && std::holds_alternative<T>(s.message)) {
        out.push_back(std::get<T>(std::move(s.message)));
      } else {
        rest.push_back(std::move(s));
      }
    }
    sent_ = std::move(rest);
    return out;
  }
  // The one job sent to `peer`.
  JobMsg TakeJob(const std::string& peer) {
    auto jobs = Take<JobMsg>(peer);
    EXPECT_EQ(jobs.size(), 1u) << "jobs to " << peer;
    return jobs.empty() ? JobMsg{} : jobs[0];
  }
  // Job ids aborted at `peer`.
  std::vector<uint64_t> Aborts(const std::string& peer) {
    std::vector<uint64_t> ids;
    for (const AbortMsg& a : Take<AbortMsg>(peer)) ids.push_back(a.request_id);
    return ids;
  }
  void ExpectNothingSent() {
    for (const Sent& s : sent_) ADD_FAILURE() << "unexpected " << services::ControlMessageName(s.message) << " to " << s.peer;
    sent_.clear();
  }

  const WorkerEntry Worker(const std::string& peer) const {
    for (const WorkerEntry& w : core_->WorkerSnapshot())
      if (w.peer == peer) return w;
    ADD_FAILURE() << "no worker at " << peer;
    return {};
  }
  void ExpectBalanced() {
    const Status s = core_->AuditAccounting();
    EXPECT_TRUE(s.ok()) << s.ToString();
  }
  // No request left and no work counted on any worker: nothing leaked.
  void ExpectIdle() {
    ExpectBalanced();
    EXPECT_EQ(core_->outstanding(), 0u);
    EXPECT_EQ(core_->open_charges(), 0u);
    for (const WorkerEntry& w : core_->WorkerSnapshot()) {
      EXPECT_EQ(w.outstanding_requests, 0) << w.id;
      EXPECT_EQ(w.outstanding_tokens, 0) << w.id;
    }
  }

  // Every event queued for the request so far.
  static std::vector<RequestEvent> Events(ActiveRequest& r) {
    std::vector<RequestEvent> out;
    r.WaitEvents(std::chrono::steady_clock::now(), &out);
    return out;
  }
  static std::vector<int32_t> TokensOf(const std::vector<RequestEvent>& events) {
    std::vector<int32_t> out;
    for (const auto& e : events) out.insert(out.end(), e.tokens.begin(), e.tokens.end());
    return out;
  }

  // Runs a disaggregated request to kPrefilling on d / p: returns its job id.
  uint64_t ToPrefilling(const std::string& d, const std::string& p) {
    const JobMsg decode = TakeJob(d);
    EXPECT_EQ(decode.phase, JobPhase::kDecode);
    EXPECT_TRUE(Take<JobMsg>(p).empty()) << "the prefill job waits for the reservation";
    From(d, KvReservedMsg{decode.request_id, "descriptor", "transfer", 3});
    const JobMsg prefill = TakeJob(p);
    EXPECT_EQ(prefill.phase, JobPhase::kPrefill);
    EXPECT_EQ(prefill.request_id, decode.request_id);
    EXPECT_EQ(prefill.kv_descriptor, "descriptor");
    EXPECT_EQ(prefill.decode_transfer_address, "transfer");
    EXPECT_EQ(prefill.decode_worker_id, d + "-id");
    return decode.request_id;
  }

  RouterMetrics metrics_{std::make_shared<prometheus::Registry>()};
  std::vector<Sent> sent_;
  std::unique_ptr<RouterCore> core_;
};

TEST_F(RouterCoreTest, ColocatedRequestChargesThenReleasesOnFinish) {
  Register("c", WorkerRole::kColocated);
  auto req = Submit(5, 20);
  const JobMsg job = TakeJob("c");
  EXPECT_EQ(job.phase, JobPhase::kColocated);
  EXPECT_EQ(job.prompt.size(), 5u);
  EXPECT_EQ(job.sampling.max_tokens, 20u);
  // The colocated worker computes the prompt and the output: 25 tokens, 3 blocks of 10.
  EXPECT_EQ(Worker("c").outstanding_requests, 1);
  EXPECT_EQ(Worker("c").outstanding_tokens, 25);
  EXPECT_EQ(Worker("c").kv_free_estimate, 97);
  EXPECT_EQ(core_->open_charges(), 1u);

  From("c", Tokens(job.request_id, {10, 11}));
  EXPECT_EQ(Worker("c").outstanding_tokens, 23);
  From("c", Tokens(job.request_id, {12}, FinishReason::kStop));
  const auto events = Events(*req);
  EXPECT_EQ(TokensOf(events), (std::vector<int32_t>{10, 11, 12}));
  ASSERT_FALSE(events.empty());
  EXPECT_EQ(events.back().finish, FinishReason::kStop);
  EXPECT_TRUE(req->ended());
  // The worker ended its job itself: no Abort to it.
  ExpectNothingSent();
  ExpectIdle();
}

TEST_F(RouterCoreTest, DisaggregatedRequestWalksEveryPhase) {
  Register("p", WorkerRole::kPrefill);
  Register("d", WorkerRole::kDecode);
  auto req = Submit(5, 20);
  // kReservingKv: both charged (the decode worker owes the output, the prefill worker the
  // prompt), only the decode worker has a job.
  EXPECT_EQ(Worker("d").outstanding_tokens, 20);
  EXPECT_EQ(Worker("d").outstanding_requests, 1);
  EXPECT_EQ(Worker("p").outstanding_tokens, 5);
  EXPECT_EQ(Worker("p").outstanding_requests, 1);
  EXPECT_EQ(core_->open_charges(), 2u);
  const uint64_t job = ToPrefilling("d", "p");
  // A duplicate reservation changes nothing and sends nothing.
  From("d", KvReservedMsg{job, "again", "transfer", 3});
  ExpectNothingSent();

  // The first token: relayed to the decode worker, the prefill charge closes as served, which
  // teaches kv_aware the prefill worker's pace (prefill_pace.h).
  EXPECT_EQ(Worker("p").prefill_pace.open_jobs(), 1);
  EXPECT_EQ(Worker("p").prefill_pace.tokens_per_second(), 0.0);
  From("p", Tokens(job, {42}));
  EXPECT_GT(Worker("p").prefill_pace.tokens_per_second(), 0.0);
  EXPECT_EQ(Worker("p").prefill_pace.open_jobs(), 0);
  auto first = Take<FirstTokenMsg>("d");
  ASSERT_EQ(first.size(), 1u);
  EXPECT_EQ(first[0].request_id, job);
  EXPECT_EQ(first[0].token, 42);
  EXPECT_EQ(Worker("p").outstanding_requests, 0);
  EXPECT_EQ(Worker("p").outstanding_tokens, 0);
  EXPECT_EQ(core_->open_charges(), 1u);
  // A late message of the prefill worker is not this attempt's any more.
  From("p", Tokens(job, {99}));
  ExpectNothingSent();

  From("d", Tokens(job, {43, 44}));
  EXPECT_EQ(Worker("d").outstanding_tokens, 18);
  From("d", Tokens(job, {45}, FinishReason::kLength));
  const auto events = Events(*req);
  EXPECT_EQ(TokensOf(events), (std::vector<int32_t>{42, 43, 44, 45}));
  EXPECT_EQ(events.back().finish, FinishReason::kLength);
  ExpectNothingSent();
  ExpectIdle();
}

TEST_F(RouterCoreTest, RequestEndingAtTheFirstTokenFreesTheReservation) {
  Register("p", WorkerRole::kPrefill);
  Register("d", WorkerRole::kDecode);
  auto req = Submit(5, 1);
  const uint64_t job = ToPrefilling("d", "p");
  From("p", Tokens(job, {42}, FinishReason::kLength));
  EXPECT_EQ(Aborts("d"), std::vector<uint64_t>{job});
  EXPECT_TRUE(Aborts("p").empty()) << "the prefill worker ended the job itself";
  EXPECT_TRUE(Take<FirstTokenMsg>().empty());
  EXPECT_EQ(TokensOf(Events(*req)), std::vector<int32_t>{42});
  EXPECT_TRUE(req->ended());
  ExpectIdle();
}

TEST_F(RouterCoreTest, CancelAbortsTheHoldersInEveryPhase) {
  Register("p", WorkerRole::kPrefill);
  Register("d", WorkerRole::kDecode);
  Register("c", WorkerRole::kColocated);
  RouterCoreOptions o = TestOptions();

  // kReservingKv: only the decode worker has the job.
  {
    auto req = Submit();
    const JobMsg decode = TakeJob("d");
    core_->Cancel(req->id(), "client disconnected");
    EXPECT_EQ(Aborts("d"), std::vector<uint64_t>{decode.request_id});
    EXPECT_TRUE(Aborts("p").empty());
    ExpectNothingSent();
    ExpectIdle();
    // Its late reservation meets an unknown job: Abort, no prefill job.
    From("d", KvReservedMsg{decode.request_id, "x", "y", 1});
    EXPECT_EQ(Aborts("d"), std::vector<uint64_t>{decode.request_id});
    ExpectNothingSent();
  }
  // kPrefilling: both.
  {
    auto req = Submit();
    const uint64_t job = ToPrefilling("d", "p");
    core_->Cancel(req->id(), "client disconnected");
    EXPECT_EQ(Aborts("d"), std::vector<uint64_t>{job});
    EXPECT_EQ(Aborts("p"), std::vector<uint64_t>{job});
    ExpectIdle();
    // Cancelling again, or the workers' abort confirmations, change nothing.
    core_->Cancel(req->id(), "again");
    From("d", Tokens(job, {}, FinishReason::kAbort));
    From("p", Tokens(job, {}, FinishReason::kAbort));
    ExpectNothingSent();
    ExpectIdle();
  }
  // kDecoding: the decode worker only.
  {
    auto req = Submit();
    const uint64_t job = ToPrefilling("d", "p");
    From("p", Tokens(job, {1}));
    Take<FirstTokenMsg>("d");
    From("d", Tokens(job, {2}));
    core_->Cancel(req->id(), "client disconnected");
    EXPECT_EQ(Aborts("d"), std::vector<uint64_t>{job});
    ExpectNothingSent();
    ExpectIdle();
    // A token that was already on its way: the job is unknown now, Abort again.
    From("d", Tokens(job, {3}));
    EXPECT_EQ(Aborts("d"), std::vector<uint64_t>{job});
  }
  // Colocated.
  {
    Make([&] {
      RouterCoreOptions c = o;
      c.mode = ServingMode::kColocated;
      return c;
    }());
    Register("c", WorkerRole::kColocated);
    auto req = Submit();
    const JobMsg job = TakeJob("c");
    core_->Cancel(req->id(), "client disconnected");
    EXPECT_EQ(Aborts("c"), std::vector<uint64_t>{job.request_id});
    ExpectNothingSent();
    ExpectIdle();
  }
}

// A worker that leaves (timeout, deregistration, restart) hands its requests to a new attempt;
// its charges close with it, the new attempt's are opened on the new workers.
TEST_F(RouterCoreTest, PrefillWorkerLossMigratesBeforeTheFirstTokenOnly) {
  Register("p1", WorkerRole::kPrefill);
  Register("d", WorkerRole::kDecode);
  auto early = Submit();
  const uint64_t job1 = ToPrefilling("d", "p1");
  auto late = Submit();
  const uint64_t job2 = ToPrefilling("d", "p1");
  From("p1", Tokens(job2, {7}));
  Take<FirstTokenMsg>("d");
  Register("p2", WorkerRole::kPrefill);

  From("p1", services::DeregisterMsg{"crash"});
  // The request still prefilling moves: the old decode job is aborted (its reservation), a
  // new attempt with a new job id starts on d + p2. The decoding one is untouched.
  EXPECT_EQ(Aborts("d"), std::vector<uint64_t>{job1});
  EXPECT_TRUE(Aborts("p1").empty()) << "the gone worker gets nothing";
  const JobMsg retry = TakeJob("d");
  EXPECT_NE(retry.request_id, job1);
  EXPECT_EQ(retry.phase, JobPhase::kDecode);
  EXPECT_EQ(core_->outstanding(), 2u);
  EXPECT_EQ(Worker("p2").outstanding_requests, 1);
  From("d", KvReservedMsg{retry.request_id, "desc", "addr", 3});
  EXPECT_EQ(TakeJob("p2").request_id, retry.request_id);
  // The old attempt's stragglers are stale.
  From("d", KvReservedMsg{job1, "desc", "addr", 3});
  EXPECT_EQ(Aborts("d"), std::vector<uint64_t>{job1});

  From("p2", Tokens(retry.request_id, {5}));
  Take<FirstTokenMsg>("d");
  From("d", Tokens(retry.request_id, {6}, FinishReason::kStop));
  From("d", Tokens(job2, {8}, FinishReason::kStop));
  EXPECT_EQ(TokensOf(Events(*early)), (std::vector<int32_t>{5, 6}));
  EXPECT_EQ(TokensOf(Events(*late)), (std::vector<int32_t>{7, 8}));
  ExpectNothingSent();
  ExpectIdle();
}

TEST_F(RouterCoreTest, DecodeWorkerLossMigratesWithTheDeliveredOutput) {
  Register("p", WorkerRole::kPrefill);
  Register("d1", WorkerRole::kDecode);
  auto req = Submit(5, 20);
  const uint64_t job = ToPrefilling("d1", "p");
  From("p", Tokens(job, {1}));
  Take<FirstTokenMsg>("d1");
  From("d1", Tokens(job, {2, 3}));
  Register("d2", WorkerRole::kDecode);
  // d1 deregisters (the same path as a timeout: WorkerGoneLocked).
  From("d1", services::DeregisterMsg{"lost"});
  EXPECT_TRUE(Aborts("d1").empty());
  // The prefill worker is done with the request: it gets nothing; the new attempt on d2 is
  // disaggregated again, with the delivered output appended to the prompt.
  const JobMsg retry = TakeJob("d2");
  EXPECT_EQ(retry.phase, JobPhase::kDecode);
  EXPECT_EQ(retry.prompt.size(), 5u + 3u);
  EXPECT_EQ(retry.sampling.resumed_output, 3u);
  EXPECT_EQ(retry.sampling.max_tokens, 17u);
  EXPECT_EQ(Worker("d2").outstanding_tokens, 17);
  EXPECT_EQ(Worker("p").outstanding_tokens, 8);
  const uint64_t job2 = retry.request_id;
  From("d2", KvReservedMsg{job2, "desc", "addr", 3});
  const JobMsg prefill = TakeJob("p");
  EXPECT_EQ(prefill.request_id, job2);
  EXPECT_EQ(prefill.prompt.size(), 8u);
  From("p", Tokens(job2, {4}));
  Take<FirstTokenMsg>("d2");
  From("d2", Tokens(job2, {5}, FinishReason::kStop));
  EXPECT_EQ(TokensOf(Events(*req)), (std::vector<int32_t>{1, 2, 3, 4, 5}));
  ExpectNothingSent();
  ExpectIdle();
}

TEST_F(RouterCoreTest, SilentWorkerExpiresAndItsRequestMoves) {
  Make([] {
    RouterCoreOptions o = TestOptions();
    o.mode = ServingMode::kColocated;
    o.heartbeat_timeout = 1s;
    return o;
  }());
  Register("c1", WorkerRole::kColocated);
  auto req = Submit(5, 20);
  const JobMsg job = TakeJob("c1");
  From("c1", Tokens(job.request_id, {1}));
  // The first tick after everyone was heard: nothing expires. The next one, past the timeout
  // (a single jump, as the core's first tick: it cannot pass for the router's own stall).
  core_->HandleTick(std::chrono::steady_clock::now() + 2s);
  // c1 is gone; no worker left to move to: the request fails with the reason, charges closed.
  EXPECT_TRUE(Aborts("c1").empty());
  const auto events = Events(*req);
  ASSERT_FALSE(events.empty());
  EXPECT_EQ(TokensOf(events), std::vector<int32_t>{1});
  EXPECT_EQ(events.back().finish, FinishReason::kError);
  EXPECT_EQ(events.back().error.code(), StatusCode::kUnavailable);
  EXPECT_NE(events.back().error.message().find("timeout"), std::string::npos) << events.back().error.ToString();
  EXPECT_TRUE(core_->WorkerSnapshot().empty());
  ExpectNothingSent();
  ExpectIdle();
}

TEST_F(RouterCoreTest, RestartedWorkerFailsItsOldRequestsAndStartsFromZero) {
  Make([] {
    RouterCoreOptions o = TestOptions();
    o.mode = ServingMode::kColocated;
    return o;
  }());
  Register("c", WorkerRole::kColocated);
  auto req = Submit(5, 20);
  const JobMsg job = TakeJob("c");
  // The same worker id registers again (a restart): its old entry and requests are gone; the
  // request moves to the new registration, whose counters hold only the new attempt.
  Register("c", WorkerRole::kColocated, 2);
  const JobMsg retry = TakeJob("c");
  EXPECT_NE(retry.request_id, job.request_id);
  EXPECT_EQ(Worker("c").outstanding_requests, 1);
  EXPECT_EQ(Worker("c").outstanding_tokens, 25);
  // The previous incarnation's late output is stale.
  From("c", Tokens(job.request_id, {1}));
  EXPECT_EQ(Aborts("c"), std::vector<uint64_t>{job.request_id});
  From("c", Tokens(retry.request_id, {2}, FinishReason::kStop));
  EXPECT_EQ(TokensOf(Events(*req)), std::vector<int32_t>{2});
  ExpectNothingSent();
  ExpectIdle();
}

TEST_F(RouterCoreTest, RetriableFailureMovesToAnotherWorkerAndAbortsTheOtherSide) {
  Register("p1", WorkerRole::kPrefill);
  Register("p2", WorkerRole::kPrefill);
  Register("d", WorkerRole::kDecode);
  auto req = Submit(5, 20);
  const JobMsg decode = TakeJob("d");
  From("d", KvReservedMsg{decode.request_id, "desc", "addr", 3});
  auto prefill = Take<JobMsg>();
  ASSERT_EQ(prefill.size(), 1u);
  const std::string failed = Worker("p1").outstanding_requests == 1 ? "p1" : "p2";
  const std::string other = failed == "p1" ? "p2" : "p1";
  // The prefill worker fails the transfer: the decode side is aborted, the retry avoids the
  // failed worker while another prefill worker is ready.
  From(failed, Tokens(decode.request_id, {}, FinishReason::kError, Status::Unavailable("transfer failed")));
  EXPECT_EQ(Aborts("d"), std::vector<uint64_t>{decode.request_id});
  EXPECT_TRUE(Aborts(failed).empty());
  const JobMsg retry = TakeJob("d");
  EXPECT_EQ(Worker(failed).outstanding_requests, 0);
  EXPECT_EQ(Worker(other).outstanding_requests, 1);
  EXPECT_FALSE(Worker(failed).draining) << "passed over once, not drained";
  From("d", KvReservedMsg{retry.request_id, "desc", "addr", 3});
  EXPECT_EQ(TakeJob(other).request_id, retry.request_id);
  // A non-retriable failure (the request itself is bad) ends the request.
  From(other, Tokens(retry.request_id, {}, FinishReason::kError, Status::InvalidArgument("bad prompt")));
  EXPECT_EQ(Aborts("d"), std::vector<uint64_t>{retry.request_id});
  const auto events = Events(*req);
  ASSERT_FALSE(events.empty());
  EXPECT_EQ(events.back().error.code(), StatusCode::kInvalidArgument);
  // Failed prefills close their charges without teaching a pace.
  for (const std::string& p : {failed, other}) {
    EXPECT_EQ(Worker(p).prefill_pace.open_jobs(), 0) << p;
    EXPECT_EQ(Worker(p).prefill_pace.tokens_per_second(), 0.0) << p;
  }
  ExpectNothingSent();
  ExpectIdle();
}

TEST_F(RouterCoreTest, DecodeWorkerStreamingBeforeTheFirstTokenIsAFailure) {
  Register("p", WorkerRole::kPrefill);
  Register("d1", WorkerRole::kDecode);
  Register("d2", WorkerRole::kDecode);
  auto req = Submit(5, 20);
  auto jobs = Take<JobMsg>();
  ASSERT_EQ(jobs.size(), 1u);
  const uint64_t job = jobs[0].request_id;
  const std::string bad = Worker("d1").outstanding_requests == 1 ? "d1" : "d2";
  const std::string good = bad == "d1" ? "d2" : "d1";
  From(bad, Tokens(job, {1, 2}));
  // The broken worker still holds its job: Abort; the request moves on without those tokens.
  EXPECT_EQ(Aborts(bad), std::vector<uint64_t>{job});
  const JobMsg retry = TakeJob(good);
  EXPECT_EQ(retry.sampling.resumed_output, 0u);
  EXPECT_TRUE(Events(*req).empty());
  core_->Cancel(req->id(), "done");
  EXPECT_EQ(Aborts(good), std::vector<uint64_t>{retry.request_id});
  ExpectIdle();
}

TEST_F(RouterCoreTest, StalledStreamMigratesAndAbortsTheStalledWorker) {
  Make([] {
    RouterCoreOptions o = TestOptions();
    o.mode = ServingMode::kColocated;
    o.stall_timeout = 100ms;
    return o;
  }());
  Register("c1", WorkerRole::kColocated);
  Register("c2", WorkerRole::kColocated);
  auto req = Submit(5, 20);
  auto jobs = Take<JobMsg>();
  ASSERT_EQ(jobs.size(), 1u);
  const std::string stalled = Worker("c1").outstanding_requests == 1 ? "c1" : "c2";
  const std::string other = stalled == "c1" ? "c2" : "c1";
  const auto now = std::chrono::steady_clock::now();
  // Before the first token there is no stall (prefill of a long prompt takes what it takes).
  core_->HandleTick(now + 50ms);
  core_->HandleTick(now + 200ms);
  ExpectNothingSent();
  From(stalled, Tokens(jobs[0].request_id, {1}));
  const auto t = std::chrono::steady_clock::now();
  core_->HandleTick(t + 50ms);
  ExpectNothingSent();
  core_->HandleTick(t + 150ms);
  ExpectBalanced();
  EXPECT_EQ(Aborts(stalled), std::vector<uint64_t>{jobs[0].request_id});
  const JobMsg retry = TakeJob(other);
  EXPECT_EQ(retry.sampling.resumed_output, 1u);
  EXPECT_EQ(Worker(stalled).outstanding_requests, 0);
  From(other, Tokens(retry.request_id, {2}, FinishReason::kStop));
  EXPECT_EQ(TokensOf(Events(*req)), (std::vector<int32_t>{1, 2}));
  ExpectNothingSent();
  ExpectIdle();
}

TEST_F(RouterCoreTest, MigrationLimitEndsTheRequestWithEveryChargeReleased) {
  Make([] {
    RouterCoreOptions o = TestOptions();
    o.mode = ServingMode::kColocated;
    o.max_migrations = 2;
    return o;
  }());
  Register("c", WorkerRole::kColocated);
  auto req = Submit(5, 20);
  for (int attempt = 0; attempt < 3; ++attempt) {
    const JobMsg job = TakeJob("c");
    EXPECT_EQ(Worker("c").outstanding_requests, 1) << "attempt " << attempt;
    From("c", Tokens(job.request_id, {attempt}, FinishReason::kAbort));
  }
  EXPECT_TRUE(Take<JobMsg>().empty());
  const auto events = Events(*req);
  EXPECT_EQ(TokensOf(events), (std::vector<int32_t>{0, 1, 2}));
  EXPECT_EQ(events.back().finish, FinishReason::kError);
  EXPECT_NE(events.back().error.message().find("after 2 migrations"), std::string::npos)
      << events.back().error.ToString();
  ExpectNothingSent();
  ExpectIdle();
}

TEST_F(RouterCoreTest, NoWorkerToMoveToFailsTheRequest) {
  Register("p", WorkerRole::kPrefill);
  Register("d", WorkerRole::kDecode);
  auto req = Submit();
  const uint64_t job = ToPrefilling("d", "p");
  From("d", services::DeregisterMsg{"gone"});
  EXPECT_EQ(Aborts("p"), std::vector<uint64_t>{job}) << "the prefill worker still computing gets Abort";
  const auto events = Events(*req);
  ASSERT_FALSE(events.empty());
  EXPECT_EQ(events.back().error.code(), StatusCode::kUnavailable);
  ExpectNothingSent();
  ExpectIdle();
}

// Many requests at once, each ending its own way (scripted by its tag), with a decode worker
// restarting in the middle: the workers answer every message at once, and after every message
// the ledger agrees with the counters; at the end nothing is left charged anywhere.
TEST_F(RouterCoreTest, ManyRequestsAcrossEveryEndingLeaveNothingCharged) {
  enum Script { kComplete, kEndAtFirst, kPrefillFailsOnce, kDecodeAbortsOnce, kCancelDecoding, kCancelReserving, kN };
  Register("p1", WorkerRole::kPrefill);
  Register("p2", WorkerRole::kPrefill);
  Register("d1", WorkerRole::kDecode);
  Register("d2", WorkerRole::kDecode);
  std::map<std::string, std::shared_ptr<ActiveRequest>> by_tag;
  std::map<std::string, Script> script;
  std::map<uint64_t, std::string> tag_of_job;
  std::map<std::string, int> prefills, firsts;
  for (int i = 0; i < 24; ++i) {
    SubmitSpec spec;
    spec.tag = "r" + std::to_string(i);
    spec.prompt.assign(3 + i, 5);
    spec.max_tokens = 8;
    auto r = core_->Submit(spec);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    by_tag[spec.tag] = *r;
    script[spec.tag] = static_cast<Script>(i % kN);
  }
  size_t aborts = 0;
  for (int round = 0; !sent_.empty(); ++round) {
    ASSERT_LT(round, 50) << "the exchange does not settle";
    if (round == 2) {
      // d2 restarts: what was on its way to the old process is lost with it.
      From("d2", services::DeregisterMsg{"crash"});
      std::erase_if(sent_, [](const Sent& s) { return s.peer == "d2"; });
      Register("d2", WorkerRole::kDecode, 2);
    }
    std::vector<Sent> batch;
    batch.swap(sent_);
    for (Sent& s : batch) {
      const std::string& peer = s.peer;
      if (auto* job = std::get_if<JobMsg>(&s.message)) {
        tag_of_job[job->request_id] = job->request_tag;
        const std::string& tag = job->request_tag;
        if (job->phase == JobPhase::kDecode) {
          if (script[tag] == kCancelReserving) {
            core_->Cancel(by_tag[tag]->id(), "client gone");
            ExpectBalanced();
          } else {
            From(peer, KvReservedMsg{job->request_id, "desc", "addr", 2});
          }
        } else if (job->phase == JobPhase::kPrefill) {
          if (script[tag] == kPrefillFailsOnce && prefills[tag]++ == 0) {
            From(peer, Tokens(job->request_id, {}, FinishReason::kError, Status::Unavailable("transfer failed")));
          } else {
            From(peer, Tokens(job->request_id, {1}, script[tag] == kEndAtFirst ? FinishReason::kLength
                                                                                 : FinishReason::kNone));
          }
        } else {
          ADD_FAILURE() << "a colocated job in a disaggregated cluster";
        }
      } else if (auto* first = std::get_if<FirstTokenMsg>(&s.message)) {
        const std::string& tag = tag_of_job.at(first->request_id);
        if (script[tag] == kDecodeAbortsOnce && firsts[tag]++ == 0) {
          From(peer, Tokens(first->request_id, {2}, FinishReason::kAbort));
        } else if (script[tag] == kCancelDecoding) {
          From(peer, Tokens(first->request_id, {2}));
          core_->Cancel(by_tag[tag]->id(), "client gone");
          ExpectBalanced();
        } else {
          From(peer, Tokens(first->request_id, {2, 3}, FinishReason::kStop));
        }
      } else if (auto* abort = std::get_if<AbortMsg>(&s.message)) {
        ++aborts;
        // The worker confirms with its finishing event: the router needs nothing more.
        From(peer, Tokens(abort->request_id, {}, FinishReason::kAbort));
      }
    }
  }
  EXPECT_GT(aborts, 0u);
  ExpectIdle();
  for (const auto& [tag, req] : by_tag) {
    if (script[tag] == kCancelDecoding || script[tag] == kCancelReserving) continue;
    const auto events = Events(*req);
    ASSERT_FALSE(events.empty()) << tag;
    EXPECT_TRUE(events.back().error.ok()) << tag << ": " << events.back().error.ToString();
    EXPECT_TRUE(req->ended()) << tag;
  }
}

TEST_F(RouterCoreTest, DestructionAbortsEveryHolderAndFailsTheRequests) {
  Register("p", WorkerRole::kPrefill);
  Register("d", WorkerRole::kDecode);
  auto req = Submit();
  const uint64_t job = ToPrefilling("d", "p");
  std::vector<Sent>* sent = &sent_;
  core_.reset();
  std::vector<std::string> aborted;
  for (const Sent& s : *sent)
    if (auto* a = std::get_if<AbortMsg>(&s.message)) {
      EXPECT_EQ(a->request_id, job);
      aborted.push_back(s.peer);
    }
  std::sort(aborted.begin(), aborted.end());
  EXPECT_EQ(aborted, (std::vector<std::string>{"d", "p"}));
  const auto events = Events(*req);
  ASSERT_FALSE(events.empty());
  EXPECT_EQ(events.back().error.code(), StatusCode::kUnavailable);
}

// The output constraint goes out with every job of every attempt: the colocated job, the decode
// reservation, the prefill job, and the jobs of a migrated attempt; the prefill's grammar state
// rides with the first token to the decode worker.
TEST_F(RouterCoreTest, ConstraintTravelsWithEveryJobAndThePrefillStateReachesDecode) {
  grammar::Constraint c;
  c.kind = grammar::ConstraintKind::kJsonSchema;
  c.text = R"({"type": "object", "properties": {"b": {"type": "integer"}, "a": {}}})";
  c.free_text_until = "</think>";
  c.json.strict = false;
  {
    Make([] {
      RouterCoreOptions o = TestOptions();
      o.mode = ServingMode::kColocated;
      return o;
    }());
    Register("c", WorkerRole::kColocated);
    auto req = Submit(5, 4, c);
    const JobMsg job = TakeJob("c");
    EXPECT_EQ(job.phase, JobPhase::kColocated);
    EXPECT_EQ(job.constraint, c);
    From("c", Tokens(job.request_id, {1, 2}, FinishReason::kStop));
    ExpectIdle();
  }
  Make(TestOptions());
  Register("p", WorkerRole::kPrefill);
  Register("d1", WorkerRole::kDecode);
  auto req = Submit(5, 20, c);
  const JobMsg decode = TakeJob("d1");
  EXPECT_EQ(decode.constraint, c);
  From("d1", KvReservedMsg{decode.request_id, "descriptor", "transfer", 3});
  const JobMsg prefill = TakeJob("p");
  EXPECT_EQ(prefill.phase, JobPhase::kPrefill);
  EXPECT_EQ(prefill.constraint, c);
  TokenEventMsg first = Tokens(decode.request_id, {7});
  first.constraint_state = std::string("state\0bytes", 11);
  From("p", first);
  auto relayed = Take<FirstTokenMsg>("d1");
  ASSERT_EQ(relayed.size(), 1u);
  EXPECT_EQ(relayed[0].constraint_state, first.constraint_state);
  From("d1", Tokens(decode.request_id, {8}));
  // The decode worker goes: the next attempt carries the constraint again (the engine replays
  // the delivered output through the grammar).
  Register("d2", WorkerRole::kDecode);
  From("d1", services::DeregisterMsg{"lost"});
  const JobMsg retry = TakeJob("d2");
  EXPECT_EQ(retry.constraint, c);
  EXPECT_EQ(retry.sampling.resumed_output, 2);
  From("d2", KvReservedMsg{retry.request_id, "desc", "addr", 3});
  const JobMsg prefill2 = TakeJob("p");
  EXPECT_EQ(prefill2.constraint, c);
  From("p", Tokens(retry.request_id, {9}));
  auto relayed2 = Take<FirstTokenMsg>("d2");
  ASSERT_EQ(relayed2.size(), 1u);
  EXPECT_TRUE(relayed2[0].constraint_state.empty());  // none sent: the decode side replays
  From("d2", Tokens(retry.request_id, {10}, FinishReason::kStop));
  EXPECT_EQ(TokensOf(Events(*req)), (std::vector<int32_t>{7, 8, 9, 10}));
  ExpectNothingSent();
  ExpectIdle();
}

// The choices of one client request (SubmitSpec::affinity) go to their sibling's workers while
// those have room, although the policy alone would spread them.
TEST_F(RouterCoreTest, SiblingChoicesShareTheirWorkersWhileTheyFit) {
  Register("c1", WorkerRole::kColocated);
  Register("c2", WorkerRole::kColocated);
  auto first = Submit(5, 20);
  const std::string taken = Worker("c1").outstanding_requests == 1 ? "c1" : "c2";
  const std::string other = taken == "c1" ? "c2" : "c1";
  EXPECT_EQ(Take<JobMsg>(taken).size(), 1u);
  for (int i = 0; i < 3; ++i) {
    Submit(5, 20, {}, first->id());
    EXPECT_EQ(Take<JobMsg>(taken).size(), 1u) << "choice " << i + 1;
    EXPECT_TRUE(Take<JobMsg>(other).empty());
  }
  // Without the affinity the policy decides (least outstanding tokens: the other worker).
  Submit(5, 20);
  EXPECT_EQ(Take<JobMsg>(other).size(), 1u);
  // A sibling's worker without room for the request is passed over.
  services::HeartbeatMsg hb;
  hb.seq = 1;
  hb.load.kv_blocks_total = 100;
  hb.load.kv_blocks_free = 1;  // a request of 25 tokens needs 3 blocks of 10
  From(taken, hb);
  Take<services::HeartbeatAckMsg>(taken);
  Submit(5, 20, {}, first->id());
  EXPECT_EQ(Take<JobMsg>(other).size(), 1u);
  EXPECT_TRUE(Take<JobMsg>(taken).empty());
  core_.reset();  // aborts everything still running
}

TEST_F(RouterCoreTest, UnknownAndMalformedMessages) {
  Register("c", WorkerRole::kColocated);
  // A job the router does not know: Abort so the worker does not compute for nobody; a
  // finishing event for it needs none.
  From("c", Tokens(12345, {1}));
  EXPECT_EQ(Aborts("c"), std::vector<uint64_t>{12345});
  From("c", Tokens(12345, {}, FinishReason::kStop));
  ExpectNothingSent();
  // Bytes that are no control message: dropped.
  core_->HandleMessage("c", "not a message");
  ExpectNothingSent();
  // A request's tokens from a worker that holds none of its jobs: ignored.
  auto req = Submit();
  const JobMsg job = TakeJob("c");
  Register("x", WorkerRole::kColocated);
  From("x", Tokens(job.request_id, {1}, FinishReason::kStop));
  EXPECT_TRUE(Events(*req).empty());
  EXPECT_EQ(core_->outstanding(), 1u);
  core_->Cancel(req->id(), "done");
  EXPECT_EQ(Aborts("c"), std::vector<uint64_t>{job.request_id});
  ExpectNothingSent();
  ExpectIdle();
}

// kv_aware (docs/router.md "KV-aware routing"): the workers' KV events build the index, the
// prefill worker holding a prompt's blocks gets it, the predicted hit is counted against the
// one the worker reports, a colocated attempt reports at its finish, and a worker's entries go
// when it does (re-registration, deregistration). Events the index cannot use are counted.
TEST_F(RouterCoreTest, KvAwareRoutesToTheHolderAndComparesPredictedWithActualHits) {
  RouterCoreOptions o = TestOptions();
  o.prefill_policy = RoutingPolicy::kKvAware;
  o.colocated_policy = RoutingPolicy::kKvAware;
  Make(o);
  constexpr uint64_t kNs = 55;
  constexpr uint32_t kB = 10, kC = 20;  // Register's block size
  Register("p0", WorkerRole::kPrefill, 1, kNs);
  Register("p1", WorkerRole::kPrefill, 1, kNs);
  Register("d", WorkerRole::kDecode);
  std::vector<int32_t> prompt(100);
  for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = static_cast<int32_t>(i * 31 % 997);
  std::vector<uint64_t> names;
  ExtendChain(kNs, prompt, kB, 9, &names);
  // p1 holds the prompt's first 6 blocks.
  From("p1", services::KvEventsMsg{true, kB, kC, {names.begin(), names.begin() + 6}, {}});
  EXPECT_EQ(Worker("p1").kv_index_blocks, 6);
  EXPECT_EQ(Worker("p0").kv_index_blocks, 0);
  EXPECT_TRUE(core_->WorkersJson()[1]["prefix_cache_blocks"].is_number());
  auto submit = [&](const std::vector<int32_t>& p) { return SubmitPrompt(p, "kv"); };
  // Every time, whatever the round-robin cursor says: p1 computes 40 tokens, p0 100. After the
  // first dispatch the rest of the prompt's blocks are pending on p1 (kv_index.h): its next
  // predictions are 90 tokens (all 9 blocks before the last token) until its events say what
  // it stored; the fake p1 here reports 60 found every time.
  for (int i = 0; i < 3; ++i) {
    auto req = submit(prompt);
    const uint64_t job = ToPrefilling("d", "p1");
    TokenEventMsg first = Tokens(job, {42});
    first.cached_prompt_tokens = 60;
    From("p1", first);
    EXPECT_EQ(Take<FirstTokenMsg>("d").size(), 1u);
    From("d", Tokens(job, {43}, FinishReason::kStop));
    EXPECT_TRUE(req->ended());
  }
  EXPECT_EQ(metrics_.prefix_predicted_hit_tokens.Value(), 60 + 90 + 90);
  EXPECT_EQ(metrics_.prefix_actual_hit_tokens.Value(), 180);
  // p1 reports the blocks stored: they stop being pending and stay held.
  From("p1", services::KvEventsMsg{false, kB, kC, {names.begin() + 6, names.begin() + 9}, {}});
  EXPECT_EQ(Worker("p1").kv_index_blocks, 9);
  // A stale entry: p1 says it found less than predicted; both sides are counted as reported.
  {
    auto req = submit(prompt);
    const uint64_t job = ToPrefilling("d", "p1");
    From("p1", Tokens(job, {42}));  // nothing cached after all
    Take<FirstTokenMsg>("d");
    From("d", Tokens(job, {43}, FinishReason::kStop));
    EXPECT_TRUE(req->ended());
  }
  EXPECT_EQ(metrics_.prefix_predicted_hit_tokens.Value(), 330);
  EXPECT_EQ(metrics_.prefix_actual_hit_tokens.Value(), 180);
  // Removals move the choice: p1 keeps 1 block (below the first chunk), p0 now has 3.
  From("p1", services::KvEventsMsg{false, kB, kC, {}, {names.begin() + 1, names.begin() + 9}});
  From("p0", services::KvEventsMsg{true, kB, kC, {names.begin(), names.begin() + 3}, {}});
  {
    auto req = submit(prompt);
    ToPrefilling("d", "p0");
    core_->Cancel(req->id(), "enough");
    Aborts("d");
    Aborts("p0");
  }
  // Events the index cannot use: from a worker registered without a cache (counted), from a
  // peer nobody registered (ignored).
  const double errors = metrics_.control_errors.Value();
  From("d", services::KvEventsMsg{true, kB, kC, {1, 2}, {}});
  EXPECT_EQ(metrics_.control_errors.Value(), errors + 1);
  From("nobody", services::KvEventsMsg{true, kB, kC, {1, 2}, {}});
  EXPECT_EQ(metrics_.control_errors.Value(), errors + 1);
  ExpectNothingSent();
  // A restart of p0 starts its index from nothing; a deregistration drops p1's.
  Register("p0", WorkerRole::kPrefill, 2, kNs);
  EXPECT_EQ(Worker("p0").kv_index_blocks, 0);
  From("p1", services::DeregisterMsg{"bye"});
  Register("p1", WorkerRole::kPrefill, 3, kNs);
  EXPECT_EQ(Worker("p1").kv_index_blocks, 0);
  ExpectIdle();
}

// A burst behind one long prefix: the second prompt is routed before the first's blocks are
// reported, and still goes where they are being computed (pending entries), while an idle
// worker keeps the work that would wait there longer. Every worker is charged only the tokens it
// will compute.
TEST_F(RouterCoreTest, KvAwareSeesDispatchedPrefixesAndChargesOnlyUncachedTokens) {
  RouterCoreOptions o = TestOptions();
  o.prefill_policy = RoutingPolicy::kKvAware;
  Make(o);
  constexpr uint64_t kNs = 56;
  constexpr uint32_t kB = 10, kC = 20;
  Register("p0", WorkerRole::kPrefill, 1, kNs);
  Register("p1", WorkerRole::kPrefill, 1, kNs);
  Register("d", WorkerRole::kDecode);
  // Both prefill workers publish (nothing cached yet): the index knows their block size.
  From("p0", services::KvEventsMsg{true, kB, kC, {}, {}});
  From("p1", services::KvEventsMsg{true, kB, kC, {}, {}});
  std::vector<int32_t> system(80);
  for (size_t i = 0; i < system.size(); ++i) system[i] = static_cast<int32_t>(i * 13 % 991);
  std::vector<int32_t> a = system, b = system;
  a.insert(a.end(), {1, 2, 3, 4, 5});
  b.insert(b.end(), {6, 7, 8, 9, 10});
  auto submit = [&](const std::vector<int32_t>& p) { return SubmitPrompt(p, "burst"); };
  auto ra = submit(a);
  const JobMsg decode_a = TakeJob("d");
  From("d", KvReservedMsg{decode_a.request_id, "descriptor", "transfer", 3});
  const std::string pa = !Take<JobMsg>("p0").empty() ? "p0" : "p1";
  const std::string other = pa == "p0" ? "p1" : "p0";
  EXPECT_TRUE(Take<JobMsg>(other).empty());
  EXPECT_EQ(Worker(pa).outstanding_tokens, 85);  // nothing cached: the whole prompt
  // b: 80 of its 85 tokens are pending on pa (8 blocks): 5 to compute + 85 owed = 90 there,
  // against 85 on the idle worker, which wins.
  auto rb = submit(b);
  ToPrefilling("d", other);
  EXPECT_EQ(Worker(other).outstanding_tokens, 85);
  // c, the same prefix again: 5 + 85 on pa, 5 + 85 on `other` (pending there too now): a tie,
  // and each charge is the 5 uncached tokens.
  std::vector<int32_t> c = system;
  c.insert(c.end(), {11, 12, 13, 14, 15});
  auto rc = submit(c);
  const JobMsg decode_c = TakeJob("d");
  From("d", KvReservedMsg{decode_c.request_id, "descriptor", "transfer", 3});
  const bool on_pa = !Take<JobMsg>(pa).empty();
  EXPECT_EQ(on_pa, Take<JobMsg>(other).empty());
  EXPECT_EQ(Worker(on_pa ? pa : other).outstanding_tokens, 85 + 5);
  EXPECT_EQ(metrics_.prefix_predicted_hit_tokens.Value(), 0);  // counted when the workers report
  for (auto* r : {&ra, &rb, &rc}) core_->Cancel((*r)->id(), "done");
  for (const char* peer : {"d", "p0", "p1"}) Aborts(peer);
  EXPECT_EQ(Worker("p0").outstanding_tokens, 0);
  EXPECT_EQ(Worker("p1").outstanding_tokens, 0);
  ExpectIdle();
}

// Decode-side hits (docs/router.md): a decode worker whose cache holds more of the prompt than
// the prefill worker's, and all but at most decode_local_prefill_tokens of it, gets the request
// as a colocated job (no prefill worker); a longer rest, an equal hit on the prefill worker, or
// the feature off, keeps the prefill worker.
TEST_F(RouterCoreTest, DecodeSideHitRunsTheRequestOnTheDecodeWorker) {
  RouterCoreOptions o = TestOptions();
  o.decode_local_prefill_tokens = 30;
  Make(o);
  constexpr uint64_t kNs = 57;
  constexpr uint32_t kB = 10, kC = 20;
  Register("p", WorkerRole::kPrefill, 1, kNs);
  Register("d", WorkerRole::kDecode, 1, kNs);
  std::vector<int32_t> prompt(100);
  for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = static_cast<int32_t>(i * 17 % 883);
  std::vector<uint64_t> names;
  ExtendChain(kNs, prompt, kB, 9, &names);
  // d holds the first 7 blocks (70 tokens): 30 left to compute, within the bound.
  From("d", services::KvEventsMsg{true, kB, kC, {names.begin(), names.begin() + 7}, {}});
  auto submit = [&]() { return SubmitPrompt(prompt, "local"); };
  {
    auto req = submit();
    const JobMsg job = TakeJob("d");
    EXPECT_EQ(job.phase, JobPhase::kColocated);
    EXPECT_TRUE(Take<JobMsg>("p").empty());
    EXPECT_EQ(Worker("d").outstanding_tokens, 30 + 4);  // the rest of the prompt + the output
    EXPECT_EQ(metrics_.decode_local_prefills.Value(), 1);
    From("d", Tokens(job.request_id, {5}));  // the first token comes from d itself
    TokenEventMsg last = Tokens(job.request_id, {6}, FinishReason::kStop);
    last.cached_prompt_tokens = 70;
    From("d", last);
    EXPECT_TRUE(req->ended());
    EXPECT_EQ(Events(*req).size(), 2u);
    EXPECT_EQ(metrics_.prefix_actual_hit_tokens.Value(), 70);
  }
  // The prefill worker holds as much as d now does (d's hit is 90 tokens: the first request's
  // blocks are pending there): it computes the rest (no decode batch stalls for it).
  From("p", services::KvEventsMsg{true, kB, kC, {names.begin(), names.begin() + 9}, {}});
  {
    auto req = submit();
    ToPrefilling("d", "p");
    core_->Cancel(req->id(), "enough");
    Aborts("d");
    Aborts("p");
  }
  EXPECT_EQ(metrics_.decode_local_prefills.Value(), 1);
  From("p", services::KvEventsMsg{true, kB, kC, {}, {}});
  // d lost two blocks: 50 tokens left, past the bound: prefill worker, then d decodes.
  From("d", services::KvEventsMsg{false, kB, kC, {}, {names.begin() + 5, names.begin() + 9}});
  {
    auto req = submit();
    ToPrefilling("d", "p");
    core_->Cancel(req->id(), "enough");
    Aborts("d");
    Aborts("p");
  }
  EXPECT_EQ(metrics_.decode_local_prefills.Value(), 1);
  ExpectIdle();
  // Off: the same hit as the first request goes through the prefill worker.
  o.decode_local_prefill_tokens = 0;
  Make(o);
  Register("p", WorkerRole::kPrefill, 1, kNs);
  Register("d", WorkerRole::kDecode, 1, kNs);
  From("d", services::KvEventsMsg{true, kB, kC, {names.begin(), names.begin() + 7}, {}});
  {
    auto req = submit();
    ToPrefilling("d", "p");
    core_->Cancel(req->id(), "enough");
    Aborts("d");
    Aborts("p");
  }
  EXPECT_EQ(metrics_.decode_local_prefills.Value(), 1);  // (the fixture's metrics: unchanged)
  ExpectIdle();
  // On, but the holder is a DP rank of a multi-rank decode instance: not asked.
  o.decode_local_prefill_tokens = 30;
  Make(o);
  Register("p", WorkerRole::kPrefill, 1, kNs);
  Register("d", WorkerRole::kDecode, 1, kNs, "inst");
  From("d", services::KvEventsMsg{true, kB, kC, {names.begin(), names.begin() + 7}, {}});
  {
    auto req = submit();
    const JobMsg job = TakeJob("d");
    EXPECT_EQ(job.phase, JobPhase::kDecode);
    core_->Cancel(req->id(), "enough");
  }
  EXPECT_EQ(metrics_.decode_local_prefills.Value(), 1);
}

// Pulls (docs/prefix-cache.md "Pulls"): a prefill worker placed where another worker holds at
// least pull_min_tokens more of the prompt gets the job with a pull of that worker's prefix; its
// kvPull goes to the holder as kvPush (with the prefix's tokens), the holder's kvPushFailed comes
// back to it, and a holder that leaves fails the pull at once. A smaller gain plans no pull.
TEST_F(RouterCoreTest, PullsAPrefixFromTheWorkerThatHoldsIt) {
  RouterCoreOptions o = TestOptions();
  o.prefill_policy = RoutingPolicy::kRoundRobin;  // a job on the worker without the prefix
  o.decode_local_prefill_tokens = 0;
  o.pull_min_tokens = 30;
  Make(o);
  constexpr uint64_t kNs = 57;
  constexpr uint32_t kB = 10, kC = 20;
  Register("p0", WorkerRole::kPrefill, 1, kNs);
  Register("p1", WorkerRole::kPrefill, 1, kNs);
  Register("d", WorkerRole::kDecode, 1, kNs);
  std::vector<int32_t> prompt(100);
  for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = static_cast<int32_t>(i * 13 % 877);
  std::vector<uint64_t> names;
  ExtendChain(kNs, prompt, kB, 9, &names);
  From("p0", services::KvEventsMsg{true, kB, kC, {names.begin(), names.begin() + 8}, {}});
  // Submits until the prefill job lands on p1 (round robin), cancelling the ones on p0, whose
  // own hit needs no pull.
  auto on_p1 = [&](std::shared_ptr<ActiveRequest>* req) -> JobMsg {
    for (int i = 0; i < 2; ++i) {
      *req = SubmitPrompt(prompt, "pull");
      const JobMsg decode = TakeJob("d");
      From("d", KvReservedMsg{decode.request_id, "descriptor", "transfer", 10});
      std::vector<JobMsg> p0 = Take<JobMsg>("p0"), p1 = Take<JobMsg>("p1");
      if (!p1.empty()) return p1[0];
      EXPECT_EQ(p0.size(), 1u);
      if (!p0.empty()) {
        EXPECT_EQ(p0[0].pull_tokens, 0u);
      }
      core_->Cancel((*req)->id(), "next");
      Aborts("d");
      Aborts("p0");
    }
    ADD_FAILURE() << "no prefill job reached p1";
    return {};
  };
  std::shared_ptr<ActiveRequest> req;
  {
    const JobMsg job = on_p1(&req);
    EXPECT_EQ(job.pull_tokens, 80u);
    EXPECT_EQ(job.pull_worker_id, "p0-id");
    EXPECT_EQ(Worker("p1").outstanding_tokens, 20);  // only what neither cache holds
    From("p1", services::KvPullMsg{job.request_id, "pull-descriptor", 0, 80, kNs});
    auto pushes = Take<services::KvPushMsg>("p0");
    ASSERT_EQ(pushes.size(), 1u);
    EXPECT_EQ(pushes[0].tokens, std::vector<int32_t>(prompt.begin(), prompt.begin() + 80));
    EXPECT_EQ(pushes[0].first_token, 0u);
    EXPECT_EQ(pushes[0].num_tokens, 80u);
    EXPECT_EQ(pushes[0].descriptor, "pull-descriptor");
    EXPECT_EQ(pushes[0].kv_namespace, kNs);
    // The holder evicted them meanwhile: p1 hears it (and computes the prefix).
    From("p0", services::KvPushFailedMsg{job.request_id, "evicted"});
    auto failed = Take<services::KvPushFailedMsg>("p1");
    ASSERT_EQ(failed.size(), 1u);
    EXPECT_EQ(failed[0].reason, "evicted");
    // A second failure report, or one from a worker that is not the holder, goes nowhere.
    From("d", services::KvPushFailedMsg{job.request_id, "stray"});
    EXPECT_TRUE(Take<services::KvPushFailedMsg>().empty());
    core_->Cancel(req->id(), "done");
    Aborts("d");
    Aborts("p1");
  }
  EXPECT_EQ(metrics_.prefix_pulls_planned.Value(), 1);
  EXPECT_EQ(metrics_.prefix_pulls_failed.Value(), 1);
  {
    // The holder leaves after the pull was forwarded: p1 is told at once; the request goes on.
    const JobMsg job = on_p1(&req);
    ASSERT_EQ(job.pull_tokens, 80u);
    From("p1", services::KvPullMsg{job.request_id, "pull-descriptor", 30, 50, kNs});
    auto pushes = Take<services::KvPushMsg>("p0");
    ASSERT_EQ(pushes.size(), 1u);
    EXPECT_EQ(pushes[0].first_token, 30u);
    From("p0", services::DeregisterMsg{"bye"});
    auto failed = Take<services::KvPushFailedMsg>("p1");
    ASSERT_EQ(failed.size(), 1u);
    EXPECT_FALSE(req->ended());
    EXPECT_TRUE(Aborts("p1").empty());
    core_->Cancel(req->id(), "done");
    Aborts("d");
    Aborts("p1");
  }
  EXPECT_EQ(metrics_.prefix_pulls_failed.Value(), 2);
  {
    // p1 holds 60 of p0's 80 now: 20 tokens more is below the bar, no pull. (p0 came back.)
    Register("p0", WorkerRole::kPrefill, 2, kNs);
    From("p0", services::KvEventsMsg{true, kB, kC, {names.begin(), names.begin() + 8}, {}});
    From("p1", services::KvEventsMsg{true, kB, kC, {names.begin(), names.begin() + 6}, {}});
    const JobMsg job = on_p1(&req);
    EXPECT_EQ(job.pull_tokens, 0u);
    EXPECT_TRUE(job.pull_worker_id.empty());
    core_->Cancel(req->id(), "done");
    Aborts("d");
    Aborts("p1");
  }
  EXPECT_EQ(metrics_.prefix_pulls_planned.Value(), 2);
  ExpectIdle();
}

// A worker with a disk tier names blocks held in memory or on disk: its events may claim up to
// its pool's blocks plus the tier's, and no more.
TEST_F(RouterCoreTest, AWorkerWithADiskTierMayNameItsTierBlocksToo) {
  RegisterMsg m;
  m.worker_id = "p-id";
  m.role = WorkerRole::kPrefill;
  m.incarnation = 1;
  m.model_name = "m";
  m.compat_hash = 7;
  m.capacity = {16, 100, 100, 10, 1000, 1, /*prefix_tier_blocks=*/50};
  m.kv_namespace = 57;
  m.transfer_address = "p-transfer";
  From("p", m);
  ASSERT_EQ(Take<services::RegisterAckMsg>("p").size(), 1u);
  std::vector<uint64_t> names(150);
  for (size_t i = 0; i < names.size(); ++i) names[i] = 1000 + i;
  From("p", services::KvEventsMsg{true, 10, 20, names, {}});
  EXPECT_EQ(Worker("p").kv_index_blocks, 150);
  names.push_back(5);
  const double errors = metrics_.control_errors.Value();
  From("p", services::KvEventsMsg{true, 10, 20, names, {}});
  EXPECT_EQ(Worker("p").kv_index_blocks, 0);  // 151 claimed: the set is dropped
  EXPECT_EQ(metrics_.control_errors.Value(), errors + 1);
}

TEST_F(RouterCoreTest, KvAwareColocatedCountsTheHitAtTheFinish) {
  RouterCoreOptions o = TestOptions();
  o.colocated_policy = RoutingPolicy::kKvAware;
  Make(o);
  Register("c0", WorkerRole::kColocated, 1, 9);
  Register("c1", WorkerRole::kColocated, 1, 9);
  std::vector<int32_t> prompt(50, 4);
  std::vector<uint64_t> names;
  ExtendChain(9, prompt, 10, 4, &names);
  From("c0", services::KvEventsMsg{true, 10, 20, names, {}});
  SubmitSpec spec;
  spec.tag = "kv";
  spec.prompt = prompt;
  spec.max_tokens = 4;
  auto req = core_->Submit(std::move(spec));
  ASSERT_TRUE(req.ok());
  const JobMsg job = TakeJob("c0");
  From("c0", Tokens(job.request_id, {1}));
  EXPECT_EQ(metrics_.prefix_predicted_hit_tokens.Value(), 0);  // not before the finish
  TokenEventMsg last = Tokens(job.request_id, {2}, FinishReason::kStop);
  last.cached_prompt_tokens = 40;
  From("c0", last);
  EXPECT_EQ(metrics_.prefix_predicted_hit_tokens.Value(), 40);
  EXPECT_EQ(metrics_.prefix_actual_hit_tokens.Value(), 40);
  ExpectIdle();
}

}  // namespace
}  // namespace pdserve::router
