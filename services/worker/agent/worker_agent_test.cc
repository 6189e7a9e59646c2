#include "services/worker/agent/worker_agent.h"

#include <atomic>
#include <condition_variable>
#include <mutex>
#include <optional>
#include <set>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "services/control/control_codec.h"
#include "services/testing/child_process.h"

namespace pdserve::services {
namespace {

using namespace std::chrono_literals;
using testing::WaitFor;

// A router stand-in speaking the real protocol on a real socket: it acks registrations and
// heartbeats and records everything else.
class FakeRouter {
 public:
  explicit FakeRouter(const std::string& endpoint, uint64_t incarnation = 1, uint32_t timeout_ms = 400)
      : incarnation_(incarnation), timeout_ms_(timeout_ms) {
    auto ch = ControlChannel::Start({ControlChannelOptions::Kind::kRouterBind, endpoint, 10ms, "fake-router"},
                                    [this](std::string_view peer, std::string_view payload) { OnMessage(peer, payload); });
    EXPECT_TRUE(ch.ok()) << ch.status().ToString();
    channel_ = std::move(ch).value();
  }
  const std::string& endpoint() const { return channel_->endpoint(); }

  void Send(const ControlMessage& m) {
    std::string peer;
    {
      std::lock_guard<std::mutex> l(mu_);
      peer = peer_;
    }
    channel_->Send(peer, EncodeControlMessage(m).value());
  }
  template <typename T>
  std::vector<T> Received() {
    std::lock_guard<std::mutex> l(mu_);
    std::vector<T> out;
    for (const auto& m : received_)
      if (auto* p = std::get_if<T>(&m)) out.push_back(*p);
    return out;
  }
  std::atomic<bool> known{true};
  std::atomic<bool> forget_once{false};  // the next heartbeat ack (only) says "unknown worker"
  std::atomic<bool> silent{false};       // records but answers nothing (a network cut)
  std::atomic<bool> refuse{false};

 private:
  void OnMessage(std::string_view peer, std::string_view payload) {
    auto m = DecodeControlMessage(payload);
    ASSERT_TRUE(m.ok());
    {
      std::lock_guard<std::mutex> l(mu_);
      peer_ = std::string(peer);
      received_.push_back(m.value());
    }
    std::string reply;
    if (std::holds_alternative<RegisterMsg>(m.value())) {
      reply = refuse ? EncodeControlMessage(RegisterRefuseMsg{StatusCode::kFailedPrecondition, "no"}).value()
                     : EncodeControlMessage(RegisterAckMsg{incarnation_, 50, timeout_ms_}).value();
    } else if (auto* hb = std::get_if<HeartbeatMsg>(&m.value())) {
      const bool forget = forget_once.exchange(false);
      reply = EncodeControlMessage(HeartbeatAckMsg{hb->seq, known.load() && !forget, incarnation_}).value();
    }
    if (!reply.empty() && !silent) channel_->Send(std::string(peer), reply);
  }

  const uint64_t incarnation_;
  const uint32_t timeout_ms_;
  std::mutex mu_;
  std::string peer_;
  std::vector<ControlMessage> received_;
  std::unique_ptr<ControlChannel> channel_;
};

class RecordingHandler : public WorkerHandler {
 public:
  Status StartJob(const JobMsg& job) override {
    std::lock_guard<std::mutex> l(mu);
    if (job.prompt.size() > 100) return Status::InvalidArgument("too long");
    started.push_back(job.request_id);
    return Status::Ok();
  }
  void AbortJob(uint64_t id, std::string_view reason) override {
    std::lock_guard<std::mutex> l(mu);
    aborted.push_back(id);
  }
  WorkerLoad CurrentLoad() override { return WorkerLoad{1, 2, 3, 4, 5}; }
  void OnDrain() override { drained = true; }
  Status Health() override { return healthy ? Status::Ok() : Status::Unavailable("stuck in a step"); }
  std::vector<uint64_t> Started() {
    std::lock_guard<std::mutex> l(mu);
    return started;
  }
  std::vector<uint64_t> Aborted() {
    std::lock_guard<std::mutex> l(mu);
    return aborted;
  }
  std::mutex mu;
  std::vector<uint64_t> started, aborted;
  std::atomic<bool> drained{false};
  std::atomic<bool> healthy{true};
};

WorkerAgentOptions Options(const std::string& endpoint) {
  WorkerAgentOptions o;
  o.router_address = endpoint;
  o.worker_id = "w0";
  o.model_name = "m";
  o.register_retry = 30ms;
  o.heartbeat_interval = 50ms;
  o.router_timeout = 400ms;
  o.tick = 5ms;
  return o;
}

JobMsg Job(uint64_t id, size_t prompt_len = 3) {
  JobMsg j;
  j.request_id = id;
  j.prompt.assign(prompt_len, 1);
  j.sampling.max_tokens = 4;
  return j;
}

// The agent's own stall is not the router's silence: a handler call that holds the agent's
// thread for 3x the router timeout (a slow engine call on a starved CPU) must not make
// the agent declare the router lost, abort its jobs and register again once it resumes: its
// next tick comes with the batch cut short (a tick was due), heartbeats out, and the timeout
// waits until it read what arrived meanwhile. (Before liveness was judged on what the listener
// heard while listening, the tick right after the stall declared the router lost.)
TEST(WorkerAgentTest, OwnStallIsNotRouterSilence) {
  FakeRouter router("tcp://127.0.0.1:*", 1, 1000);  // router timeout 1 s: margin on a loaded machine
  class SlowStart : public RecordingHandler {
   public:
    Status StartJob(const JobMsg& job) override {
      std::this_thread::sleep_for(3000ms);
      return RecordingHandler::StartJob(job);
    }
  } handler;
  auto agent = WorkerAgent::Start(Options(router.endpoint()), &handler);
  ASSERT_TRUE(agent.ok()) << agent.status().ToString();
  ASSERT_TRUE(WaitFor([&] { return (*agent)->registered(); }, 5s));
  router.Send(Job(9));
  ASSERT_TRUE(WaitFor([&] { return handler.Started().size() == 1; }, 10s));
  const size_t heartbeats = router.Received<HeartbeatMsg>().size();
  ASSERT_TRUE(WaitFor([&] { return router.Received<HeartbeatMsg>().size() >= heartbeats + 4; }, 5s));
  EXPECT_TRUE(handler.Aborted().empty());
  EXPECT_EQ((*agent)->registrations(), 1u);
  EXPECT_EQ((*agent)->live_jobs(), 1u);
  EXPECT_TRUE((*agent)->registered());
}

TEST(WorkerAgentTest, RegistersHeartbeatsAndRunsJobs) {
  FakeRouter router("tcp://127.0.0.1:*");
  RecordingHandler handler;
  auto agent = WorkerAgent::Start(Options(router.endpoint()), &handler);
  ASSERT_TRUE(agent.ok()) << agent.status().ToString();
  ASSERT_TRUE(WaitFor([&] { return (*agent)->registered(); }, 5s));
  ASSERT_TRUE(WaitFor([&] { return router.Received<HeartbeatMsg>().size() >= 2; }, 5s));
  EXPECT_EQ(router.Received<HeartbeatMsg>().back().load.queued_tokens, 3u);

  router.Send(Job(7));
  router.Send(Job(8, 200));  // refused by the handler -> error event
  ASSERT_TRUE(WaitFor([&] { return handler.Started().size() == 1; }, 5s));
  ASSERT_TRUE(WaitFor([&] { return router.Received<TokenEventMsg>().size() == 1; }, 5s));
  auto refused = router.Received<TokenEventMsg>()[0];
  EXPECT_EQ(refused.request_id, 8u);
  EXPECT_EQ(refused.error.code(), StatusCode::kInvalidArgument);

  TokenEventMsg ev;
  ev.request_id = 7;
  ev.tokens = {1};
  (*agent)->SendTokenEvent(ev);
  ev.finish = FinishReason::kLength;
  (*agent)->SendTokenEvent(ev);
  ev.finish = FinishReason::kNone;
  (*agent)->SendTokenEvent(ev);  // after the finish: dropped
  ASSERT_TRUE(WaitFor([&] { return router.Received<TokenEventMsg>().size() == 3; }, 5s));
  EXPECT_EQ((*agent)->live_jobs(), 0u);

  router.Send(AbortMsg{99, "unknown job: ignored"});
  router.Send(Job(9));
  ASSERT_TRUE(WaitFor([&] { return handler.Started().size() == 2; }, 5s));
  router.Send(AbortMsg{9, "client gone"});
  ASSERT_TRUE(WaitFor([&] { return handler.Aborted().size() == 1; }, 5s));
  EXPECT_EQ(handler.Aborted()[0], 9u);
  agent->reset();  // deregisters
  ASSERT_TRUE(WaitFor([&] { return router.Received<DeregisterMsg>().size() == 1; }, 5s));
}

// A job's slow set-up (the first constrained job builds the structured-output vocabulary: a
// second or more of CPU) runs on the preparer thread: while it runs, heartbeats keep going out
// (on the agent's thread they stopped, and the router removed the worker with every request on
// it). A job aborted while it is prepared ends with an abort event and never reaches StartJob;
// a failed preparation refuses its job; a prepared job starts.
TEST(WorkerAgentTest, SlowPreparationDoesNotHoldHeartbeats) {
  FakeRouter router("tcp://127.0.0.1:*");  // router timeout 400 ms
  class Preparing : public RecordingHandler {
   public:
    bool NeedsPreparation(const JobMsg& job) override { return job.prompt.size() >= 5; }
    Status PrepareJob(const JobMsg& job) override {
      ++preparing;
      std::unique_lock<std::mutex> l(gate_mu);
      gate_cv.wait(l, [&] { return open; });
      if (job.prompt.size() == 6) return Status::InvalidArgument("bad grammar");
      return Status::Ok();
    }
    void Open() {
      {
        std::lock_guard<std::mutex> l(gate_mu);
        open = true;
      }
      gate_cv.notify_all();
    }
    std::atomic<int> preparing{0};
    std::mutex gate_mu;
    std::condition_variable gate_cv;
    bool open = false;
  };
  Preparing handler;
  auto agent = WorkerAgent::Start(Options(router.endpoint()), &handler);
  ASSERT_TRUE(agent.ok()) << agent.status().ToString();
  ASSERT_TRUE(WaitFor([&] { return (*agent)->registered(); }, 5s));

  router.Send(Job(1, 5));  // prepared, then started
  router.Send(Job(2, 5));  // aborted while it waits for the preparer
  router.Send(Job(3, 6));  // its preparation fails
  router.Send(Job(4));     // needs none: starts at once, beside the preparation
  ASSERT_TRUE(WaitFor([&] { return handler.preparing.load() == 1; }, 5s)) << "the preparation never began";
  ASSERT_TRUE(WaitFor([&] { return handler.Started().size() == 1; }, 5s));
  EXPECT_EQ(handler.Started()[0], 4u);
  // The preparation holds for 3x the router timeout; the heartbeats go on meanwhile.
  const size_t heartbeats_before = router.Received<HeartbeatMsg>().size();
  std::this_thread::sleep_for(1200ms);
  EXPECT_GE(router.Received<HeartbeatMsg>().size(), heartbeats_before + 8) << "heartbeats stopped during a preparation";
  EXPECT_TRUE((*agent)->registered());
  router.Send(AbortMsg{2, "client gone"});
  ASSERT_TRUE(WaitFor([&] { return router.Received<TokenEventMsg>().size() == 1; }, 5s));
  EXPECT_EQ(router.Received<TokenEventMsg>()[0].request_id, 2u);
  EXPECT_EQ(router.Received<TokenEventMsg>()[0].finish, FinishReason::kAbort);
  EXPECT_EQ((*agent)->live_jobs(), 3u);  // 1 and 3 preparing, 4 started

  handler.Open();
  ASSERT_TRUE(WaitFor([&] { return handler.Started().size() == 2; }, 5s));
  EXPECT_EQ(handler.Started()[1], 1u);
  ASSERT_TRUE(WaitFor([&] { return router.Received<TokenEventMsg>().size() == 2; }, 5s));
  const TokenEventMsg refused = router.Received<TokenEventMsg>()[1];
  EXPECT_EQ(refused.request_id, 3u);
  EXPECT_EQ(refused.error.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(handler.preparing.load(), 3);  // 2 was prepared too, then dropped
  std::this_thread::sleep_for(100ms);
  EXPECT_EQ(handler.Started().size(), 2u) << "an aborted job was started";
  EXPECT_TRUE(handler.Aborted().empty()) << "the handler never saw job 2";
  EXPECT_EQ((*agent)->live_jobs(), 2u);
}

TEST(WorkerAgentTest, WorkerStartsBeforeTheRouterAndSurvivesItsRestart) {
  const int port = testing::FreeTcpPort();
  const std::string endpoint = "tcp://127.0.0.1:" + std::to_string(port);
  RecordingHandler handler;
  auto agent = WorkerAgent::Start(Options(endpoint), &handler);
  ASSERT_TRUE(agent.ok());
  EXPECT_FALSE((*agent)->registered());
  auto router = std::make_unique<FakeRouter>(endpoint, 1);
  ASSERT_TRUE(WaitFor([&] { return (*agent)->registered(); }, 5s));
  router->Send(Job(1));
  ASSERT_TRUE(WaitFor([&] { return (*agent)->live_jobs() == 1; }, 5s));

  router.reset();  // the router dies: the agent notices the silence and aborts its job
  ASSERT_TRUE(WaitFor([&] { return !(*agent)->registered(); }, 5s));
  EXPECT_EQ(handler.Aborted(), std::vector<uint64_t>{1});
  router = std::make_unique<FakeRouter>(endpoint, 2);
  ASSERT_TRUE(WaitFor([&] { return (*agent)->registered() && (*agent)->router_incarnation() == 2; }, 5s));
  EXPECT_EQ((*agent)->registrations(), 2u);
}

TEST(WorkerAgentTest, ForgottenWorkerRegistersAgainAndAbortsItsJobs) {
  FakeRouter router("tcp://127.0.0.1:*");
  RecordingHandler handler;
  auto agent = WorkerAgent::Start(Options(router.endpoint()), &handler);
  ASSERT_TRUE(agent.ok());
  ASSERT_TRUE(WaitFor([&] { return (*agent)->registered(); }, 5s));
  router.Send(Job(5));
  ASSERT_TRUE(WaitFor([&] { return (*agent)->live_jobs() == 1; }, 5s));
  // One "unknown worker" answer (a router that timed this worker out): the agent aborts its
  // job and registers again. A flag the test flips back instead would race with heartbeats in
  // flight and could make the agent re-register after the test moved on.
  router.forget_once = true;
  ASSERT_TRUE(WaitFor([&] { return handler.Aborted().size() == 1; }, 5s));
  ASSERT_TRUE(WaitFor([&] { return (*agent)->registrations() == 2 && (*agent)->registered(); }, 5s));
  TokenEventMsg stale;
  stale.request_id = 5;
  stale.finish = FinishReason::kAbort;
  (*agent)->SendTokenEvent(stale);  // the job was forgotten: never reaches the router
  router.Send(Job(6));
  ASSERT_TRUE(WaitFor([&] { return handler.Started().size() == 2; }, 5s));
  for (const auto& ev : router.Received<TokenEventMsg>()) EXPECT_NE(ev.request_id, 5u);
}

// A handler with a prefix cache: `pending` is what TakeKvEvents hands out next, `set` the
// whole set it sends when asked for it.
class CachingHandler : public RecordingHandler {
 public:
  std::optional<KvEventsMsg> TakeKvEvents(bool full) override {
    std::lock_guard<std::mutex> l(mu);
    KvEventsMsg m;
    m.block_tokens = 16;
    m.first_chunk_tokens = 32;
    if (full) {
      ++full_requests;
      m.reset = true;
      m.stored = set;
    } else {
      m.stored = std::move(pending);
    }
    pending.clear();
    return m;
  }
  void Store(std::vector<uint64_t> hashes) {
    std::lock_guard<std::mutex> l(mu);
    set.insert(set.end(), hashes.begin(), hashes.end());
    pending.insert(pending.end(), hashes.begin(), hashes.end());
  }
  std::vector<uint64_t> set, pending;
  int full_requests = 0;  // guarded by mu
};

// The agent publishes the handler's KV events: the whole set (reset) first after every
// registration, then only news (nothing when there is none); a set larger than one message
// allows goes out in parts, the first carrying the reset.
TEST(WorkerAgentTest, KvEventsStartWithTheWholeSetAfterEachRegistration) {
  FakeRouter router("tcp://127.0.0.1:*");
  CachingHandler handler;
  handler.Store({1, 2, 3});
  WorkerAgentOptions o = Options(router.endpoint());
  o.kv_events_interval = 10ms;
  auto agent = WorkerAgent::Start(o, &handler);
  ASSERT_TRUE(agent.ok());
  ASSERT_TRUE(WaitFor([&] { return router.Received<KvEventsMsg>().size() == 1; }, 5s));
  KvEventsMsg first = router.Received<KvEventsMsg>()[0];
  EXPECT_TRUE(first.reset);
  EXPECT_EQ(first.stored, (std::vector<uint64_t>{1, 2, 3}));
  EXPECT_EQ(first.block_tokens, 16u);
  EXPECT_EQ(first.first_chunk_tokens, 32u);
  // Registered before anything was sent: the Register went first.
  EXPECT_FALSE(router.Received<RegisterMsg>().empty());
  handler.Store({4});
  ASSERT_TRUE(WaitFor([&] { return router.Received<KvEventsMsg>().size() == 2; }, 5s));
  const KvEventsMsg news = router.Received<KvEventsMsg>()[1];
  EXPECT_FALSE(news.reset);
  EXPECT_EQ(news.stored, (std::vector<uint64_t>{4}));
  // Quiet ticks send nothing.
  std::this_thread::sleep_for(100ms);
  EXPECT_EQ(router.Received<KvEventsMsg>().size(), 2u);
  // The router forgets the worker: it registers again and starts over with the whole set.
  router.forget_once = true;
  ASSERT_TRUE(WaitFor([&] { return (*agent)->registrations() == 2; }, 5s));
  ASSERT_TRUE(WaitFor([&] { return router.Received<KvEventsMsg>().size() == 3; }, 5s));
  const KvEventsMsg again = router.Received<KvEventsMsg>()[2];
  EXPECT_TRUE(again.reset);
  EXPECT_EQ(again.stored, (std::vector<uint64_t>{1, 2, 3, 4}));
  // A set beyond one message's limit: two parts, the reset on the first.
  std::vector<uint64_t> many(ControlLimits::kMaxKvEventHashes + 5);
  for (size_t i = 0; i < many.size(); ++i) many[i] = 100 + i;
  {
    std::lock_guard<std::mutex> l(handler.mu);
    handler.set.insert(handler.set.end(), many.begin(), many.end());  // only in the whole set
  }
  router.forget_once = true;
  ASSERT_TRUE(WaitFor([&] { return (*agent)->registrations() == 3; }, 5s));
  ASSERT_TRUE(WaitFor([&] { return router.Received<KvEventsMsg>().size() == 5; }, 10s));
  const auto parts = router.Received<KvEventsMsg>();
  EXPECT_TRUE(parts[3].reset);
  EXPECT_FALSE(parts[4].reset);
  EXPECT_EQ(parts[3].stored.size() + parts[4].stored.size(), many.size() + 4);
  {
    std::lock_guard<std::mutex> l(handler.mu);
    EXPECT_EQ(handler.full_requests, 3);
  }
}

// Stamps every load it reports (heartbeats carry it) with the number of loads taken so far,
// and adds up, while unhealthy, the time the agent's thread spent listening: the gaps between
// its Health() checks, each capped at the agent's ListeningClock step (listening_clock.h).
class StampingHandler : public RecordingHandler {
 public:
  WorkerLoad CurrentLoad() override {
    WorkerLoad load = RecordingHandler::CurrentLoad();
    load.queued_tokens = ++loads;
    return load;
  }
  Status Health() override {
    const Status health = RecordingHandler::Health();
    if (!health.ok()) {
      const auto now = std::chrono::steady_clock::now();
      // Called on the agent's thread, before it would send anything in this tick: no load is
      // taken (no heartbeat sent) once an unhealthy answer was given.
      if (stamp_at_silence == 0) stamp_at_silence = loads.load();
      if (last_check != std::chrono::steady_clock::time_point{})
        listened_ns.store(listened_ns.load() +
                          std::chrono::duration_cast<std::chrono::nanoseconds>(
                              std::min<std::chrono::steady_clock::duration>(now - last_check, kListeningStep))
                              .count());
      last_check = now;
    }
    return health;
  }
  static constexpr std::chrono::milliseconds kListeningStep{250};  // the agent's ListeningClock step
  std::atomic<uint64_t> loads{0};
  std::atomic<uint64_t> stamp_at_silence{0};
  std::atomic<int64_t> listened_ns{0};  // written by the agent's thread only
  std::chrono::steady_clock::time_point last_check{};  // agent thread only
};

// A worker whose handler reports it cannot make progress goes silent (no heartbeat, so the
// router times it out and moves its jobs); healthy again, it finds the router lost, drops its
// jobs and registers anew.
//
// Synchronised on what the agent did, not on sleeps: every heartbeat carries a stamp (the
// number of CurrentLoad calls so far), so the test knows which heartbeat was the last one sent
// before the agent saw the flag, and the silent period lasts until the agent's own thread has
// listened (ticks at most ListeningClock's step apart, as the agent counts silence) for longer
// than the router timeout, however slowly the machine runs.
TEST(WorkerAgentTest, UnhealthyWorkerGoesSilentThenRegistersAgain) {
  StampingHandler handler;
  constexpr auto kRouterTimeout = 400ms;  // what FakeRouter's RegisterAck sets
  FakeRouter router("tcp://127.0.0.1:*", 1, kRouterTimeout.count());
  auto agent = WorkerAgent::Start(Options(router.endpoint()), &handler);
  ASSERT_TRUE(agent.ok());
  ASSERT_TRUE(WaitFor([&] { return (*agent)->registered(); }, 5s));
  router.Send(Job(7));
  ASSERT_TRUE(WaitFor([&] { return (*agent)->live_jobs() == 1; }, 5s));
  ASSERT_TRUE(WaitFor([&] { return !router.Received<HeartbeatMsg>().empty(); }, 5s));
  handler.healthy = false;
  ASSERT_TRUE(WaitFor([&] { return handler.stamp_at_silence.load() != 0; }, 5s)) << "the agent never checked health";
  // The last heartbeat sent before the agent saw the flag (it may still be in flight).
  const uint64_t last_stamp = handler.stamp_at_silence.load();
  ASSERT_TRUE(WaitFor([&] {
    const auto hbs = router.Received<HeartbeatMsg>();
    return !hbs.empty() && hbs.back().load.queued_tokens == last_stamp;
  }, 5s)) << "the heartbeat stamped " << last_stamp << " never arrived";
  const size_t heartbeats = router.Received<HeartbeatMsg>().size();
  // Silent past the router timeout as the agent counts it, with a margin for the ack of that
  // last heartbeat.
  ASSERT_TRUE(WaitFor([&] { return std::chrono::nanoseconds(handler.listened_ns.load()) > kRouterTimeout + 300ms; },
                      20s));
  EXPECT_EQ(router.Received<HeartbeatMsg>().size(), heartbeats) << "an unhealthy worker kept heartbeating";
  EXPECT_EQ(handler.loads.load(), last_stamp) << "an unhealthy worker reported its load";
  EXPECT_EQ((*agent)->registrations(), 1);
  handler.healthy = true;
  ASSERT_TRUE(WaitFor([&] { return handler.Aborted().size() == 1; }, 5s)) << "the job of the silent period was kept";
  ASSERT_TRUE(WaitFor([&] { return (*agent)->registrations() == 2 && (*agent)->registered(); }, 5s));
}

// The worker loses the router (no answer past its timeout) while the router still routes a job
// to it: once registered again it reports the dropped job as failed, so the router does not
// wait for output that will never come.
TEST(WorkerAgentTest, JobsDroppedWhileTheRouterWasUnreachableAreReportedOnReturn) {
  FakeRouter router("tcp://127.0.0.1:*");
  RecordingHandler handler;
  auto agent = WorkerAgent::Start(Options(router.endpoint()), &handler);
  ASSERT_TRUE(agent.ok());
  ASSERT_TRUE(WaitFor([&] { return (*agent)->registered(); }, 5s));
  router.Send(Job(5));
  ASSERT_TRUE(WaitFor([&] { return (*agent)->live_jobs() == 1; }, 5s));
  router.silent = true;
  ASSERT_TRUE(WaitFor([&] { return handler.Aborted().size() == 1; }, 5s));
  EXPECT_EQ(handler.Aborted()[0], 5u);
  router.silent = false;
  ASSERT_TRUE(WaitFor([&] { return (*agent)->registrations() == 2 && (*agent)->registered(); }, 5s));
  ASSERT_TRUE(WaitFor([&] {
    for (const auto& ev : router.Received<TokenEventMsg>())
      if (ev.request_id == 5 && ev.error.code() == StatusCode::kUnavailable && ev.finish == FinishReason::kError)
        return true;
    return false;
  }, 5s));
}

TEST(WorkerAgentTest, DrainWaitsForLiveJobsThenDeregisters) {
  FakeRouter router("tcp://127.0.0.1:*");
  RecordingHandler handler;
  auto agent = WorkerAgent::Start(Options(router.endpoint()), &handler);
  ASSERT_TRUE(agent.ok());
  ASSERT_TRUE(WaitFor([&] { return (*agent)->registered(); }, 5s));
  router.Send(Job(1));
  ASSERT_TRUE(WaitFor([&] { return (*agent)->live_jobs() == 1; }, 5s));
  router.Send(DrainMsg{0});
  ASSERT_TRUE(WaitFor([&] { return handler.drained.load(); }, 5s));
  router.Send(Job(2));  // refused while draining
  ASSERT_TRUE(WaitFor([&] {
    for (const auto& ev : router.Received<TokenEventMsg>())
      if (ev.request_id == 2 && ev.error.code() == StatusCode::kUnavailable) return true;
    return false;
  }, 5s));
  EXPECT_TRUE(WaitFor([&] {
    auto hbs = router.Received<HeartbeatMsg>();
    return !hbs.empty() && hbs.back().draining;
  }, 5s));
  EXPECT_EQ((*agent)->state(), WorkerAgent::State::kDraining);
  TokenEventMsg done;
  done.request_id = 1;
  done.finish = FinishReason::kStop;
  (*agent)->SendTokenEvent(done);
  EXPECT_EQ((*agent)->WaitForExit(5s), WorkerAgent::State::kDeregistered);
  ASSERT_TRUE(WaitFor([&] { return router.Received<DeregisterMsg>().size() == 1; }, 5s));
  EXPECT_EQ(router.Received<DeregisterMsg>()[0].reason, "drained");
}

TEST(WorkerAgentTest, RefusalIsFinal) {
  FakeRouter router("tcp://127.0.0.1:*");
  router.refuse = true;
  RecordingHandler handler;
  auto agent = WorkerAgent::Start(Options(router.endpoint()), &handler);
  ASSERT_TRUE(agent.ok());
  EXPECT_EQ((*agent)->WaitForExit(5s), WorkerAgent::State::kRefused);
  EXPECT_EQ((*agent)->refusal().code(), StatusCode::kFailedPrecondition);
}

TEST(WorkerAgentTest, BadOptions) {
  RecordingHandler handler;
  WorkerAgentOptions o = Options("tcp://127.0.0.1:1");
  o.worker_id = "";
  EXPECT_EQ(WorkerAgent::Start(o, &handler).status().code(), StatusCode::kInvalidArgument);
  o = Options("tcp://127.0.0.1:1");
  o.router_timeout = o.heartbeat_interval;
  EXPECT_EQ(WorkerAgent::Start(o, &handler).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(WorkerAgent::Start(Options("tcp://127.0.0.1:1"), nullptr).status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace pdserve::services
