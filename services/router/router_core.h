// RouterCore: the router's control plane and request routing, without HTTP.
//
// It keeps the WorkerRegistry, picks workers for each request (routing_policy.h), sends the
// jobs, relays the disaggregated hand-offs and feeds each request's token events to its
// ActiveRequest. HTTP handlers (RouterServer) call Submit() and Cancel(); everything arriving
// from workers (HandleMessage) and the timer (HandleTick) run on the ROUTER ControlChannel's
// thread (Start), or on the caller's for a core without a socket (CreateDetached).
//
// Request flows (proto/control.capnp has the full protocol):
//   colocated      Job(colocated) -> C; C's token events -> the request.
//   disaggregated  Job(decode) -> D; D's kvReserved -> Job(prefill, descriptor) -> P; P's single
//                  event (the first token, TTFT) -> the request and FirstToken -> D; D's events
//                  (from output index 1) -> the request. A request that ends at the first token
//                  gets Abort -> D (frees the reservation).
// Each try of a request on a set of workers is an Attempt (attempt.h: the state machine of
// those flows); the work it puts on each worker is one charge per job in the ChargeLedger
// (charge_ledger.h), opened when the attempt is placed and released exactly once when its job
// ends, whichever way (finish, error, cancel, worker gone, migration).
// Failures and migration (docs/router.md "Migration"): a worker that times out (no heartbeat
// for heartbeat_timeout), deregisters or is replaced by a restart, or that ends an attempt with
// a retriable failure (IsRetriableFailure), hands its requests to a new attempt: the request is
// dispatched again, with a new job id, to workers chosen afresh, with the client's prompt plus
// every token already delivered as the prompt and the rest of the output budget as max_tokens;
// the new attempt's tokens continue the client's stream. After router.max_migrations attempts
// (or with no worker left) the request ends with an error event (kUnavailable). An event for a
// job id the router does not know (a finished request, or an earlier attempt) is answered with
// Abort so a worker never computes for nobody.
//
// Thread-safety: every public method may be called from any thread. One mutex guards the
// registry, the ledger and the route table; sends only queue (to the channel, or SendFn).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/status.h"
#include "services/control/control_channel.h"
#include "services/control/control_messages.h"
#include "services/worker/agent/listening_clock.h"
#include "services/router/active_request.h"
#include "services/router/attempt.h"
#include "services/router/charge_ledger.h"
#include "services/router/kv_index.h"
#include "services/router/router_metrics.h"
#include "services/router/routing_policy.h"
#include "services/router/worker_registry.h"

namespace pdserve::router {

enum class ServingMode { kAuto, kDisaggregated, kColocated };

struct RouterCoreOptions {
  std::string control_endpoint = "tcp://127.0.0.1:*";
  std::string model_name = "pdserve";
  uint64_t compat_hash = 0;
  uint32_t tokenizer_vocab_size = 0;  // models with a smaller vocabulary are refused (0: no check)
  std::chrono::milliseconds heartbeat_interval{500};
  std::chrono::milliseconds heartbeat_timeout{2500};
  ServingMode mode = ServingMode::kAuto;
  RoutingPolicy prefill_policy = RoutingPolicy::kKvAware;
  RoutingPolicy decode_policy = RoutingPolicy::kKvCapacityAware;
  RoutingPolicy colocated_policy = RoutingPolicy::kKvAware;
  // Decode-side hits (docs/router.md): a disaggregated request whose decode worker's prefix
  // cache is predicted to hold all of its prompt but at most this many tokens runs on that
  // worker alone (a colocated job: it maps its cached prefix and computes the rest), instead of
  // a prefill worker computing the whole prompt again. 0: always through a prefill worker.
  uint32_t decode_local_prefill_tokens = 256;
  // Pulls (docs/prefix-cache.md "Pulls"): a prefill worker whose own cache holds at least this
  // many tokens less of the prompt than another worker's (prefill or decode, one-process, same
  // KV namespace) has that worker write the difference into its blocks instead of computing it.
  // Moving a block's KV costs far less than computing it (a 2K-token prefix of the small model
  // is ~9 MB: milliseconds over shm or RDMA, seconds of compute), so the bar is only there to
  // skip pulls whose round trip outweighs a block or two. 0: no pulls.
  uint32_t pull_min_tokens = 128;
  uint32_t default_max_tokens = 0;
  uint32_t max_outstanding_requests = 1024;
  // Re-dispatches of one request after worker failures; 0 fails requests at once.
  uint32_t max_migrations = 3;
  // A decoding attempt (it produced a token) with no further output for this long is treated
  // as a failure of its worker (a wedged engine behind a live control thread). 0: off.
  std::chrono::milliseconds stall_timeout{60000};
  services::CurveOptions control_curve;  // CURVE on the control socket (disabled: plain TCP)
};

struct SubmitSpec {
  std::string tag;                        // client-visible request id
  std::vector<int32_t> prompt;
  SamplingParams sampling;        // max_tokens is resolved by Submit
  std::optional<uint32_t> max_tokens;     // as the client asked
  std::chrono::steady_clock::time_point arrival{};
  int64_t deadline_unix_ms = 0;
  // The output constraint (grammar/constraint.h), sent with every job of every attempt of
  // the request (colocated, decode, prefill, and after a migration).
  grammar::Constraint constraint;
  // Non-zero: the ActiveRequest id of a sibling (another choice of the same client request);
  // its current workers are preferred when they can take this request too.
  uint64_t affinity = 0;
};

// Whether an attempt that a worker ended with `finish` / `error` (not at the router's asking) is
// worth a new attempt elsewhere: aborts by the worker (it lost the router, a drain timed out) and
// failures of a worker or of the KV transfer (Unavailable, Aborted, Internal, Unknown, DataLoss,
// DeadlineExceeded: a lease or transfer timeout; the router separately refuses to retry past
// the request's own deadline). Not retried: the request itself is bad (InvalidArgument,
// OutOfRange, FailedPrecondition, NotFound, ...) or a worker is full (ResourceExhausted, a 429).
bool IsRetriableFailure(FinishReason finish, const Status& error);

struct ClusterHealth {
  size_t prefill = 0, decode = 0, colocated = 0, draining = 0;
  bool ready = false;
};

class RouterCore {
 public:
  // Sends one control message to a worker. Called under the core's lock: it must only queue
  // (never block, never call back into the core).
  using SendFn = std::function<void(const std::string& peer, const services::ControlMessage& message)>;

  // Binds the control endpoint and serves it on the ControlChannel's thread.
  // Errors: ControlChannel::Start's (the control endpoint cannot be bound).
  static Result<std::unique_ptr<RouterCore>> Start(RouterCoreOptions options, RouterMetrics* metrics);
  // A core without a socket: messages to workers go to `send`, and the caller delivers the
  // workers' messages (HandleMessage) and the timer (HandleTick). Everything else is the same
  // as a started core (its unit test drives one; router_core_test.cc).
  static std::unique_ptr<RouterCore> CreateDetached(RouterCoreOptions options, RouterMetrics* metrics, SendFn send);
  ~RouterCore();
  RouterCore(const RouterCore&) = delete;
  RouterCore& operator=(const RouterCore&) = delete;

  // Picks workers and dispatches the request. The returned ActiveRequest receives its events.
  // Errors: Unavailable (no ready worker for the request), InvalidArgument (exceeds the
  // context length; OpenAI's message), ResourceExhausted (router.max_outstanding_requests or
  // no KV capacity).
  Result<std::shared_ptr<ActiveRequest>> Submit(SubmitSpec spec);
  // Stops a request (ActiveRequest::id()): Abort to its workers that still run it; the route is
  // forgotten. No-op for a finished request.
  void Cancel(uint64_t request_id, std::string_view reason);

  // One control message from the worker at `peer` (encoded); malformed ones are counted and
  // dropped. A started core's channel thread calls it; a detached core's owner does.
  void HandleMessage(std::string_view peer, std::string_view payload);
  // The periodic timer (every ~50 ms): worker expiry, stalled streams, worker gauges.
  void HandleTick(std::chrono::steady_clock::time_point now);

  ClusterHealth Health() const;
  nlohmann::json WorkersJson() const;
  // A copy of every registered worker's entry (GET /v1/workers: workers_view.h).
  std::vector<WorkerEntry> WorkerSnapshot() const;
  // Sends Drain to a worker and stops routing to it. Errors: NotFound.
  Status DrainWorker(const std::string& worker_id, uint32_t timeout_ms);

  // The bound control endpoint ("" for a detached core).
  const std::string& control_endpoint() const;
  // CURVE handshakes refused by the allowed-clients list (control_channel.h).
  uint64_t refused_handshakes() const { return channel_ ? channel_->refused_handshakes() : 0; }
  uint64_t incarnation() const { return incarnation_; }
  size_t outstanding() const;
  // The accounting check: OK when every worker's outstanding requests and tokens equal the sum
  // of the open charges of the attempts placed on it (charge_ledger.h), and no attempt that
  // ended still holds a charge.
  Status AuditAccounting() const;
  // Open charges (one per job of a live attempt).
  size_t open_charges() const;

 private:
  // One request and its current attempt. The route table is keyed by the attempt's job id (the
  // request_id on the wire); the first attempt's job id is the ActiveRequest's id.
  struct Route {
    std::shared_ptr<ActiveRequest> request;
    // What a new attempt needs: the client's prompt and sampling (max_tokens: the request's
    // resolved budget), the deadline, and every token pushed to the client so far.
    std::vector<int32_t> prompt;
    SamplingParams sampling;
    grammar::Constraint constraint;
    int64_t deadline_unix_ms = 0;
    std::vector<int32_t> delivered;
    uint32_t migrations = 0;
    Attempt attempt;               // the current one
    services::JobMsg prefill_job;  // disaggregated: sent once the decode worker reserved KV
    // The current attempt's predicted prefix-cache hit on the worker computing the prompt
    // (prefill, colocated); counted with the actual one when that worker reports it.
    std::optional<int64_t> predicted_hit_tokens;
    // The current attempt's pull: the worker that holds the prefix (its peer and registration),
    // and the prefix's tokens, until the prefill worker's kvPull is forwarded.
    std::string pull_holder_peer;
    uint64_t pull_holder_registration = 0;
    std::vector<int32_t> pull_prefix;
  };
  // Why the current attempt failed, for MigrateLocked.
  struct Failure {
    services::WorkerRole role;  // of the worker that failed
    Status why;
    std::string released_peer;  // let go of its job (ended it, or is gone): no Abort to it
    std::string avoid_peer;     // still registered: passed over for the next attempt if possible
  };

  RouterCore(RouterCoreOptions options, RouterMetrics* metrics, SendFn send);
  // Under mu_:
  void SendLocked(const std::string& peer, const services::ControlMessage& message);
  void OnTokenEventLocked(const std::string& peer, services::TokenEventMsg ev);
  // An event of the attempt's prefill / output job (from `peer`), not a retriable failure.
  void OnPrefillEventLocked(Route& route, const std::string& peer, services::TokenEventMsg ev);
  void OnOutputEventLocked(Route& route, const std::string& peer, services::TokenEventMsg ev);
  void OnKvReservedLocked(const std::string& peer, services::KvReservedMsg msg);
  void OnKvEventsLocked(const std::string& peer, const services::KvEventsMsg& msg);
  // Pulls: the prefill worker's reservation goes to the holder as kvPush; the holder's failure
  // goes back to the prefill worker.
  void OnKvPullLocked(const std::string& peer, services::KvPullMsg msg);
  void OnKvPushFailedLocked(const std::string& peer, services::KvPushFailedMsg msg);
  // The predicted hit against what the worker computing the prompt reports (metrics).
  void CountPrefixHitLocked(Route& route, const std::string& peer, const services::TokenEventMsg& ev);
  void WorkerGoneLocked(const WorkerEntry& worker, const std::string& reason);
  // Whether the request can be served at all now: disaggregated (true) or colocated (false).
  Result<bool> ChooseModeLocked() const;
  // Starts an attempt of `route` as job `job_id`: picks the workers for `prompt` with
  // `max_tokens` (nullopt: the default / context limit), charges them (ledger_) and sends the
  // first job. Sets route.attempt; returns the resolved max_tokens. `prefer`: an attempt whose
  // workers are taken when they can hold this one too (a sibling choice's). Errors: Choose's
  // (nothing charged, nothing sent).
  Result<uint32_t> DispatchLocked(Route& route, uint64_t job_id, const std::string& tag,
                                  const std::vector<int32_t>& prompt, std::optional<uint32_t> max_tokens,
                                  const Attempt* prefer = nullptr);
  // Migrates every decoding attempt that produced nothing for options_.stall_timeout.
  void MigrateStalledLocked(std::chrono::steady_clock::time_point now);
  // The current attempt of route `job_id` failed: ends it and starts the next one (on other
  // workers than failure.avoid_peer when its role has any), or ends the request with an error.
  void MigrateLocked(uint64_t job_id, const Failure& failure);
  // Ends a route: ends its attempt (kFinished) and forgets the route.
  void EndRouteLocked(uint64_t job_id, std::string_view abort_reason, std::string_view released_peer = {});
  // Ends the current attempt (-> `terminal`): Abort to the workers still holding its jobs
  // (except `released_peer`), and its charges are released.
  void EndAttemptLocked(Route& route, AttemptState terminal, std::string_view abort_reason,
                        std::string_view released_peer);

  const RouterCoreOptions options_;
  RouterMetrics* const metrics_;
  const uint64_t incarnation_;

  mutable std::mutex mu_;
  WorkerRegistry registry_;
  ChargeLedger ledger_{&registry_};                         // the registry's accounting
  KvIndex kv_index_;                                        // the workers' prefix caches
  std::unordered_map<uint64_t, Route> routes_;              // by the current attempt's job id
  std::unordered_map<uint64_t, uint64_t> job_of_request_;  // ActiveRequest id -> current job id
  uint64_t next_request_id_;
  uint64_t cursor_prefill_ = 0, cursor_decode_ = 0, cursor_colocated_ = 0;
  services::ListeningClock listening_{std::chrono::milliseconds(250)};  // HandleTick only
  SendFn send_;  // a detached core's; a started core sends through channel_

  std::unique_ptr<services::ControlChannel> channel_;  // last: stopped before the rest
};

}  // namespace pdserve::router
