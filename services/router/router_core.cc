#include "services/router/router_core.h"

#include <fmt/format.h>

#include "common/check.h"
#include "common/logging.h"
#include "services/control/control_codec.h"
#include "services/common/process_util.h"
#include "services/common/request_log.h"

namespace pdserve::router {

using services::ControlMessage;
using pdserve::StatusCode;
using services::WorkerRole;

namespace {
std::string HexPeer(std::string_view peer) {
  std::string out;
  for (unsigned char c : peer) out += fmt::format("{:02x}", c);
  return out;
}
}  // namespace

RouterCore::RouterCore(RouterCoreOptions options, RouterMetrics* metrics, SendFn send)
    : options_(std::move(options)),
      metrics_(metrics),
      incarnation_(services::RandomU64()),
      registry_({options_.model_name, options_.compat_hash, options_.heartbeat_timeout, options_.tokenizer_vocab_size}),
      // Request ids carry the incarnation in the high half: ids of a restarted router never
      // collide with jobs a worker may still be finishing for the previous one.
      next_request_id_((incarnation_ & 0xffffffffull) << 32 | 1),
      send_(std::move(send)) {}

Result<std::unique_ptr<RouterCore>> RouterCore::Start(RouterCoreOptions options, RouterMetrics* metrics) {
  if (!metrics) return Status::InvalidArgument("RouterCore needs metrics");
  std::unique_ptr<RouterCore> core(new RouterCore(std::move(options), metrics, nullptr));
  RouterCore* self = core.get();
  services::ControlChannelOptions co;
  co.kind = services::ControlChannelOptions::Kind::kRouterBind;
  co.endpoint = self->options_.control_endpoint;
  co.tick_interval = std::chrono::milliseconds(50);
  co.name = "router";
  // Messages can arrive before channel_ is assigned below; the handlers touch channel_ only
  // under mu_, which Start holds while assigning it.
  std::unique_lock<std::mutex> lock(self->mu_);
  PDSERVE_ASSIGN_OR_RETURN(
      self->channel_,
      services::ControlChannel::Start(
          co, [self](std::string_view peer, std::string_view payload) { self->HandleMessage(peer, payload); },
          [self](std::chrono::steady_clock::time_point now) { self->HandleTick(now); }, self->options_.control_curve));
  lock.unlock();
  GetLogger("router")->info("control plane on {} (incarnation {:x})", self->channel_->endpoint(), self->incarnation_);
  return core;
}

std::unique_ptr<RouterCore> RouterCore::CreateDetached(RouterCoreOptions options, RouterMetrics* metrics,
                                                       SendFn send) {
  PDSERVE_CHECK(metrics != nullptr && send != nullptr, "a detached RouterCore needs metrics and a send function");
  return std::unique_ptr<RouterCore>(new RouterCore(std::move(options), metrics, std::move(send)));
}

RouterCore::~RouterCore() {
  std::unique_ptr<services::ControlChannel> channel;
  {
    std::lock_guard<std::mutex> lock(mu_);
    // Workers drop their jobs when they stop hearing from us; abort them now to free capacity
    // at once (best effort: the channel lingers briefly on close).
    for (auto& [id, route] : routes_) {
      EndAttemptLocked(route, AttemptState::kFinished, "router shutting down", {});
      route.request->Push({{}, {}, FinishReason::kError, Status::Unavailable("the router is shutting down"), {}});
    }
    routes_.clear();
    channel = std::move(channel_);
  }
  channel.reset();
}

const std::string& RouterCore::control_endpoint() const {
  static const std::string kNone;
  return channel_ ? channel_->endpoint() : kNone;
}

void RouterCore::SendLocked(const std::string& peer, const ControlMessage& message) {
  if (send_) {
    send_(peer, message);
    return;
  }
  auto bytes = services::EncodeControlMessage(message);
  if (!bytes.ok()) {
    GetLogger("router")->error("cannot encode {}: {}", services::ControlMessageName(message), bytes.status().ToString());
    return;
  }
  if (channel_) channel_->Send(peer, std::move(bytes).value());
}

size_t RouterCore::outstanding() const {
  std::lock_guard<std::mutex> lock(mu_);
  return routes_.size();
}

size_t RouterCore::open_charges() const {
  std::lock_guard<std::mutex> lock(mu_);
  return ledger_.open();
}

Status RouterCore::AuditAccounting() const {
  std::lock_guard<std::mutex> lock(mu_);
  PDSERVE_RETURN_IF_ERROR(ledger_.Audit());
  // Each live attempt holds exactly the charges of the jobs it still has: the output job
  // always, the prefill job until the prefill worker sent the first token.
  size_t expected = 0;
  for (const auto& [id, r] : routes_) {
    const Attempt& a = r.attempt;
    if (!a.live() || a.job_id() != id)
      return Status::Internal(fmt::format("route {:x}: attempt {:x} is {}", id, a.job_id(), AttemptStateName(a.state())));
    const bool prefill_open = a.disaggregated() && (a.state() == AttemptState::kReservingKv ||
                                                    a.state() == AttemptState::kPrefilling);
    if (!ledger_.Find(id, AttemptSide::kOutput))
      return Status::Internal(fmt::format("job {:x} ({}): no charge on its output worker", id,
                                          AttemptStateName(a.state())));
    if ((ledger_.Find(id, AttemptSide::kPrefill) != nullptr) != prefill_open)
      return Status::Internal(fmt::format("job {:x} ({}): the prefill charge is {}", id, AttemptStateName(a.state()),
                                          prefill_open ? "missing" : "still open"));
    expected += 1 + (prefill_open ? 1 : 0);
  }
  if (ledger_.open() != expected)
    return Status::Internal(fmt::format("{} open charges, the live attempts hold {}", ledger_.open(), expected));
  return Status::Ok();
}

bool IsRetriableFailure(FinishReason finish, const Status& error) {
  if (error.ok()) return finish == FinishReason::kAbort;
  switch (error.code()) {
    case StatusCode::kUnavailable:
    case StatusCode::kAborted:
    case StatusCode::kInternal:
    case StatusCode::kUnknown:
    case StatusCode::kDataLoss:
    case StatusCode::kDeadlineExceeded:
      return true;
    default:
      return false;
  }
}

Result<bool> RouterCore::ChooseModeLocked() const {
  const bool have_pd = registry_.ReadyCount(WorkerRole::kPrefill) > 0 && registry_.ReadyCount(WorkerRole::kDecode) > 0;
  const bool have_colocated = registry_.ReadyCount(WorkerRole::kColocated) > 0;
  switch (options_.mode) {
    case ServingMode::kDisaggregated:
      if (!have_pd) return Status::Unavailable("no ready prefill + decode worker pair");
      return true;
    case ServingMode::kColocated:
      if (!have_colocated) return Status::Unavailable("no ready colocated worker");
      return false;
    case ServingMode::kAuto:
    default:
      if (!have_pd && !have_colocated)
        return Status::Unavailable("no ready workers (need a prefill and a decode worker, or a colocated worker)");
      return have_pd;
  }
}

Result<uint32_t> RouterCore::DispatchLocked(Route& route, uint64_t job_id, const std::string& tag,
                                            const std::vector<int32_t>& prompt, std::optional<uint32_t> max_tokens,
                                            const Attempt* prefer) {
  const auto prompt_tokens = static_cast<uint32_t>(prompt.size());
  PDSERVE_ASSIGN_OR_RETURN(const bool disaggregated, ChooseModeLocked());
  const std::string no_peer;
  const bool same_kind = prefer && prefer->live() && prefer->disaggregated() == disaggregated;
  const std::string& prefer_output = same_kind ? prefer->output_peer() : no_peer;
  const std::string& prefer_prefill = same_kind ? prefer->prefill_peer() : no_peer;
  WorkerChoice out, prefill;
  // The prefix-cache hit each candidate computing the prompt would find (kv_index.h); the
  // prompt's block names are computed once per namespace and only as far as a walk goes.
  PromptChains chains(prompt);
  const PredictHitFn predict = [&](const WorkerEntry& w) {
    return kv_index_.PredictHitTokens(w.registration, &chains);
  };
  // Pulls: the workers that could write a cached prefix to a prefill worker (prefill and decode
  // workers with a prefix cache and a transfer endpoint; a multi-rank instance writes from its
  // leader's pool, which holds every block it caches), with what they hold of this prompt now.
  // A prefill worker's effective hit is the larger of its own and the best other holder's in
  // its namespace (namespaces name the plan: one-process workers pull from one-process
  // workers, multi-rank instances from instances of their plan), when the difference is worth a
  // pull; kv_aware scores by that.
  struct Holder {
    const WorkerEntry* worker;
    int64_t stored_tokens;
  };
  std::vector<Holder> holders;
  if (disaggregated && options_.pull_min_tokens > 0)
    for (const WorkerEntry* w : registry_.All())
      if (w->role != WorkerRole::kColocated && w->kv_namespace != 0 && !w->draining &&
          !w->drain_requested && !w->transfer_address.empty())
        if (const int64_t t = kv_index_.PredictStoredTokens(w->registration, &chains); t > 0) holders.push_back({w, t});
  auto best_holder = [&](const WorkerEntry& puller, int64_t own_hit) -> const Holder* {
    const Holder* best = nullptr;
    for (const Holder& h : holders)
      if (h.worker->registration != puller.registration && h.worker->kv_namespace == puller.kv_namespace &&
          h.stored_tokens >= own_hit + int64_t{options_.pull_min_tokens} &&
          (!best || h.stored_tokens > best->stored_tokens))
        best = &h;
    return best;
  };
  const PredictHitFn predict_with_pulls = [&](const WorkerEntry& w) -> PredictedHit {
    const int64_t own = predict(w).tokens;
    const Holder* h = best_holder(w, own);
    return h ? PredictedHit(h->stored_tokens, h->stored_tokens - own) : PredictedHit(own);
  };
  if (disaggregated) {
    PDSERVE_ASSIGN_OR_RETURN(out, registry_.Choose(WorkerRole::kDecode, options_.decode_policy, prompt_tokens,
                                                   max_tokens, options_.default_max_tokens, true, &cursor_decode_,
                                                   prefer_output));
    PDSERVE_ASSIGN_OR_RETURN(prefill, registry_.Choose(WorkerRole::kPrefill, options_.prefill_policy, prompt_tokens,
                                                       std::nullopt, 0, false, &cursor_prefill_, prefer_prefill,
                                                       predict_with_pulls));
  } else {
    PDSERVE_ASSIGN_OR_RETURN(out, registry_.Choose(WorkerRole::kColocated, options_.colocated_policy, prompt_tokens,
                                                   max_tokens, options_.default_max_tokens, true,
                                                   &cursor_colocated_, prefer_output, predict));
  }
  // Decode-side hits: a decode worker whose cache holds more of the prompt than the chosen
  // prefill worker's (its own or pulled), and all of it but a few tokens, runs the whole request
  // itself. With equal hits the prefill worker computes the rest: the same work, without
  // stalling a decode batch. (So once a decode worker's blocks are worth a pull, the prefill
  // worker pulls them and decode-side hits remain for smaller gains.)
  bool decode_local = false;
  if (disaggregated && options_.decode_local_prefill_tokens > 0) {
    auto local = registry_.Choose(WorkerRole::kDecode, RoutingPolicy::kKvAware, prompt_tokens, max_tokens,
                                  options_.default_max_tokens, true, &cursor_decode_, prefer_output, predict);
    // One-process decode workers only: a DP rank of a multi-rank instance has never been given a
    // prompt to compute (its EP peers step in lock-step with it), so it is not asked to.
    if (local.ok() && local->worker->instance_id.empty() && local->predicted_hit_tokens > prefill.predicted_hit_tokens &&
        int64_t{prompt_tokens} - local->predicted_hit_tokens <= int64_t{options_.decode_local_prefill_tokens} &&
        local->worker->kv_free_estimate >= local->blocks) {
      out = *local;
      decode_local = true;
    }
  }
  // Two workers (prefill, then decode) or one that computes the prompt and decodes: a colocated
  // worker, or a decode worker with a decode-side hit.
  const bool two_workers = disaggregated && !decode_local;
  if (decode_local) metrics_->decode_local_prefills.Increment();
  // The prefill worker's pull, when another worker holds enough more of the prompt.
  const Holder* pull_from = nullptr;
  route.pull_holder_peer.clear();
  route.pull_holder_registration = 0;
  route.pull_prefix.clear();
  if (two_workers) {
    pull_from = best_holder(*prefill.worker, predict(*prefill.worker).tokens);
    if (pull_from) {
      prefill.predicted_hit_tokens = pull_from->stored_tokens;
      route.pull_holder_peer = pull_from->worker->peer;
      route.pull_holder_registration = pull_from->worker->registration;
      route.pull_prefix.assign(prompt.begin(), prompt.begin() + pull_from->stored_tokens);
    }
  }
  route.predicted_hit_tokens = two_workers ? prefill.predicted_hit_tokens : out.predicted_hit_tokens;
  // The worker computing the prompt is about to cache its blocks: the next prompt with this
  // prefix sees them before the worker's events report them (kv_index.h "pending").
  kv_index_.NoteDispatched(two_workers ? prefill.worker->registration : out.worker->registration, &chains);
  // The prompt tokens the worker will compute: its predicted hit is not work it owes.
  const int64_t uncached_tokens = std::max<int64_t>(0, int64_t{prompt_tokens} - *route.predicted_hit_tokens);

  services::JobMsg job;
  job.request_id = job_id;
  job.request_tag = tag;
  job.prompt = prompt;
  job.sampling = route.sampling;
  job.sampling.max_tokens = out.max_tokens;
  // A migrated attempt: the output delivered so far is recomputed as output on the new worker
  // (identical greedy continuation; seeded sampling continues at the same index).
  job.sampling.resumed_output = static_cast<uint32_t>(route.delivered.size());
  job.deadline_unix_ms = route.deadline_unix_ms;
  job.dp_rank = out.worker->dp_rank;
  job.constraint = route.constraint;

  // The charges the routing policies see until the attempt ends (charge_ledger.h): the output
  // worker owes the output (and, colocated, computes the prompt too); the prefill worker owes
  // the prompt until its first token.
  if (two_workers) {
    route.attempt = Attempt::Disaggregated(job_id, out.worker->peer, prefill.worker->peer);
    ledger_.Charge(job_id, AttemptSide::kOutput, *out.worker, out.max_tokens, out.blocks);
    ledger_.Charge(job_id, AttemptSide::kPrefill, *prefill.worker, uncached_tokens, 0);
    route.prefill_job = job;
    route.prefill_job.phase = services::JobPhase::kPrefill;
    route.prefill_job.decode_worker_id = out.worker->id;
    route.prefill_job.dp_rank = prefill.worker->dp_rank;
    if (pull_from) {
      route.prefill_job.pull_tokens = static_cast<uint32_t>(pull_from->stored_tokens);
      route.prefill_job.pull_worker_id = pull_from->worker->id;
      metrics_->prefix_pulls_planned.Increment();
    }
    job.phase = services::JobPhase::kDecode;
    job.prefill_kv_namespace = prefill.worker->kv_namespace;
  } else {
    route.attempt = Attempt::Colocated(job_id, out.worker->peer);
    ledger_.Charge(job_id, AttemptSide::kOutput, *out.worker, uncached_tokens + static_cast<int64_t>(out.max_tokens),
                   out.blocks);
    route.prefill_job = {};
    job.phase = services::JobPhase::kColocated;
  }
  services::RequestLog("router", tag)
      .Debug("job {:x}: {} prompt tokens ({} predicted cached), max_tokens {} -> {}{}", job_id, prompt_tokens,
             *route.predicted_hit_tokens, out.max_tokens, out.worker->id,
             two_workers    ? " (decode), prefill " + prefill.worker->id +
                                  (pull_from ? " pulling from " + pull_from->worker->id : std::string())
             : decode_local ? std::string(" (decode-side hit: computes the rest itself)")
                            : std::string());
  metrics_->CountPlacement(out.worker->role, out.worker->id, out.worker->dp_rank);
  if (two_workers) metrics_->CountPlacement(prefill.worker->role, prefill.worker->id, prefill.worker->dp_rank);
  SendLocked(out.worker->peer, job);
  return out.max_tokens;
}

Result<std::shared_ptr<ActiveRequest>> RouterCore::Submit(SubmitSpec spec) {
  if (spec.prompt.empty()) return Status::InvalidArgument("the prompt is empty");
  const auto prompt_tokens = static_cast<uint32_t>(spec.prompt.size());
  std::lock_guard<std::mutex> lock(mu_);
  if (routes_.size() >= options_.max_outstanding_requests)
    return Status::ResourceExhausted(fmt::format("the router has {} requests in flight; retry later", routes_.size()));
  Route route;
  route.sampling = std::move(spec.sampling);
  route.constraint = std::move(spec.constraint);
  route.deadline_unix_ms = spec.deadline_unix_ms;
  const Attempt* prefer = nullptr;
  if (spec.affinity != 0) {
    if (auto job = job_of_request_.find(spec.affinity); job != job_of_request_.end())
      if (auto sibling = routes_.find(job->second); sibling != routes_.end()) prefer = &sibling->second.attempt;
  }
  const uint64_t id = next_request_id_++;
  PDSERVE_ASSIGN_OR_RETURN(const uint32_t max_tokens,
                           DispatchLocked(route, id, spec.tag, spec.prompt, spec.max_tokens, prefer));
  route.sampling.max_tokens = max_tokens;
  route.prompt = std::move(spec.prompt);
  route.request = std::make_shared<ActiveRequest>(id, spec.tag, prompt_tokens, max_tokens, spec.arrival);
  auto request = route.request;
  job_of_request_[id] = id;
  routes_.emplace(id, std::move(route));
  return request;
}

void RouterCore::Cancel(uint64_t request_id, std::string_view reason) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = job_of_request_.find(request_id);
  if (it != job_of_request_.end()) EndRouteLocked(it->second, reason);
}

void RouterCore::EndAttemptLocked(Route& r, AttemptState terminal, std::string_view abort_reason,
                                  std::string_view released_peer) {
  const uint64_t job_id = r.attempt.job_id();
  for (const std::string& peer : r.attempt.End(terminal, released_peer))
    SendLocked(peer, services::AbortMsg{job_id, std::string(abort_reason)});
  ledger_.ReleaseAttempt(job_id);
}

void RouterCore::EndRouteLocked(uint64_t job_id, std::string_view abort_reason, std::string_view released_peer) {
  auto it = routes_.find(job_id);
  if (it == routes_.end()) return;
  EndAttemptLocked(it->second, AttemptState::kFinished, abort_reason, released_peer);
  job_of_request_.erase(it->second.request->id());
  routes_.erase(it);
}

void RouterCore::MigrateLocked(uint64_t job_id, const Failure& failure) {
  auto node = routes_.extract(job_id);
  if (node.empty()) return;
  Route& r = node.mapped();
  job_of_request_.erase(r.request->id());
  EndAttemptLocked(r, AttemptState::kMigrating, "the request moves to other workers", failure.released_peer);
  if (r.request->ended()) return;  // the client's side already finished (e.g. a stop string)
  const Status& why = failure.why;
  auto fail = [&](std::string_view outcome, const Status& status) {
    metrics_->CountMigration(failure.role, outcome);
    services::RequestLog("router", r.request->tag()).Warn("{}", status.message());
    r.request->Push({{}, {}, FinishReason::kError, status, {}});
  };
  const auto delivered = static_cast<uint32_t>(r.delivered.size());
  if (delivered >= static_cast<uint32_t>(r.sampling.max_tokens)) {
    r.request->Push({{}, {}, FinishReason::kLength, Status::Ok(), {}});  // nothing left to generate
    return;
  }
  if (r.migrations >= options_.max_migrations) {
    fail("limit", options_.max_migrations == 0
                      ? why
                      : Status(why.code(), fmt::format("{} (after {} migrations, the limit)", why.message(),
                                                       r.migrations)));
    return;
  }
  if (r.deadline_unix_ms > 0 && services::UnixMillis() >= r.deadline_unix_ms) {
    fail("deadline", Status::DeadlineExceeded(fmt::format("{}; the request deadline passed", why.message())));
    return;
  }
  std::vector<int32_t> prompt = r.prompt;
  prompt.insert(prompt.end(), r.delivered.begin(), r.delivered.end());
  const uint64_t next = next_request_id_++;
  // A worker that failed the attempt but is still registered (it aborted, reported an error,
  // or stalled) is passed over while another worker of its role is ready.
  WorkerEntry* avoid = failure.avoid_peer.empty() ? nullptr : registry_.FindByPeer(failure.avoid_peer);
  const bool avoid_it = avoid && !avoid->draining && registry_.ReadyCount(avoid->role) > 1;
  if (avoid_it) avoid->draining = true;
  auto dispatched = DispatchLocked(r, next, r.request->tag(), prompt, r.sampling.max_tokens - delivered);
  if (avoid_it) avoid->draining = false;
  if (!dispatched.ok()) {
    fail("no_worker", Status::Unavailable(fmt::format("{}; no worker to move the request to: {}", why.message(),
                                                      dispatched.status().message())));
    return;
  }
  ++r.migrations;
  metrics_->CountMigration(failure.role, "migrated");
  services::RequestLog("router", r.request->tag())
      .Info("{}: migrated (attempt {}, {} tokens already delivered, job {:x})", why.message(), r.migrations + 1,
            delivered, next);
  job_of_request_[r.request->id()] = next;
  node.key() = next;
  routes_.insert(std::move(node));
}

void RouterCore::WorkerGoneLocked(const WorkerEntry& worker, const std::string& reason) {
  metrics_->CountRemoval(worker.role, reason);
  metrics_->ForgetWorker(worker.id);
  kv_index_.Forget(worker.registration);
  // Its entry is gone: its charges close with nothing to credit.
  ledger_.ForgetWorker(worker);
  std::vector<uint64_t> affected;
  for (auto& [id, r] : routes_) {
    if (r.attempt.DependsOn(worker.peer)) affected.push_back(id);
    // A pull from the gone worker: its prefill worker computes the prefix instead (the transfer
    // layer would notice too, but only at its lease or timeout when the holder went silent).
    if (r.pull_holder_peer == worker.peer && r.pull_holder_registration == worker.registration) {
      r.pull_holder_peer.clear();
      r.pull_prefix.clear();
      metrics_->prefix_pulls_failed.Increment();
      if (!r.attempt.prefill_peer().empty() && r.attempt.prefill_peer() != worker.peer)
        SendLocked(r.attempt.prefill_peer(), services::KvPushFailedMsg{id, "the holder " + worker.id + " failed"});
    }
  }
  const Status why = Status::Unavailable(
      fmt::format("{} worker {} failed ({})", services::WorkerRoleName(worker.role), worker.id, reason));
  // The gone worker no longer holds the job: no abort to it.
  for (uint64_t id : affected) MigrateLocked(id, Failure{worker.role, why, worker.peer, {}});
  const bool expected = reason == "deregister" && affected.empty();  // a clean, drained exit
  GetLogger("router")->log(expected ? spdlog::level::info : spdlog::level::warn,
                           "{} worker {} removed ({}); {} requests affected", services::WorkerRoleName(worker.role),
                           worker.id, reason, affected.size());
}

void RouterCore::OnKvReservedLocked(const std::string& peer, services::KvReservedMsg msg) {
  auto it = routes_.find(msg.request_id);
  if (it == routes_.end()) {
    SendLocked(peer, services::AbortMsg{msg.request_id, "unknown request"});
    return;
  }
  Route& r = it->second;
  if (!r.attempt.KvReserved(peer)) return;  // stale or stray
  r.prefill_job.kv_descriptor = std::move(msg.descriptor);
  r.prefill_job.decode_transfer_address = std::move(msg.transfer_address);
  SendLocked(r.attempt.prefill_peer(), r.prefill_job);
  r.prefill_job.prompt.clear();  // no longer needed
  r.prefill_job.kv_descriptor.clear();
}

void RouterCore::OnKvPullLocked(const std::string& peer, services::KvPullMsg msg) {
  auto it = routes_.find(msg.request_id);
  if (it == routes_.end()) return;  // ended: the prefill worker's job is aborted anyway
  Route& r = it->second;
  if (r.attempt.prefill_peer() != peer || r.pull_holder_peer.empty()) return;  // stale or stray
  const WorkerEntry* holder = registry_.FindByPeer(r.pull_holder_peer);
  const uint64_t end = uint64_t{msg.first_token} + msg.num_tokens;
  services::KvPushFailedMsg failed{msg.request_id, {}};
  if (!holder || holder->registration != r.pull_holder_registration) {
    failed.reason = "the holder left the cluster";
  } else if (end > r.pull_prefix.size()) {
    failed.reason = fmt::format("the pull asks for tokens up to {}, the router planned {}", end, r.pull_prefix.size());
  }
  if (!failed.reason.empty()) {
    metrics_->prefix_pulls_failed.Increment();
    SendLocked(peer, failed);
    r.pull_holder_peer.clear();
    r.pull_prefix.clear();
    return;
  }
  services::KvPushMsg push;
  push.request_id = msg.request_id;
  push.request_tag = r.request->tag();
  push.tokens.assign(r.pull_prefix.begin(), r.pull_prefix.begin() + static_cast<int64_t>(end));
  push.first_token = msg.first_token;
  push.num_tokens = msg.num_tokens;
  push.descriptor = std::move(msg.descriptor);
  push.kv_namespace = msg.kv_namespace;
  SendLocked(holder->peer, push);
  r.pull_prefix.clear();  // no longer needed; the holder's failure still finds the route
}

void RouterCore::OnKvPushFailedLocked(const std::string& peer, services::KvPushFailedMsg msg) {
  auto it = routes_.find(msg.request_id);
  if (it == routes_.end()) return;
  Route& r = it->second;
  if (r.pull_holder_peer != peer) return;  // stale or stray
  metrics_->prefix_pulls_failed.Increment();
  services::RequestLog("router", r.request->tag()).Debug("pull not served: {}", msg.reason);
  r.pull_holder_peer.clear();
  if (!r.attempt.prefill_peer().empty()) SendLocked(r.attempt.prefill_peer(), msg);
}

void RouterCore::OnKvEventsLocked(const std::string& peer, const services::KvEventsMsg& msg) {
  WorkerEntry* w = registry_.FindByPeer(peer);
  // Not registered (timed out, replaced, or not yet): its next registration starts with a reset.
  if (!w) return;
  const Status applied =
      kv_index_.Apply(w->registration, w->kv_namespace,
                      int64_t{w->capacity.kv_blocks_total} + int64_t{w->capacity.prefix_tier_blocks}, msg);
  w->kv_index_blocks = kv_index_.Blocks(w->registration);
  if (!applied.ok()) {
    metrics_->control_errors.Increment();
    GetLogger("router")->warn("dropped KV events of worker {}: {}", w->id, applied.message());
  }
}

void RouterCore::CountPrefixHitLocked(Route& r, const std::string& peer, const services::TokenEventMsg& ev) {
  if (!r.predicted_hit_tokens) return;
  // The report of the worker that computed the prompt: the prefill's single event, or a
  // colocated attempt's finishing one; an error or abort carries no usage.
  const std::optional<AttemptSide> side = r.attempt.SideOf(peer);
  const bool report = side == AttemptSide::kPrefill ||
                      (side == AttemptSide::kOutput && !r.attempt.disaggregated() && ev.finishing());
  if (!report) return;
  if (!ev.error.ok() || ev.finish == FinishReason::kError || ev.finish == FinishReason::kAbort) return;
  metrics_->prefix_predicted_hit_tokens.Increment(static_cast<double>(*r.predicted_hit_tokens));
  metrics_->prefix_actual_hit_tokens.Increment(ev.cached_prompt_tokens);
  if (*r.predicted_hit_tokens != ev.cached_prompt_tokens)
    services::RequestLog("router", r.request->tag())
        .Debug("prefix cache: {} tokens predicted cached, {} found", *r.predicted_hit_tokens, ev.cached_prompt_tokens);
  r.predicted_hit_tokens.reset();
}

void RouterCore::OnTokenEventLocked(const std::string& peer, services::TokenEventMsg ev) {
  auto it = routes_.find(ev.request_id);
  if (it == routes_.end()) {
    metrics_->stale_token_events.Increment();
    if (!ev.finishing()) SendLocked(peer, services::AbortMsg{ev.request_id, "unknown request"});
    return;
  }
  Route& r = it->second;
  const std::optional<AttemptSide> side = r.attempt.SideOf(peer);
  if (!side) {  // not a worker holding a job of this attempt (a stale peer)
    metrics_->stale_token_events.Increment();
    return;
  }
  // The worker that computed the prompt says how much of it its prefix cache supplied.
  if (ev.cached_prompt_tokens > 0) r.request->SetCachedPromptTokens(ev.cached_prompt_tokens);

  // A failure the router did not ask for: a new attempt elsewhere when it is worth one.
  if (ev.finishing() && IsRetriableFailure(ev.finish, ev.error)) {
    const WorkerRole role = r.attempt.RoleOf(*side);
    // Output before the failure still reaches the client.
    if (*side == AttemptSide::kOutput && !ev.tokens.empty() &&
        r.attempt.Output(ev.tokens.size(), std::chrono::steady_clock::now())) {
      r.delivered.insert(r.delivered.end(), ev.tokens.begin(), ev.tokens.end());
      r.request->Push({std::move(ev.tokens), std::move(ev.logprobs), FinishReason::kNone, Status::Ok(), {}});
    }
    const WorkerEntry* w = registry_.FindByPeer(peer);
    const Status& e = ev.error;
    MigrateLocked(ev.request_id,
                  Failure{role,
                          Status(e.ok() ? StatusCode::kAborted : e.code(),
                                 fmt::format("{} worker {} ended the request: {}", services::WorkerRoleName(role),
                                             w ? w->id : std::string("?"), e.ok() ? std::string("aborted") : e.message())),
                          peer, peer});
    return;
  }
  CountPrefixHitLocked(r, peer, ev);
  if (*side == AttemptSide::kPrefill) {
    OnPrefillEventLocked(r, peer, std::move(ev));
  } else {
    OnOutputEventLocked(r, peer, std::move(ev));
  }
}

void RouterCore::OnPrefillEventLocked(Route& r, const std::string& peer, services::TokenEventMsg ev) {
  // The prefill worker's single event: the first token of this attempt (or an error). Either
  // way the prefill worker is done with the request.
  const uint64_t id = r.attempt.job_id();
  const bool failed = !ev.error.ok() || ev.finish == FinishReason::kError || ev.finish == FinishReason::kAbort;
  // A first token: the prompt was computed, which teaches kv_aware the worker's pace.
  if (failed) {
    ledger_.Release(id, AttemptSide::kPrefill);
  } else {
    ledger_.Served(id, AttemptSide::kPrefill);
  }
  RequestEvent out_ev{std::move(ev.tokens), std::move(ev.logprobs), ev.finish, ev.error, {}};
  if (!failed && out_ev.tokens.size() != 1) {
    out_ev.error = Status::Internal(fmt::format("prefill worker sent {} tokens, expected 1", out_ev.tokens.size()));
    out_ev.finish = FinishReason::kError;
  }
  if (!out_ev.error.ok() && out_ev.finish == FinishReason::kNone) out_ev.finish = FinishReason::kError;
  if (ev.finish == FinishReason::kAbort && out_ev.error.ok())
    out_ev.error = Status::Aborted("the prefill worker aborted the request");
  r.delivered.insert(r.delivered.end(), out_ev.tokens.begin(), out_ev.tokens.end());
  if (out_ev.finishing()) {  // the request ends at its first token (or failed before it)
    r.request->Push(std::move(out_ev));
    EndRouteLocked(id, "finished at the first token", peer);
    return;
  }
  services::FirstTokenMsg first;
  first.request_id = id;
  first.token = out_ev.tokens[0];
  if (!out_ev.logprobs.empty()) first.logprob = out_ev.logprobs[0];
  // The prefill's grammar state after the first token: the decode worker restores it instead
  // of replaying the token (docs/structured-output.md, "Prefill -> decode").
  first.constraint_state = std::move(ev.constraint_state);
  r.attempt.FirstTokenRelayed(std::chrono::steady_clock::now());
  r.request->Push(std::move(out_ev));
  SendLocked(r.attempt.output_peer(), first);
}

void RouterCore::OnOutputEventLocked(Route& r, const std::string& peer, services::TokenEventMsg ev) {
  // Tokens from the colocated / decode worker.
  const uint64_t id = r.attempt.job_id();
  if (!r.attempt.Output(ev.tokens.size(), std::chrono::steady_clock::now())) {
    // A decode worker streams only after the router relayed the first token: its worker is
    // broken; the request moves on without these tokens.
    const WorkerRole role = r.attempt.RoleOf(AttemptSide::kOutput);
    const WorkerEntry* w = registry_.FindByPeer(peer);
    MigrateLocked(id, Failure{role,
                              Status::Internal(fmt::format("{} worker {} sent {} tokens before the first token",
                                                           services::WorkerRoleName(role), w ? w->id : std::string("?"),
                                                           ev.tokens.size())),
                              ev.finishing() ? peer : std::string(), peer});
    return;
  }
  ledger_.Consume(id, AttemptSide::kOutput, static_cast<int64_t>(ev.tokens.size()));
  RequestEvent out_ev{std::move(ev.tokens), std::move(ev.logprobs), ev.finish, ev.error, {}};
  if (out_ev.finish == FinishReason::kAbort && out_ev.error.ok())
    out_ev.error = Status::Aborted("the worker aborted the request");
  if (!out_ev.error.ok() && out_ev.finish == FinishReason::kNone) out_ev.finish = FinishReason::kError;
  const bool finishing = out_ev.finishing();
  r.delivered.insert(r.delivered.end(), out_ev.tokens.begin(), out_ev.tokens.end());
  r.request->Push(std::move(out_ev));
  if (finishing) EndRouteLocked(id, "the decode side failed", peer);  // aborts a prefill still running, if any
}

void RouterCore::HandleMessage(std::string_view peer_view, std::string_view payload) {
  auto log = GetLogger("router");
  auto decoded = services::DecodeControlMessage(payload);
  if (!decoded.ok()) {
    metrics_->control_errors.Increment();
    log->warn("dropped a control message from peer {}: {}", HexPeer(peer_view), decoded.status().ToString());
    return;
  }
  const std::string peer(peer_view);
  const auto now = std::chrono::steady_clock::now();
  std::lock_guard<std::mutex> lock(mu_);
  ControlMessage& msg = decoded.value();
  if (auto* reg = std::get_if<services::RegisterMsg>(&msg)) {
    RegisterOutcome outcome = registry_.Register(peer, *reg, now);
    for (const WorkerEntry& gone : outcome.replaced) WorkerGoneLocked(gone, "replaced");
    if (!outcome.refusal.ok()) {
      log->error("refused worker {} ({}): {}", reg->worker_id, services::WorkerRoleName(reg->role),
                 outcome.refusal.message());
      SendLocked(peer, services::RegisterRefuseMsg{outcome.refusal.code(), outcome.refusal.message()});
      return;
    }
    if (!outcome.duplicate)
      log->info("registered {} worker {} (model {}, context {}, {} KV blocks of {} tokens, metrics {})",
                services::WorkerRoleName(reg->role), reg->worker_id, reg->model_name,
                reg->capacity.max_context_tokens, reg->capacity.kv_blocks_total, reg->capacity.block_tokens,
                reg->http_address.empty() ? "-" : reg->http_address);
    SendLocked(peer, services::RegisterAckMsg{incarnation_, static_cast<uint32_t>(options_.heartbeat_interval.count()),
                                              static_cast<uint32_t>(options_.heartbeat_timeout.count())});
  } else if (auto* hb = std::get_if<services::HeartbeatMsg>(&msg)) {
    const bool known = registry_.Heartbeat(peer, *hb, now);
    if (known) {
      const WorkerEntry* w = registry_.FindByPeer(peer);
      metrics_->UpdateWorkerKv(w->role, w->id, hb->load.kv_blocks_free, hb->load.kv_blocks_total);
    }
    SendLocked(peer, services::HeartbeatAckMsg{hb->seq, known, incarnation_});
  } else if (auto* ev = std::get_if<services::TokenEventMsg>(&msg)) {
    registry_.Touch(peer, now);
    OnTokenEventLocked(peer, std::move(*ev));
  } else if (auto* kv = std::get_if<services::KvReservedMsg>(&msg)) {
    registry_.Touch(peer, now);
    OnKvReservedLocked(peer, std::move(*kv));
  } else if (auto* kv_events = std::get_if<services::KvEventsMsg>(&msg)) {
    registry_.Touch(peer, now);
    OnKvEventsLocked(peer, *kv_events);
  } else if (auto* pull = std::get_if<services::KvPullMsg>(&msg)) {
    registry_.Touch(peer, now);
    OnKvPullLocked(peer, std::move(*pull));
  } else if (auto* failed = std::get_if<services::KvPushFailedMsg>(&msg)) {
    registry_.Touch(peer, now);
    OnKvPushFailedLocked(peer, std::move(*failed));
  } else if (auto* dereg = std::get_if<services::DeregisterMsg>(&msg)) {
    if (auto gone = registry_.Remove(peer)) {
      log->info("worker {} deregistered ({})", gone->id, dereg->reason);
      WorkerGoneLocked(*gone, "deregister");
    }
  } else {
    log->warn("unexpected {} message from peer {}", services::ControlMessageName(msg), HexPeer(peer));
  }
}

void RouterCore::MigrateStalledLocked(std::chrono::steady_clock::time_point now) {
  if (options_.stall_timeout.count() <= 0) return;
  std::vector<uint64_t> stalled;
  for (const auto& [id, r] : routes_)
    if (r.attempt.Stalled(now, options_.stall_timeout)) stalled.push_back(id);
  for (uint64_t id : stalled) {
    const Attempt& a = routes_.at(id).attempt;
    const std::string peer = a.output_peer();
    const WorkerEntry* w = registry_.FindByPeer(peer);
    const WorkerRole role = a.RoleOf(AttemptSide::kOutput);
    // The stalled worker still holds the job: it gets Abort, and is passed over.
    MigrateLocked(id, Failure{role,
                              Status::Unavailable(fmt::format("{} worker {} produced no token for {} ms",
                                                              services::WorkerRoleName(role),
                                                              w ? w->id : std::string("?"),
                                                              options_.stall_timeout.count())),
                              {}, peer});
  }
}

void RouterCore::HandleTick(std::chrono::steady_clock::time_point now) {
  std::lock_guard<std::mutex> lock(mu_);
  // Liveness is judged on the workers' messages, not on this thread's lag: time this thread
  // did not run (a stalled or starved router) is not the workers' silence, and while messages
  // wait unread in the channel a worker's heartbeat may be among them.
  if (const auto stalled = listening_.Tick(now); stalled > std::chrono::milliseconds(0)) {
    registry_.Forgive(stalled, now);
    if (stalled > options_.heartbeat_interval)
      GetLogger("router")->warn("the control thread was stalled for {} ms; not counted against the workers",
                                std::chrono::duration_cast<std::chrono::milliseconds>(stalled).count());
  }
  if (!channel_ || channel_->caught_up())
    for (const WorkerEntry& gone : registry_.Expire(now)) WorkerGoneLocked(gone, "timeout");
  MigrateStalledLocked(now);
  for (auto role : {WorkerRole::kPrefill, WorkerRole::kDecode, WorkerRole::kColocated})
    metrics_->SetWorkers(role, registry_.ReadyCount(role), registry_.DrainingCount(role));
}

ClusterHealth RouterCore::Health() const {
  std::lock_guard<std::mutex> lock(mu_);
  ClusterHealth h;
  h.prefill = registry_.ReadyCount(WorkerRole::kPrefill);
  h.decode = registry_.ReadyCount(WorkerRole::kDecode);
  h.colocated = registry_.ReadyCount(WorkerRole::kColocated);
  for (auto role : {WorkerRole::kPrefill, WorkerRole::kDecode, WorkerRole::kColocated})
    h.draining += registry_.DrainingCount(role);
  const bool pd = h.prefill > 0 && h.decode > 0;
  switch (options_.mode) {
    case ServingMode::kDisaggregated: h.ready = pd; break;
    case ServingMode::kColocated: h.ready = h.colocated > 0; break;
    case ServingMode::kAuto: h.ready = pd || h.colocated > 0; break;
  }
  return h;
}

nlohmann::json RouterCore::WorkersJson() const {
  std::lock_guard<std::mutex> lock(mu_);
  nlohmann::json out = nlohmann::json::array();
  const auto now = std::chrono::steady_clock::now();
  for (const WorkerEntry* w : registry_.All()) {
    out.push_back({
        {"id", w->id},
        {"role", services::WorkerRoleName(w->role)},
        {"state", w->draining ? "draining" : "ready"},
        {"http_address", w->http_address},
        {"model", w->model_name},
        {"compat_hash", fmt::format("{:016x}", w->compat_hash)},
        {"max_context_tokens", w->capacity.max_context_tokens},
        {"max_batch", w->capacity.max_batch},
        {"block_tokens", w->capacity.block_tokens},
        {"kv_blocks_total", w->load.kv_blocks_total},
        {"kv_blocks_free", w->load.kv_blocks_free},
        {"running", w->load.running},
        {"waiting", w->load.waiting},
        {"outstanding_tokens", w->outstanding_tokens},
        {"outstanding_requests", w->outstanding_requests},
        {"prefix_cache_blocks", w->kv_index_blocks},
        {"last_heartbeat_ms_ago",
         std::chrono::duration_cast<std::chrono::milliseconds>(now - w->last_seen).count()},
    });
  }
  return out;
}

std::vector<WorkerEntry> RouterCore::WorkerSnapshot() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<WorkerEntry> out;
  for (const WorkerEntry* w : registry_.All()) out.push_back(*w);
  return out;
}

Status RouterCore::DrainWorker(const std::string& worker_id, uint32_t timeout_ms) {
  std::lock_guard<std::mutex> lock(mu_);
  WorkerEntry* w = registry_.FindById(worker_id);
  if (!w) return Status::NotFound("no worker '" + worker_id + "'");
  w->draining = true;  // stop routing to it now, before its heartbeat says so
  w->drain_requested = true;
  SendLocked(w->peer, services::DrainMsg{timeout_ms});
  GetLogger("router")->info("draining worker {}", worker_id);
  return Status::Ok();
}

}  // namespace pdserve::router
