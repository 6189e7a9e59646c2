#include "services/router/router_core.h"

#include <fmt/format.h>

#include "common/logging.h"
#include "services/common/control_codec.h"
#include "services/common/process_util.h"
#include "services/common/request_log.h"

namespace pdserve::router {

using services::ControlMessage;
using services::FinishReason;
using services::WorkerRole;

namespace {
std::string HexPeer(std::string_view peer) {
  std::string out;
  for (unsigned char c : peer) out += fmt::format("{:02x}", c);
  return out;
}
}  // namespace

RouterCore::RouterCore(RouterCoreOptions options, RouterMetrics* metrics)
    : options_(std::move(options)),
      metrics_(metrics),
      incarnation_(services::RandomU64()),
      registry_({options_.model_name, options_.compat_hash, options_.heartbeat_timeout}),
      // Request ids carry the incarnation in the high half: ids of a restarted router never
      // collide with jobs a worker may still be finishing for the previous one.
      next_request_id_((incarnation_ & 0xffffffffull) << 32 | 1) {}

Result<std::unique_ptr<RouterCore>> RouterCore::Start(RouterCoreOptions options, RouterMetrics* metrics) {
  if (!metrics) return Status::InvalidArgument("RouterCore needs metrics");
  std::unique_ptr<RouterCore> core(new RouterCore(std::move(options), metrics));
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
          co, [self](std::string_view peer, std::string_view payload) { self->OnMessage(peer, payload); },
          [self](std::chrono::steady_clock::time_point now) { self->OnTick(now); }, self->options_.control_curve));
  lock.unlock();
  GetLogger("router")->info("control plane on {} (incarnation {:x})", self->channel_->endpoint(), self->incarnation_);
  return core;
}

RouterCore::~RouterCore() {
  std::unique_ptr<services::ControlChannel> channel;
  {
    std::lock_guard<std::mutex> lock(mu_);
    // Workers drop their jobs when they stop hearing from us; abort them now to free capacity
    // at once (best effort: the channel lingers briefly on close).
    for (auto& [id, route] : routes_) {
      if (route.out_live) SendLocked(route.out_peer, services::AbortMsg{id, "router shutting down"});
      if (route.prefill_live) SendLocked(route.prefill_peer, services::AbortMsg{id, "router shutting down"});
      route.request->Push({{}, {}, FinishReason::kError, Status::Unavailable("the router is shutting down"), {}});
    }
    routes_.clear();
    channel = std::move(channel_);
  }
  channel.reset();
}

void RouterCore::SendLocked(const std::string& peer, const ControlMessage& message) {
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

Result<std::shared_ptr<ActiveRequest>> RouterCore::Submit(SubmitSpec spec) {
  if (spec.prompt.empty()) return Status::InvalidArgument("the prompt is empty");
  const auto prompt_tokens = static_cast<uint32_t>(spec.prompt.size());
  std::lock_guard<std::mutex> lock(mu_);
  if (routes_.size() >= options_.max_outstanding_requests)
    return Status::ResourceExhausted(fmt::format("the router has {} requests in flight; retry later", routes_.size()));
  const bool have_pd = registry_.ReadyCount(WorkerRole::kPrefill) > 0 && registry_.ReadyCount(WorkerRole::kDecode) > 0;
  const bool have_colocated = registry_.ReadyCount(WorkerRole::kColocated) > 0;
  bool disaggregated;
  switch (options_.mode) {
    case ServingMode::kDisaggregated:
      if (!have_pd) return Status::Unavailable("no ready prefill + decode worker pair");
      disaggregated = true;
      break;
    case ServingMode::kColocated:
      if (!have_colocated) return Status::Unavailable("no ready colocated worker");
      disaggregated = false;
      break;
    case ServingMode::kAuto:
    default:
      if (!have_pd && !have_colocated)
        return Status::Unavailable("no ready workers (need a prefill and a decode worker, or a colocated worker)");
      disaggregated = have_pd;
      break;
  }

  Route route;
  route.disaggregated = disaggregated;
  WorkerChoice out, prefill;
  if (disaggregated) {
    PDSERVE_ASSIGN_OR_RETURN(out, registry_.Choose(WorkerRole::kDecode, options_.decode_policy, prompt_tokens,
                                                   spec.max_tokens, options_.default_max_tokens, true, &cursor_decode_));
    PDSERVE_ASSIGN_OR_RETURN(prefill, registry_.Choose(WorkerRole::kPrefill, options_.prefill_policy, prompt_tokens,
                                                       std::nullopt, 0, false, &cursor_prefill_));
  } else {
    PDSERVE_ASSIGN_OR_RETURN(out, registry_.Choose(WorkerRole::kColocated, options_.colocated_policy, prompt_tokens,
                                                   spec.max_tokens, options_.default_max_tokens, true,
                                                   &cursor_colocated_));
  }
  const uint64_t id = next_request_id_++;
  auto request = std::make_shared<ActiveRequest>(id, spec.tag, prompt_tokens, out.max_tokens, spec.arrival);

  services::JobMsg job;
  job.request_id = id;
  job.request_tag = spec.tag;
  job.prompt = std::move(spec.prompt);
  job.sampling = std::move(spec.sampling);
  job.sampling.max_tokens = out.max_tokens;
  job.deadline_unix_ms = spec.deadline_unix_ms;

  route.request = request;
  route.out_peer = out.worker->peer;
  route.out_live = true;
  // Charges for the routing policies, released as tokens arrive and when the route ends.
  route.out_tokens_charge = disaggregated ? out.max_tokens : prompt_tokens + static_cast<int64_t>(out.max_tokens);
  route.out_blocks_charge = out.blocks;
  out.worker->outstanding_tokens += route.out_tokens_charge;
  out.worker->outstanding_requests += 1;
  out.worker->kv_free_estimate -= out.blocks;
  if (disaggregated) {
    route.prefill_peer = prefill.worker->peer;
    route.prefill_tokens_charge = prompt_tokens;
    prefill.worker->outstanding_tokens += prompt_tokens;
    prefill.worker->outstanding_requests += 1;
    route.prefill_job = job;
    route.prefill_job.phase = services::JobPhase::kPrefill;
    route.prefill_job.decode_worker_id = out.worker->id;
    job.phase = services::JobPhase::kDecode;
  } else {
    job.phase = services::JobPhase::kColocated;
  }
  services::RequestLog("router", spec.tag)
      .Debug("request {:x}: {} prompt tokens, max_tokens {} -> {}{}", id, prompt_tokens, out.max_tokens,
             out.worker->id, disaggregated ? " (decode), prefill " + prefill.worker->id : std::string());
  SendLocked(out.worker->peer, job);
  routes_.emplace(id, std::move(route));
  return request;
}

void RouterCore::Cancel(uint64_t request_id, std::string_view reason) {
  std::lock_guard<std::mutex> lock(mu_);
  EndRouteLocked(request_id, reason);
}

bool RouterCore::UsesPeer(const Route& r, const std::string& peer) const {
  return r.out_peer == peer || (r.disaggregated && r.prefill_peer == peer);
}

void RouterCore::ReleaseLocked(Route& route) {
  if (WorkerEntry* w = registry_.FindByPeer(route.out_peer)) {
    w->outstanding_tokens -= route.out_tokens_charge;
    w->outstanding_requests -= 1;  // freed KV shows in its next heartbeat
  }
  route.out_tokens_charge = 0;
  if (route.disaggregated) {
    if (WorkerEntry* w = registry_.FindByPeer(route.prefill_peer)) {
      w->outstanding_tokens -= route.prefill_tokens_charge;
      if (route.prefill_tokens_charge > 0 || route.prefill_live) w->outstanding_requests -= 1;
    }
    route.prefill_tokens_charge = 0;
  }
}

void RouterCore::EndRouteLocked(uint64_t id, std::string_view abort_reason) {
  auto it = routes_.find(id);
  if (it == routes_.end()) return;
  Route& r = it->second;
  if (r.out_live) SendLocked(r.out_peer, services::AbortMsg{id, std::string(abort_reason)});
  if (r.disaggregated && r.prefill_live) SendLocked(r.prefill_peer, services::AbortMsg{id, std::string(abort_reason)});
  ReleaseLocked(r);
  routes_.erase(it);
}

void RouterCore::WorkerGoneLocked(const WorkerEntry& worker, const std::string& reason) {
  metrics_->CountRemoval(worker.role, reason);
  metrics_->ForgetWorker(worker.id);
  std::vector<uint64_t> failed;
  for (auto& [id, r] : routes_) {
    if (!UsesPeer(r, worker.peer)) continue;
    // The gone worker no longer holds the job: no abort to it.
    if (r.out_peer == worker.peer) r.out_live = false;
    if (r.disaggregated && r.prefill_peer == worker.peer) r.prefill_live = false;
    r.request->Push({{}, {}, FinishReason::kError,
                     Status::Unavailable(fmt::format("{} worker {} failed ({})", services::WorkerRoleName(worker.role),
                                                     worker.id, reason)),
                     {}});
    failed.push_back(id);
  }
  for (uint64_t id : failed) EndRouteLocked(id, "a peer worker of this request failed");
  const bool expected = reason == "deregister" && failed.empty();  // a clean, drained exit
  GetLogger("router")->log(expected ? spdlog::level::info : spdlog::level::warn,
                           "{} worker {} removed ({}); {} requests failed", services::WorkerRoleName(worker.role),
                           worker.id, reason, failed.size());
}

void RouterCore::OnKvReservedLocked(const std::string& peer, services::KvReservedMsg msg) {
  auto it = routes_.find(msg.request_id);
  if (it == routes_.end()) {
    SendLocked(peer, services::AbortMsg{msg.request_id, "unknown request"});
    return;
  }
  Route& r = it->second;
  if (!r.disaggregated || r.out_peer != peer || r.prefill_live || r.first_token_seen) return;  // stale or stray
  r.prefill_job.kv_descriptor = std::move(msg.descriptor);
  r.prefill_job.decode_transfer_address = std::move(msg.transfer_address);
  r.prefill_live = true;
  SendLocked(r.prefill_peer, r.prefill_job);
  r.prefill_job.prompt.clear();  // no longer needed
  r.prefill_job.kv_descriptor.clear();
}

void RouterCore::OnTokenEventLocked(const std::string& peer, services::TokenEventMsg ev) {
  auto it = routes_.find(ev.request_id);
  if (it == routes_.end()) {
    if (!ev.finishing()) SendLocked(peer, services::AbortMsg{ev.request_id, "unknown request"});
    return;
  }
  Route& r = it->second;
  const uint64_t id = ev.request_id;
  const bool from_prefill = r.disaggregated && peer == r.prefill_peer && r.prefill_live;
  const bool from_out = peer == r.out_peer && r.out_live;
  if (!from_prefill && !from_out) return;  // not this request's worker (stale peer)

  RequestEvent out_ev;
  out_ev.tokens = std::move(ev.tokens);
  out_ev.logprobs = std::move(ev.logprobs);
  out_ev.finish = ev.finish;
  out_ev.error = ev.error;

  if (from_prefill) {
    // The prefill worker's single event: the first token (or an error).
    r.prefill_live = false;
    if (WorkerEntry* w = registry_.FindByPeer(r.prefill_peer)) {
      w->outstanding_tokens -= r.prefill_tokens_charge;
      w->outstanding_requests -= 1;
    }
    r.prefill_tokens_charge = 0;
    const bool failed = !ev.error.ok() || ev.finish == FinishReason::kError || ev.finish == FinishReason::kAbort;
    if (!failed && out_ev.tokens.size() != 1) {
      out_ev.error = Status::Internal(fmt::format("prefill worker sent {} tokens, expected 1", out_ev.tokens.size()));
      out_ev.finish = FinishReason::kError;
    }
    if (!out_ev.error.ok() && out_ev.finish == FinishReason::kNone) out_ev.finish = FinishReason::kError;
    if (ev.finish == FinishReason::kAbort && out_ev.error.ok())
      out_ev.error = Status::Aborted("the prefill worker aborted the request");
    const bool ends_here = out_ev.finishing();
    services::FirstTokenMsg first;
    if (!ends_here) {
      first.request_id = id;
      first.token = out_ev.tokens[0];
      if (!out_ev.logprobs.empty()) first.logprob = out_ev.logprobs[0];
    }
    r.first_token_seen = true;
    r.request->Push(std::move(out_ev));
    if (ends_here) {
      EndRouteLocked(id, "finished at the first token");
    } else {
      SendLocked(r.out_peer, first);
    }
    return;
  }

  // Tokens from the colocated / decode worker.
  if (WorkerEntry* w = registry_.FindByPeer(r.out_peer)) {
    const int64_t n = std::min<int64_t>(static_cast<int64_t>(out_ev.tokens.size()), r.out_tokens_charge);
    w->outstanding_tokens -= n;
    r.out_tokens_charge -= n;
  }
  if (out_ev.finish == FinishReason::kAbort && out_ev.error.ok())
    out_ev.error = Status::Aborted("the worker aborted the request");
  if (!out_ev.error.ok() && out_ev.finish == FinishReason::kNone) out_ev.finish = FinishReason::kError;
  const bool finishing = out_ev.finishing();
  r.request->Push(std::move(out_ev));
  if (finishing) {
    r.out_live = false;
    EndRouteLocked(id, "the decode side failed");  // aborts a prefill still running, if any
  }
}

void RouterCore::OnMessage(std::string_view peer_view, std::string_view payload) {
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
    if (outcome.replaced) WorkerGoneLocked(*outcome.replaced, "replaced");
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
  } else if (auto* dereg = std::get_if<services::DeregisterMsg>(&msg)) {
    if (auto gone = registry_.Remove(peer)) {
      log->info("worker {} deregistered ({})", gone->id, dereg->reason);
      WorkerGoneLocked(*gone, "deregister");
    }
  } else {
    log->warn("unexpected {} message from peer {}", services::ControlMessageName(msg), HexPeer(peer));
  }
}

void RouterCore::OnTick(std::chrono::steady_clock::time_point now) {
  std::lock_guard<std::mutex> lock(mu_);
  for (const WorkerEntry& gone : registry_.Expire(now)) WorkerGoneLocked(gone, "timeout");
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
        {"last_heartbeat_ms_ago",
         std::chrono::duration_cast<std::chrono::milliseconds>(now - w->last_seen).count()},
    });
  }
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
