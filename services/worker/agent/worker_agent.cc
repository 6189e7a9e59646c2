#include "services/worker/agent/worker_agent.h"

#include <algorithm>
#include <vector>

#include "common/logging.h"
#include "services/control/control_codec.h"
#include "services/common/process_util.h"
#include "services/common/request_log.h"

namespace pdserve::services {

namespace {
using Clock = std::chrono::steady_clock;
// After a drain timeout the handler gets this long to deliver its abort events before the
// agent forgets the jobs and deregisters anyway.
constexpr std::chrono::seconds kDrainAbortGrace{5};
// Longest pause between two registration attempts while the router does not answer.
constexpr std::chrono::milliseconds kMaxRegisterRetry{2000};
}  // namespace

const char* WorkerAgent::StateName(State s) {
  switch (s) {
    case State::kRegistering: return "registering";
    case State::kRegistered: return "registered";
    case State::kDraining: return "draining";
    case State::kDeregistered: return "deregistered";
    case State::kRefused: return "refused";
  }
  return "unknown";
}

WorkerAgent::WorkerAgent(WorkerAgentOptions options, WorkerHandler* handler)
    : options_(std::move(options)),
      handler_(handler),
      incarnation_(RandomU64()),
      heartbeat_interval_(options_.heartbeat_interval),
      router_timeout_(options_.router_timeout) {
  if (options_.metrics_registry)
    metrics_ = std::make_unique<WorkerMetrics>(*options_.metrics_registry, options_.role, options_.worker_id);
  preparer_ = std::make_unique<JobPreparer>([this](const JobMsg& job) { return handler_->PrepareJob(job); },
                                            [this] {
                                              std::lock_guard<std::mutex> lock(mu_);
                                              if (channel_) channel_->Wake();
                                            });
}

Result<std::unique_ptr<WorkerAgent>> WorkerAgent::Start(WorkerAgentOptions options, WorkerHandler* handler) {
  if (!handler) return Status::InvalidArgument("WorkerAgent needs a handler");
  if (options.worker_id.empty()) return Status::InvalidArgument("worker id is empty");
  if (options.router_address.empty()) return Status::InvalidArgument("router address is empty");
  if (options.register_retry.count() <= 0 || options.heartbeat_interval.count() <= 0 ||
      options.router_timeout <= options.heartbeat_interval)
    return Status::InvalidArgument("agent timing: retry and heartbeat must be positive, router_timeout > heartbeat");
  std::unique_ptr<WorkerAgent> agent(new WorkerAgent(std::move(options), handler));
  WorkerAgent* self = agent.get();
  ControlChannelOptions co;
  co.kind = ControlChannelOptions::Kind::kDealerConnect;
  co.endpoint = self->options_.router_address;
  co.tick_interval = self->options_.tick;
  co.name = "agent " + self->options_.worker_id;
  co.on_wake = [self] { self->StartPreparedJobs(); };
  // The callbacks only run on the channel thread, which channel_'s destruction joins first.
  // Until channel_ is set, OnTick does nothing, and no message can arrive before the first
  // Register goes out from a tick.
  PDSERVE_ASSIGN_OR_RETURN(
      std::unique_ptr<ControlChannel> channel,
      ControlChannel::Start(
          co, [self](std::string_view, std::string_view payload) { self->OnMessage(payload); },
          [self](Clock::time_point now) { self->OnTick(now); }, self->options_.curve));
  {
    std::lock_guard<std::mutex> lock(self->mu_);
    self->channel_ = std::move(channel);
  }
  GetLogger("worker")->info("worker {} ({}) connecting to router {}", self->options_.worker_id,
                            WorkerRoleName(self->options_.role), self->options_.router_address);
  return agent;
}

WorkerAgent::~WorkerAgent() {
  std::unique_ptr<ControlChannel> channel;
  {
    std::lock_guard<std::mutex> lock(mu_);
    channel = std::move(channel_);
  }
  if (!channel) return;
  const State s = state();
  if (s == State::kRegistered || s == State::kDraining) {
    auto bytes = EncodeControlMessage(DeregisterMsg{"shutdown"});
    if (bytes.ok()) channel->Send("", std::move(bytes).value());
  }
  channel.reset();  // joins the owner thread: nothing is submitted to the preparer after this
  preparer_.reset();  // joins the preparer: no handler call after this
}

void WorkerAgent::Send(const ControlMessage& message) {
  auto bytes = EncodeControlMessage(message);
  if (!bytes.ok()) {
    GetLogger("worker")->error("cannot encode {}: {}", ControlMessageName(message), bytes.status().ToString());
    return;
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (channel_) channel_->Send("", std::move(bytes).value());
}

void WorkerAgent::SetState(State s) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (state_ == s) return;
    state_ = s;
  }
  cv_.notify_all();
  if (metrics_) metrics_->registered.Set(s == State::kRegistered || s == State::kDraining ? 1 : 0);
}

WorkerAgent::State WorkerAgent::state() const {
  std::lock_guard<std::mutex> lock(mu_);
  return state_;
}

Status WorkerAgent::refusal() const {
  std::lock_guard<std::mutex> lock(mu_);
  return refusal_;
}

uint64_t WorkerAgent::registrations() const {
  std::lock_guard<std::mutex> lock(mu_);
  return registrations_;
}

size_t WorkerAgent::live_jobs() const {
  std::lock_guard<std::mutex> lock(mu_);
  return live_.size();
}

uint64_t WorkerAgent::router_incarnation() const {
  std::lock_guard<std::mutex> lock(mu_);
  return router_incarnation_;
}

WorkerAgent::State WorkerAgent::WaitForExit(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait_for(lock, timeout, [&] { return state_ == State::kDeregistered || state_ == State::kRefused; });
  return state_;
}

void WorkerAgent::BeginDrain(std::chrono::milliseconds timeout) {
  std::lock_guard<std::mutex> lock(mu_);
  drain_requested_ = true;
  drain_timeout_ = timeout;
}

void WorkerAgent::SendTokenEvent(TokenEventMsg event) {
  bool finishing = event.finishing();
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = live_.find(event.request_id);
    if (it == live_.end()) return;  // aborted with a lost router, or already finished
    finishing = finishing || it->second == JobPhase::kPrefill;  // a prefill job's only event
    if (finishing) live_.erase(it);
  }
  cv_.notify_all();
  if (metrics_) {
    metrics_->generated_tokens.Increment(static_cast<double>(event.tokens.size()));
    if (finishing) {
      if (!event.error.ok()) metrics_->jobs_failed.Increment();
      else if (event.finish == FinishReason::kAbort) metrics_->jobs_aborted.Increment();
      else metrics_->jobs_finished.Increment();
    }
  }
  Send(std::move(event));
}

void WorkerAgent::SendKvReserved(KvReservedMsg reserved) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!live_.count(reserved.request_id)) return;
  }
  Send(std::move(reserved));
}

void WorkerAgent::SendKvPull(KvPullMsg pull) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!live_.count(pull.request_id)) return;
  }
  Send(std::move(pull));
}

void WorkerAgent::SendKvPushFailed(KvPushFailedMsg failed) { Send(std::move(failed)); }

void WorkerAgent::RejectJob(uint64_t request_id, const Status& status) {
  TokenEventMsg ev;
  ev.request_id = request_id;
  ev.finish = FinishReason::kError;
  ev.error = status;
  if (metrics_) metrics_->jobs_rejected.Increment();
  Send(std::move(ev));
}

std::vector<uint64_t> WorkerAgent::AbortAll(std::string_view reason) {
  std::vector<uint64_t> ids;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& [id, phase] : live_) ids.push_back(id);
    live_.clear();
  }
  cv_.notify_all();
  if (ids.empty()) return ids;
  GetLogger("worker")->warn("worker {}: aborting {} live jobs: {}", options_.worker_id, ids.size(), reason);
  for (uint64_t id : ids)
    if (preparing_.erase(id) == 0) handler_->AbortJob(id, reason);  // a preparing job: dropped when ready
  if (metrics_) metrics_->jobs_aborted.Increment(static_cast<double>(ids.size()));
  return ids;
}

void WorkerAgent::SendRegister() {
  RegisterMsg m;
  m.role = options_.role;
  m.worker_id = options_.worker_id;
  m.incarnation = incarnation_;
  m.control_address = options_.router_address;
  m.http_address = options_.http_address;
  m.transfer_address = options_.transfer_address;
  m.capacity = options_.capacity;
  const WorkerLoad load = handler_->CurrentLoad();
  // The load gauges stay fresh while the worker has no router (heartbeats refresh them otherwise).
  if (metrics_) metrics_->SetLoad(load);
  if (load.kv_blocks_total > 0) m.capacity.kv_blocks_free = load.kv_blocks_free;
  m.model_name = options_.model_name;
  m.compat_hash = options_.compat_hash;
  m.instance_id = options_.instance_id;
  m.dp_rank = options_.dp_rank;
  m.vocab_size = options_.vocab_size;
  m.kv_namespace = options_.kv_namespace;
  Send(m);
}

void WorkerAgent::SendHeartbeat() {
  HeartbeatMsg m;
  m.seq = ++heartbeat_seq_;
  m.load = handler_->CurrentLoad();
  m.draining = state() == State::kDraining;
  if (metrics_) metrics_->SetLoad(m.load);
  Send(m);
}

void WorkerAgent::SendKvEvents() {
  std::optional<KvEventsMsg> events = handler_->TakeKvEvents(kv_resync_);
  kv_resync_ = false;
  if (!events || events->empty()) return;
  if (metrics_) {
    metrics_->kv_event_stored.Increment(static_cast<double>(events->stored.size()));
    metrics_->kv_event_removed.Increment(static_cast<double>(events->removed.size()));
    if (events->reset) metrics_->kv_event_resets.Increment();
  }
  constexpr size_t kMax = ControlLimits::kMaxKvEventHashes;
  if (events->stored.size() <= kMax && events->removed.size() <= kMax) {
    Send(*events);
    return;
  }
  // Too many hashes for one message: the first part carries the reset, the rest follow it
  // (the two lists are disjoint, so their order does not matter).
  bool first = true;
  for (const std::vector<uint64_t>* list : {&events->removed, &events->stored}) {
    for (size_t at = 0; at < list->size(); at += kMax) {
      KvEventsMsg part;
      part.reset = first && events->reset;
      part.block_tokens = events->block_tokens;
      part.first_chunk_tokens = events->first_chunk_tokens;
      const size_t end = std::min(list->size(), at + kMax);
      (list == &events->stored ? part.stored : part.removed).assign(list->begin() + static_cast<std::ptrdiff_t>(at),
                                                                  list->begin() + static_cast<std::ptrdiff_t>(end));
      Send(part);
      first = false;
    }
  }
}

void WorkerAgent::OnTick(Clock::time_point now) {
  bool caught_up;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!channel_) return;
    caught_up = channel_->caught_up();
  }
  const auto stalled = listening_.Tick(now);
  last_router_contact_ = std::min(last_router_contact_ + stalled, std::max(last_router_contact_, now));
  auto log = GetLogger("worker");
  bool start_drain = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (drain_requested_ && (state_ == State::kRegistering || state_ == State::kRegistered)) {
      start_drain = true;
      drain_deadline_ = drain_timeout_.count() > 0 ? now + drain_timeout_ : Clock::time_point::max();
    }
    drain_requested_ = false;
  }
  if (start_drain) {
    if (state() == State::kRegistering) {  // nobody to drain for
      SetState(State::kDeregistered);
      return;
    }
    log->info("worker {}: draining", options_.worker_id);
    SetState(State::kDraining);
    handler_->OnDrain();
    SendHeartbeat();  // tell the router at once
  }

  // A worker that cannot make progress goes silent: the router times it out and moves its
  // requests (WorkerHandler::Health).
  const Status health = handler_->Health();
  if (!health.ok() != unhealthy_) {
    unhealthy_ = !health.ok();
    if (unhealthy_) log->error("worker {}: unhealthy, withholding heartbeats: {}", options_.worker_id, health.ToString());
    else log->info("worker {}: healthy again", options_.worker_id);
  }
  if (unhealthy_) return;

  switch (state()) {
    case State::kRegistering:
      if (now >= next_register_) {
        if (register_attempts_ == 0) {
          registering_since_ = now;
          register_warning_interval_ = std::chrono::milliseconds(1000);
          next_register_warning_ = now + register_warning_interval_;
        } else if (now >= next_register_warning_) {
          log->warn("worker {}: no answer from router {} after {} registration attempts in {:.1f} s; still trying "
                    "(is the router running, and is this its control endpoint?)",
                    options_.worker_id, options_.router_address, register_attempts_,
                    std::chrono::duration<double>(now - registering_since_).count());
          register_warning_interval_ = std::min(register_warning_interval_ * 2, std::chrono::milliseconds(60000));
          next_register_warning_ = now + register_warning_interval_;
        }
        SendRegister();
        const auto cap = std::max(options_.register_retry, kMaxRegisterRetry);
        auto delay = options_.register_retry;
        for (uint32_t i = 0; i < register_attempts_ && delay < cap; ++i) delay *= 2;
        next_register_ = now + std::min(delay, cap);
        ++register_attempts_;
      }
      break;
    case State::kRegistered:
    case State::kDraining:
      // Not while router messages wait unread in our own backlog (an ack may be among them).
      if (caught_up && now - last_router_contact_ > router_timeout_) {
        log->warn("worker {}: no answer from router {} for {} ms: registering again", options_.worker_id,
                  options_.router_address, router_timeout_.count());
        if (metrics_) metrics_->router_lost.Increment();
        std::vector<uint64_t> dropped = AbortAll("router lost");
        dropped_while_lost_.insert(dropped_while_lost_.end(), dropped.begin(), dropped.end());
        incarnation_when_lost_ = router_incarnation();
        if (state() == State::kDraining) {
          SetState(State::kDeregistered);
        } else {
          SetState(State::kRegistering);
          next_register_ = now;
        }
        break;
      }
      if (now >= next_heartbeat_) {
        SendHeartbeat();
        next_heartbeat_ = now + heartbeat_interval_;
      }
      if (now >= next_kv_events_) {
        SendKvEvents();
        next_kv_events_ = now + options_.kv_events_interval;
      }
      MaybeFinishDrain(now);
      break;
    case State::kDeregistered:
    case State::kRefused:
      break;
  }
}

void WorkerAgent::MaybeFinishDrain(Clock::time_point now) {
  if (state() != State::kDraining) return;
  std::vector<uint64_t> ids;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& [id, phase] : live_) ids.push_back(id);
  }
  if (!ids.empty()) {
    if (now < drain_deadline_) return;
    if (!drain_aborted_) {
      drain_aborted_ = true;
      GetLogger("worker")->warn("worker {}: drain timeout, aborting {} jobs", options_.worker_id, ids.size());
      for (uint64_t id : ids)
        if (!AbortPreparing(id, "drain timeout")) handler_->AbortJob(id, "drain timeout");
      return;
    }
    if (now < drain_deadline_ + kDrainAbortGrace) return;
    AbortAll("drain timeout");
  }
  GetLogger("worker")->info("worker {}: drained, deregistering", options_.worker_id);
  Send(DeregisterMsg{"drained"});
  SetState(State::kDeregistered);
}

void WorkerAgent::OnJob(JobMsg job) {
  const State s = state();
  if (s != State::kRegistered) {
    RejectJob(job.request_id, Status::Unavailable(std::string("worker ") + options_.worker_id + " is " + StateName(s)));
    return;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!live_.emplace(job.request_id, job.phase).second) {
      GetLogger("worker")->warn("[{}] duplicate job {} ignored", job.request_tag, job.request_id);
      return;
    }
  }
  if (metrics_) metrics_->prompt_tokens.Increment(static_cast<double>(job.prompt.size()));
  RequestLog("worker", job.request_tag)
      .Debug("job {} phase {} prompt {} tokens, max_tokens {}", job.request_id, JobPhaseName(job.phase),
             job.prompt.size(), job.sampling.max_tokens);
  if (handler_->NeedsPreparation(job)) {
    preparing_[job.request_id] = static_cast<uint32_t>(job.prompt.size());
    preparer_->Submit(std::move(job));
    return;
  }
  StartLiveJob(job);
}

void WorkerAgent::StartPreparedJobs() {
  for (JobPreparer::Prepared& prepared : preparer_->TakeReady()) {
    const uint64_t id = prepared.job.request_id;
    // Not there: aborted while it was prepared (its abort event went out then), or forgotten
    // with a lost router.
    if (preparing_.erase(id) == 0) continue;
    if (!prepared.status.ok()) {
      {
        std::lock_guard<std::mutex> lock(mu_);
        live_.erase(id);
      }
      RequestLog("worker", prepared.job.request_tag).Warn("job refused: {}", prepared.status.ToString());
      RejectJob(id, prepared.status);
      continue;
    }
    StartLiveJob(prepared.job);
  }
}

bool WorkerAgent::AbortPreparing(uint64_t request_id, std::string_view reason) {
  auto it = preparing_.find(request_id);
  if (it == preparing_.end()) return false;
  TokenEventMsg ev;
  ev.request_id = request_id;
  ev.finish = FinishReason::kAbort;
  ev.prompt_tokens = it->second;
  preparing_.erase(it);
  GetLogger("worker")->info("worker {}: job {} aborted before it started: {}", options_.worker_id, request_id, reason);
  SendTokenEvent(std::move(ev));  // ends it in live_ too
  return true;
}

void WorkerAgent::StartLiveJob(const JobMsg& job) {
  const uint64_t id = job.request_id;
  const std::string tag = job.request_tag;
  Status status = handler_->StartJob(job);
  if (!status.ok()) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      live_.erase(id);
    }
    RequestLog("worker", tag).Warn("job refused: {}", status.ToString());
    RejectJob(id, status);
  }
}

void WorkerAgent::OnMessage(std::string_view payload) {
  auto log = GetLogger("worker");
  auto decoded = DecodeControlMessage(payload);
  if (!decoded.ok()) {
    log->warn("worker {}: dropped a control message: {}", options_.worker_id, decoded.status().ToString());
    return;
  }
  const auto now = Clock::now();
  ControlMessage& msg = decoded.value();
  if (auto* ack = std::get_if<RegisterAckMsg>(&msg)) {
    last_router_contact_ = now;
    if (state() != State::kRegistering) return;  // an answer to a retry we no longer need
    if (register_attempts_ > 4)
      log->info("worker {}: router {} answered after {} attempts", options_.worker_id, options_.router_address,
                register_attempts_);
    register_attempts_ = 0;
    if (ack->heartbeat_interval_ms > 0) heartbeat_interval_ = std::chrono::milliseconds(ack->heartbeat_interval_ms);
    if (ack->heartbeat_timeout_ms > ack->heartbeat_interval_ms)
      router_timeout_ = std::chrono::milliseconds(ack->heartbeat_timeout_ms);
    {
      std::lock_guard<std::mutex> lock(mu_);
      router_incarnation_ = ack->router_incarnation;
      ++registrations_;
    }
    if (metrics_) metrics_->registrations.Increment();
    SetState(State::kRegistered);
    first_seq_of_registration_ = heartbeat_seq_ + 1;
    next_heartbeat_ = now;
    // A new registration starts with an empty index at the router: send the whole set.
    kv_resync_ = true;
    next_kv_events_ = now;
    log->info("worker {} registered with router {} (incarnation {:x}, heartbeat {} ms)", options_.worker_id,
              options_.router_address, ack->router_incarnation, heartbeat_interval_.count());
    // The same router instance may still route the jobs we dropped to us: tell it they are gone.
    // (A restarted router never knew them.)
    if (ack->router_incarnation == incarnation_when_lost_) {
      for (uint64_t id : dropped_while_lost_) {
        TokenEventMsg gone;
        gone.request_id = id;
        gone.finish = FinishReason::kError;
        gone.error = Status::Unavailable("worker " + options_.worker_id + " lost the router and dropped this job");
        Send(std::move(gone));
      }
      if (!dropped_while_lost_.empty())
        log->warn("worker {}: told the router about {} jobs dropped while it was unreachable", options_.worker_id,
                  dropped_while_lost_.size());
    }
    dropped_while_lost_.clear();
  } else if (auto* refuse = std::get_if<RegisterRefuseMsg>(&msg)) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      refusal_ = Status(refuse->code, refuse->message);
    }
    log->error("worker {}: the router refused registration: {}", options_.worker_id, refuse->message);
    AbortAll("registration refused");
    SetState(State::kRefused);
  } else if (auto* hb = std::get_if<HeartbeatAckMsg>(&msg)) {
    last_router_contact_ = now;
    const State s = state();
    if (s != State::kRegistered && s != State::kDraining) return;
    if (hb->seq < first_seq_of_registration_) return;  // answers a heartbeat of an earlier registration
    if (!hb->known || hb->router_incarnation != router_incarnation()) {
      log->warn("worker {}: the router no longer knows this worker (restarted or timed us out): registering again",
                options_.worker_id);
      if (metrics_) metrics_->router_lost.Increment();
      AbortAll("router forgot this worker");
      if (s == State::kDraining) {
        SetState(State::kDeregistered);
      } else {
        SetState(State::kRegistering);
        next_register_ = now;
        SendRegister();
        next_register_ = now + options_.register_retry;
      }
    }
  } else if (auto* job = std::get_if<JobMsg>(&msg)) {
    last_router_contact_ = now;
    OnJob(std::move(*job));
  } else if (auto* first = std::get_if<FirstTokenMsg>(&msg)) {
    last_router_contact_ = now;
    JobPhase phase;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = live_.find(first->request_id);
      if (it == live_.end()) return;
      phase = it->second;
    }
    Status status = phase == JobPhase::kDecode
                        ? handler_->CommitFirstToken(*first)
                        : Status::FailedPrecondition("firstToken for a job that is not a decode job");
    if (!status.ok()) {
      {
        std::lock_guard<std::mutex> lock(mu_);
        live_.erase(first->request_id);
      }
      TokenEventMsg ev;
      ev.request_id = first->request_id;
      ev.finish = FinishReason::kError;
      ev.error = status;
      if (metrics_) metrics_->jobs_failed.Increment();
      Send(std::move(ev));
      handler_->AbortJob(first->request_id, "first token refused");
    }
  } else if (auto* abort = std::get_if<AbortMsg>(&msg)) {
    last_router_contact_ = now;
    bool live;
    {
      std::lock_guard<std::mutex> lock(mu_);
      live = live_.count(abort->request_id) > 0;
    }
    if (live && !AbortPreparing(abort->request_id, abort->reason)) handler_->AbortJob(abort->request_id, abort->reason);
  } else if (auto* push = std::get_if<KvPushMsg>(&msg)) {
    last_router_contact_ = now;
    if (state() != State::kRegistered && state() != State::kDraining) {
      Send(KvPushFailedMsg{push->request_id, "worker " + options_.worker_id + " is " + StateName(state())});
      return;
    }
    if (Status s = handler_->PushKv(*push); !s.ok()) Send(KvPushFailedMsg{push->request_id, s.ToString()});
  } else if (auto* failed = std::get_if<KvPushFailedMsg>(&msg)) {
    last_router_contact_ = now;
    bool live;
    {
      std::lock_guard<std::mutex> lock(mu_);
      live = live_.count(failed->request_id) > 0;
    }
    if (live) handler_->PullFailed(*failed);
  } else if (auto* drain = std::get_if<DrainMsg>(&msg)) {
    last_router_contact_ = now;
    log->info("worker {}: the router asked to drain (timeout {} ms)", options_.worker_id, drain->timeout_ms);
    BeginDrain(std::chrono::milliseconds(drain->timeout_ms));
  } else {
    log->warn("worker {}: unexpected {} message from the router", options_.worker_id, ControlMessageName(msg));
  }
}

}  // namespace pdserve::services
