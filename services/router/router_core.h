// RouterCore: the router's control plane and request routing, without HTTP.
//
// It binds the ROUTER ControlChannel, keeps the WorkerRegistry, picks workers for each request
// (routing_policy.h), sends the jobs, relays the disaggregated hand-offs and feeds each
// request's token events to its ActiveRequest. HTTP handlers (RouterServer) call Submit() and
// Cancel(); everything arriving from workers is handled on the channel's thread.
//
// Request flows (proto/control.capnp has the full protocol):
//   colocated      Job(colocated) -> C; C's token events -> the request.
//   disaggregated  Job(decode) -> D; D's kvReserved -> Job(prefill, descriptor) -> P; P's single
//                  event (the first token, TTFT) -> the request and FirstToken -> D; D's events
//                  (from output index 1) -> the request. A request that ends at the first token
//                  gets Abort -> D (frees the reservation).
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
// Thread-safety: Submit, Cancel, Health, WorkersJson, DrainWorker: any thread. One mutex
// guards the registry and the route table; sends only queue to the channel.
#pragma once

#include <chrono>
#include <cstdint>
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
  RoutingPolicy prefill_policy = RoutingPolicy::kLeastOutstandingTokens;
  RoutingPolicy decode_policy = RoutingPolicy::kKvCapacityAware;
  RoutingPolicy colocated_policy = RoutingPolicy::kLeastOutstandingTokens;
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
  services::SamplingSpec sampling;        // max_tokens is resolved by Submit
  std::optional<uint32_t> max_tokens;     // as the client asked
  std::chrono::steady_clock::time_point arrival{};
  int64_t deadline_unix_ms = 0;
};

// Whether an attempt that a worker ended with `finish` / `error` (not at the router's asking) is
// worth a new attempt elsewhere: aborts by the worker (it lost the router, a drain timed out) and
// failures of a worker or of the KV transfer (Unavailable, Aborted, Internal, Unknown, DataLoss,
// DeadlineExceeded: a lease or transfer timeout; the router separately refuses to retry past
// the request's own deadline). Not retried: the request itself is bad (InvalidArgument,
// OutOfRange, FailedPrecondition, NotFound, ...) or a worker is full (ResourceExhausted, a 429).
bool IsRetriableFailure(services::FinishReason finish, const Status& error);

struct ClusterHealth {
  size_t prefill = 0, decode = 0, colocated = 0, draining = 0;
  bool ready = false;
};

class RouterCore {
 public:
  // Errors: ControlChannel::Start's (the control endpoint cannot be bound).
  static Result<std::unique_ptr<RouterCore>> Start(RouterCoreOptions options, RouterMetrics* metrics);
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

  ClusterHealth Health() const;
  nlohmann::json WorkersJson() const;
  // A copy of every registered worker's entry (GET /v1/workers: workers_view.h).
  std::vector<WorkerEntry> WorkerSnapshot() const;
  // Sends Drain to a worker and stops routing to it. Errors: NotFound.
  Status DrainWorker(const std::string& worker_id, uint32_t timeout_ms);

  const std::string& control_endpoint() const { return channel_->endpoint(); }
  // CURVE handshakes refused by the allowed-clients list (control_channel.h).
  uint64_t refused_handshakes() const { return channel_->refused_handshakes(); }
  uint64_t incarnation() const { return incarnation_; }
  size_t outstanding() const;

 private:
  // One request and its current attempt. The route table is keyed by the attempt's job id (the
  // request_id on the wire); the first attempt's job id is the ActiveRequest's id.
  struct Route {
    std::shared_ptr<ActiveRequest> request;
    // What a new attempt needs: the client's prompt and sampling (max_tokens: the request's
    // resolved budget), the deadline, and every token pushed to the client so far.
    std::vector<int32_t> prompt;
    services::SamplingSpec sampling;
    int64_t deadline_unix_ms = 0;
    std::vector<int32_t> delivered;
    uint32_t migrations = 0;
    // The current attempt.
    uint64_t job_id = 0;
    bool disaggregated = false;
    std::string out_peer;      // colocated or decode worker: produces the tokens
    std::string prefill_peer;  // disaggregated only
    bool out_live = false;     // that worker still holds the job
    bool prefill_live = false;
    bool first_token_seen = false;  // of this attempt
    std::chrono::steady_clock::time_point last_output{};  // the attempt's latest token
    services::JobMsg prefill_job;  // sent once the decode worker reserved KV
    int64_t out_tokens_charge = 0;
    int64_t out_blocks_charge = 0;
    int64_t prefill_tokens_charge = 0;
  };

  RouterCore(RouterCoreOptions options, RouterMetrics* metrics);
  void OnMessage(std::string_view peer, std::string_view payload);
  void OnTick(std::chrono::steady_clock::time_point now);
  // Under mu_:
  void SendLocked(const std::string& peer, const services::ControlMessage& message);
  void OnTokenEventLocked(const std::string& peer, services::TokenEventMsg ev);
  void OnKvReservedLocked(const std::string& peer, services::KvReservedMsg msg);
  void WorkerGoneLocked(const WorkerEntry& worker, const std::string& reason);
  // Whether the request can be served at all now: disaggregated (true) or colocated (false).
  Result<bool> ChooseModeLocked() const;
  // Starts an attempt of `route` as job `job_id`: picks the workers for `prompt` with
  // `max_tokens` (nullopt: the default / context limit) and sends the first job. Fills the
  // route's attempt fields; returns the resolved max_tokens. Errors: Choose's.
  Result<uint32_t> DispatchLocked(Route& route, uint64_t job_id, const std::string& tag,
                                  const std::vector<int32_t>& prompt, std::optional<uint32_t> max_tokens);
  // Migrates every decoding attempt that produced nothing for options_.stall_timeout.
  void MigrateStalledLocked(std::chrono::steady_clock::time_point now);
  // The current attempt of route `job_id` failed (`why`; `failed_role`: the worker that
  // failed, `failed_peer` if it is still registered): ends it and starts the next one (on
  // other workers than failed_peer when the role has any), or ends the request with an error.
  void MigrateLocked(uint64_t job_id, services::WorkerRole failed_role, const Status& why,
                     const std::string& failed_peer = {});
  // Ends a route: releases charges, aborts its live workers, forgets it.
  void EndRouteLocked(uint64_t job_id, std::string_view abort_reason);
  // Ends the current attempt only (aborts its live workers, releases its charges).
  void EndAttemptLocked(Route& route, std::string_view abort_reason);
  void ReleaseLocked(Route& route);
  // Whether the route still needs the worker at `peer` (a prefill worker is done with a
  // request once it sent the first token).
  bool NeedsPeer(const Route& route, const std::string& peer) const;

  const RouterCoreOptions options_;
  RouterMetrics* const metrics_;
  const uint64_t incarnation_;

  mutable std::mutex mu_;
  WorkerRegistry registry_;
  std::unordered_map<uint64_t, Route> routes_;              // by the current attempt's job id
  std::unordered_map<uint64_t, uint64_t> job_of_request_;  // ActiveRequest id -> current job id
  uint64_t next_request_id_;
  uint64_t cursor_prefill_ = 0, cursor_decode_ = 0, cursor_colocated_ = 0;
  services::ListeningClock listening_{std::chrono::milliseconds(250)};  // OnTick only

  std::unique_ptr<services::ControlChannel> channel_;  // last: stopped before the rest
};

}  // namespace pdserve::router
