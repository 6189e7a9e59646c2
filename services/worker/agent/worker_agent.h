// WorkerAgent: the worker side of the control plane, shared by every worker service
// (prefill, decode, colocated, and the echo test worker). It owns the DEALER ControlChannel to
// the router and does everything protocol-related; the service only implements WorkerHandler
// over its engine.
//
// What the agent does (proto/control.capnp, docs/control-plane.md):
//   * registers (retrying every register_retry until the router answers, so workers may start
//     before the router), and registers again when the router restarts or forgets it;
//   * sends a heartbeat with the handler's CurrentLoad() every heartbeat interval (the
//     router's RegisterAck sets it);
//   * declares the router lost after router_timeout without a heartbeat ack, aborts every live
//     job (their HTTP clients were connected to that router) and registers again;
//   * turns Job / FirstToken / Abort / Drain messages into handler calls and the service's
//     token events / KV reservations into messages;
//   * tracks live jobs: events for a job that is not live (finished, aborted by a lost router)
//     are dropped, so a restarted router never sees stale events;
//   * drains: no new jobs, then Deregister once the last live job finished (or after the drain
//     timeout, aborting the rest);
//   * publishes the handler's prefix-cache events (TakeKvEvents) every kv_events_interval while
//     registered, the first time after each registration with the whole set (reset).
//
// Threading: one owner thread (the ControlChannel's) runs every WorkerHandler call except
// PrepareJob, which runs on the agent's JobPreparer thread (job_preparer.h) so that slow set-up
// never holds the heartbeats. The Send* and BeginDrain methods may be called from any thread
// (e.g. the engine step thread). Ownership: the handler must outlive the agent. Destroying the
// agent sends Deregister (best effort) and joins both threads; no handler call happens after
// the destructor returns.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>

#include <prometheus/registry.h>

#include "common/status.h"
#include "services/control/control_channel.h"
#include "services/control/control_messages.h"
#include "services/worker/agent/job_preparer.h"
#include "services/worker/agent/listening_clock.h"
#include "services/worker/agent/worker_metrics.h"

namespace pdserve::services {

// Implemented by each worker service over its engine. Every call runs on the agent's thread and
// must return quickly (queue the work to the engine); none may call back into WorkerAgent's
// destructor.
class WorkerHandler {
 public:
  virtual ~WorkerHandler() = default;

  // A new job (the agent already checked the id is not live and the worker is not draining).
  // OK: the job is the handler's; it must end with exactly one finishing event
  // (SendTokenEvent with finish != kNone or an error; for a prefill job its single event).
  // An error: the agent reports it to the router as the job's finishing event (use
  // InvalidArgument for a job this worker can never run, ResourceExhausted when full,
  // Unavailable when not ready).
  // Phase kColocated: generate and stream tokens. Phase kDecode: reserve KV for the prompt,
  // then SendKvReserved (or fail the job), wait for CommitFirstToken. Phase kPrefill: compute
  // the prompt, write its KV through job.kv_descriptor, then send the first token (index 0).
  virtual Status StartJob(const JobMsg& job) = 0;

  // Set-up a job needs before StartJob that may take long (building a grammar for its
  // constraint): when NeedsPreparation says so, the agent runs PrepareJob on its preparer
  // thread (job_preparer.h), not on its own, and calls StartJob once it returned OK -- unless the
  // job was aborted meanwhile; an error refuses the job as StartJob's would. Both are
  // thread-safe; NeedsPreparation runs on the agent's thread and must be quick.
  virtual bool NeedsPreparation(const JobMsg& job) { return false; }
  virtual Status PrepareJob(const JobMsg& job) { return Status::Ok(); }

  // Decode phase: the prefill worker's first token (relayed by the router). The handler starts
  // decoding from output index 1 once the KV transfer has completed too. An error fails the job
  // (the agent sends the error and calls AbortJob so the handler frees the reservation).
  virtual Status CommitFirstToken(const FirstTokenMsg& first) {
    return Status::Unimplemented("this worker does not run decode jobs");
  }

  // Stop a live job; the handler still ends it with a finishing event (finish kAbort).
  virtual void AbortJob(uint64_t request_id, std::string_view reason) = 0;

  // Pulls (docs/prefix-cache.md "Pulls"). Holder side: start writing the cached KV the push
  // names into the puller's blocks (a failure after that is the handler's to report with
  // SendKvPushFailed). An error here is sent back as kvPushFailed by the agent. Called on the
  // agent's thread while registered; must not block. The default: Unimplemented (a worker
  // without transferable KV).
  virtual Status PushKv(const KvPushMsg& push) {
    return Status::Unimplemented("this worker cannot write its KV to another worker");
  }
  // Puller side: the holder cannot write the pull of live job `failed.request_id`: compute the
  // prefix instead. Called on the agent's thread.
  virtual void PullFailed(const KvPushFailedMsg& failed) {}

  // The router (or a local SIGTERM) asked to drain; the agent refuses new jobs itself. Optional.
  virtual void OnDrain() {}

  // The load to report in the next heartbeat.
  virtual WorkerLoad CurrentLoad() = 0;

  // Non-OK: the worker cannot make progress (e.g. its engine is stuck in a step). The agent then
  // sends no heartbeat and no registration, so the router removes the worker and moves its
  // requests; once healthy again the worker finds the router forgot it, drops its jobs and
  // registers anew (as after a lost router). Called on the agent's thread every tick.
  virtual Status Health() { return Status::Ok(); }

  // The prefix-cache events since the last call (KvEventsMsg; docs/router.md "KV-aware
  // routing"), or with `full` the whole set with reset. nullopt: this worker has no prefix
  // cache (the default). Called on the agent's thread, only while registered.
  virtual std::optional<KvEventsMsg> TakeKvEvents(bool full) { return std::nullopt; }
};

struct WorkerAgentOptions {
  std::string router_address;     // "tcp://HOST:PORT" of the router's control socket
  std::string worker_id;          // unique in the cluster
  WorkerRole role = WorkerRole::kColocated;
  std::string model_name;
  uint64_t compat_hash = 0;
  std::string http_address;       // where this worker's /metrics is served
  std::string transfer_address;   // KV transfer layer address (prefill / decode)
  WorkerCapacity capacity;         // capacity.dp_ranks: DP ranks of this worker's instance
  std::string instance_id;         // a DP rank of a multi-rank instance ("": one process)
  uint32_t dp_rank = 0;
  uint32_t vocab_size = 0;         // the model's vocabulary (0: not a model)
  uint64_t kv_namespace = 0;       // the engine's prefix-cache namespace (0: cache off)
  std::chrono::milliseconds register_retry{250};
  // Used until the router's RegisterAck says otherwise.
  std::chrono::milliseconds heartbeat_interval{500};
  std::chrono::milliseconds router_timeout{2500};
  std::chrono::milliseconds tick{20};
  // How often the prefix-cache events go out (when there are any): the router's index lags
  // the caches by about this much (a stale entry costs a misprediction, not an error).
  std::chrono::milliseconds kv_events_interval{100};
  // CURVE on the control connection (curve_keys.h; disabled: plain TCP).
  CurveOptions curve;
  // Agent metrics are registered here when set (see worker_metrics.h).
  std::shared_ptr<prometheus::Registry> metrics_registry;
};

class WorkerAgent {
 public:
  enum class State { kRegistering, kRegistered, kDraining, kDeregistered, kRefused };
  static const char* StateName(State s);

  // Starts the control thread (registration begins at once). Errors: InvalidArgument (options),
  // and ControlChannel::Start's errors.
  static Result<std::unique_ptr<WorkerAgent>> Start(WorkerAgentOptions options, WorkerHandler* handler);
  ~WorkerAgent();
  WorkerAgent(const WorkerAgent&) = delete;
  WorkerAgent& operator=(const WorkerAgent&) = delete;

  // Any thread. Dropped (and counted) when the job is not live.
  void SendTokenEvent(TokenEventMsg event);
  void SendKvReserved(KvReservedMsg reserved);
  // Pulls: the puller's reservation (dropped unless its job is live), and the holder's failure.
  void SendKvPull(KvPullMsg pull);
  void SendKvPushFailed(KvPushFailedMsg failed);

  // Any thread: drain as if the router had asked (e.g. on SIGTERM). timeout 0: wait for the
  // live jobs however long they take.
  void BeginDrain(std::chrono::milliseconds timeout);

  // Blocks until the state is kDeregistered or kRefused, or the timeout passes.
  State WaitForExit(std::chrono::milliseconds timeout);

  State state() const;
  bool registered() const { return state() == State::kRegistered; }
  // Why the router refused us (OK unless state() == kRefused).
  Status refusal() const;
  uint64_t registrations() const;
  size_t live_jobs() const;
  uint64_t router_incarnation() const;
  const WorkerAgentOptions& options() const { return options_; }
  // The agent's metrics (nullptr without options.metrics_registry); engine-backed services feed
  // its queue-time and KV-transfer series. Thread-safe (prometheus-cpp).
  WorkerMetrics* metrics() const { return metrics_.get(); }

 private:
  WorkerAgent(WorkerAgentOptions options, WorkerHandler* handler);
  // Owner-thread handlers.
  void OnMessage(std::string_view payload);
  void OnTick(std::chrono::steady_clock::time_point now);
  void OnJob(JobMsg job);
  // Hands a live job to the handler (OnJob's end, or once prepared).
  void StartLiveJob(const JobMsg& job);
  // Starts (or refuses) the jobs the preparer has finished with.
  void StartPreparedJobs();
  // A job still being prepared (the handler has not seen it) ends here with an abort event.
  // False when `request_id` is not being prepared.
  bool AbortPreparing(uint64_t request_id, std::string_view reason);
  void SendRegister();
  void SendHeartbeat();
  // The handler's KV events (the whole set when kv_resync_), split to the control-plane limits.
  void SendKvEvents();
  // Aborts every live job and forgets it (its events are dropped from now on).
  // Aborts every live job in the handler; returns their ids.
  std::vector<uint64_t> AbortAll(std::string_view reason);
  void MaybeFinishDrain(std::chrono::steady_clock::time_point now);
  void Send(const ControlMessage& message);
  void SetState(State s);
  // Sends a finishing error event for a job that never became live.
  void RejectJob(uint64_t request_id, const Status& status);

  const WorkerAgentOptions options_;
  WorkerHandler* const handler_;
  const uint64_t incarnation_;
  std::unique_ptr<WorkerMetrics> metrics_;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  State state_ = State::kRegistering;
  Status refusal_;
  uint64_t registrations_ = 0;
  uint64_t router_incarnation_ = 0;
  std::unordered_map<uint64_t, JobPhase> live_;  // request id -> phase
  bool drain_requested_ = false;                 // set by BeginDrain, applied on the owner thread
  std::chrono::milliseconds drain_timeout_{0};

  // Owner-thread state.
  std::chrono::milliseconds heartbeat_interval_;
  std::chrono::milliseconds router_timeout_;
  std::chrono::steady_clock::time_point next_register_{};
  // Unanswered registrations in a row: the retry backs off (register_retry doubling up to
  // kMaxRegisterRetry) and a warning is logged at growing intervals, so a worker whose router is
  // down says so without flooding the log.
  uint32_t register_attempts_ = 0;
  std::chrono::steady_clock::time_point registering_since_{};
  std::chrono::steady_clock::time_point next_register_warning_{};
  std::chrono::milliseconds register_warning_interval_{1000};
  std::chrono::steady_clock::time_point next_heartbeat_{};
  std::chrono::steady_clock::time_point last_router_contact_{};
  // This thread's own stalls are not the router's silence (listening_clock.h).
  ListeningClock listening_{std::chrono::milliseconds(250)};
  std::chrono::steady_clock::time_point drain_deadline_{};
  bool drain_aborted_ = false;
  uint64_t heartbeat_seq_ = 0;
  // Heartbeats numbered below this were sent before the current registration: their acks
  // describe a registration that no longer exists and are ignored.
  uint64_t first_seq_of_registration_ = 1;
  // Jobs dropped when this worker gave the router up for lost. The router may still believe
  // they run here (it did not time us out): once registered again, each gets an error event,
  // so the router moves or fails it at once instead of waiting for its stall timeout.
  std::vector<uint64_t> dropped_while_lost_;
  uint64_t incarnation_when_lost_ = 0;
  bool unhealthy_ = false;  // the handler's Health() failed at the last tick (agent thread)
  // The router has nothing (or something stale) of our cache: the next KV events are the whole
  // set. Set by every registration.
  bool kv_resync_ = true;
  std::chrono::steady_clock::time_point next_kv_events_{};
  // Live jobs with the preparer (request id -> its prompt length, for an abort event).
  std::unordered_map<uint64_t, uint32_t> preparing_;

  std::unique_ptr<JobPreparer> preparer_;    // before channel_: the owner thread submits to it
  std::unique_ptr<ControlChannel> channel_;  // last: its thread stops before the rest goes
};

}  // namespace pdserve::services
