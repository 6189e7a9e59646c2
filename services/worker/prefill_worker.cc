// PrefillWorker (prefill_worker.h): compute the prompt with hold_kv, write its KV into the
// decode worker's blocks, then report the first token.
//
// Layer streaming (config kv_stream_layers, the default): the engine's KV export hooks run on
// its step thread during the forward of the prompt's last chunk. `begin` starts the KvSender
// over the request's blocks; `layer_done(l)` queues layer l's writes (KvSender::WriteLayers
// returns at once; the transport writes while the next layers compute). After the first token
// is sampled, the transfer thread only has to Finish (flush, completion notice, verdict).
// Without streaming the transfer thread writes every layer after the forward (Start + Finish).
#include "services/worker/prefill_worker.h"

#include <chrono>

#include "common/logging.h"
#include "kvtransfer/kv_wire.h"
#include "kvtransfer/transfer_plan.h"
#include "services/common/request_log.h"

namespace pdserve::services::worker {

namespace {
using Clock = std::chrono::steady_clock;
double Since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }
}  // namespace

Result<std::unique_ptr<PrefillWorker>> PrefillWorker::Create(std::unique_ptr<EngineHost> host,
                                                             const WorkerHooks& hooks) {
  std::unique_ptr<PrefillWorker> w(new PrefillWorker(std::move(host)));
  kvtransfer::Transport* send_through = w->host_->transport();
  if (hooks.wrap_sender_transport) {
    w->send_transport_ = hooks.wrap_sender_transport(send_through);
    send_through = w->send_transport_.get();
  }
  PDSERVE_ASSIGN_OR_RETURN(w->sender_, kvtransfer::KvSender::Create(send_through));
  w->pusher_ = std::make_unique<KvPusher>(w->host_.get(), w->sender_.get());
  PDSERVE_ASSIGN_OR_RETURN(w->puller_, PrefixPuller::Create(w->host_.get()));
  w->transfer_thread_ = std::jthread([p = w.get()](std::stop_token st) { p->TransferLoop(st); });
  w->abort_thread_ = std::jthread([p = w.get()](std::stop_token st) { p->AbortLoop(st); });
  w->host_->engine().Start();
  return w;
}

PrefillWorker::~PrefillWorker() {
  host_->SetAgent(nullptr);
  puller_.reset();
  pusher_.reset();
  transfer_thread_ = {};
  abort_thread_ = {};
  host_->StopEngine();
  sender_.reset();
  send_transport_.reset();
  host_->DestroyEngine();
}

void PrefillWorker::EndLocked(Job& job, FinishReason finish, const Status& error) {
  host_->SendEndOnce(job.msg, &job.ended, finish, error);
}

void PrefillWorker::OnEngineEvent(uint64_t request_id, const engine::TokenEvent& ev) {
  host_->ObserveQueueTime(ev);
  if (!ev.finished) return;  // max_tokens 1: the token comes with the finish
  std::lock_guard<std::mutex> lock(mu_);
  auto it = jobs_.find(request_id);
  if (it == jobs_.end()) return;
  Sampled(it->second, ev);  // may erase the job
}

kvtransfer::KvSource PrefillWorker::SourceFor(const std::vector<int32_t>& blocks, uint32_t num_tokens) {
  const engine::BlockPool& pool = host_->engine().pool();
  kvtransfer::KvSource source;
  source.layout = host_->kv_layout();
  kvtransfer::SourceRun run;
  run.tokens = {0, num_tokens};
  for (int32_t b : blocks) run.blocks.push_back(pool.base() + static_cast<int64_t>(b) * pool.block_bytes());
  source.runs.push_back(std::move(run));
  return source;
}

Status PrefillWorker::StartJob(const JobMsg& job) {
  PDSERVE_RETURN_IF_ERROR(host_->CheckDpRank(job));
  if (job.phase != JobPhase::kPrefill)
    return Status::InvalidArgument(std::string("a prefill worker does not run ") + JobPhaseName(job.phase) + " jobs");
  PDSERVE_ASSIGN_OR_RETURN(kvtransfer::KvDescriptor d, kvtransfer::DecodeDescriptor(job.kv_descriptor));
  PDSERVE_RETURN_IF_ERROR(d.Validate());
  if (d.request_id != job.request_id || d.num_tokens != job.prompt.size())
    return Status::InvalidArgument("the KV descriptor is for another request or prompt length");
  if (!d.layout.SameTokenFormat(host_->kv_layout()))
    return Status::InvalidArgument("the decode worker's KV layout " + d.layout.ToString() +
                                   " differs from this prefill worker's " + host_->kv_layout().ToString());
  const uint64_t rid = job.request_id;
  PDSERVE_ASSIGN_OR_RETURN(engine::RequestOptions ro,
                           host_->JobOptions(job, [this, rid](const engine::TokenEvent& ev) { OnEngineEvent(rid, ev); }));
  ro.sampling.max_tokens = 1;
  ro.hold_kv = true;
  ro.constraint.export_state = ro.constraint.active();  // the decode side resumes from it
  if (host_->config().kv_stream_layers) {
    ro.kv_export.begin = [this, rid](const std::vector<int32_t>& blocks) { StreamBegin(rid, blocks); };
    ro.kv_export.layer_done = [this, rid](int64_t layer) { StreamLayer(rid, layer); };
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    Job& j = jobs_[rid];
    j.msg = job;
    j.descriptor = std::move(d);
    j.pending_options = std::move(ro);
    j.pulling = true;  // Begin's on_done may run before it returns
  }
  if (puller_->Begin(job, [this, rid] { OnPullDone(rid); })) return Status::Ok();
  std::lock_guard<std::mutex> lock(mu_);
  Job& j = jobs_[rid];
  j.pulling = false;
  Status s = SubmitLocked(j);
  if (!s.ok()) jobs_.erase(rid);
  return s;
}

Status PrefillWorker::SubmitLocked(Job& job) {
  auto id = host_->engine().AddRequest(job.msg.prompt, std::move(*job.pending_options));
  job.pending_options.reset();
  PDSERVE_RETURN_IF_ERROR(id.status());
  job.engine_id = *id;
  return Status::Ok();
}

WorkerLoad PrefillWorker::CurrentLoad() {
  WorkerLoad load = EngineWorker::CurrentLoad();
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& [rid, job] : jobs_) {
    if (!job.pulling || job.ended) continue;
    const uint64_t prompt = job.msg.prompt.size();
    ++load.waiting;
    load.queued_tokens += prompt - std::min<uint64_t>(job.msg.pull_tokens, prompt - 1) + 1;
  }
  return load;
}

void PrefillWorker::OnPullDone(uint64_t rid) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = jobs_.find(rid);
  if (it == jobs_.end()) return;
  Job& job = it->second;
  job.pulling = false;
  if (job.ended) {  // aborted while pulling: it already sent its end event
    jobs_.erase(it);
    return;
  }
  if (Status s = SubmitLocked(job); !s.ok()) {
    EndLocked(job, FinishReason::kError, s);
    jobs_.erase(it);
  }
}

void PrefillWorker::PullFailed(const KvPushFailedMsg& failed) {
  puller_->Fail(failed.request_id, Status::Unavailable("the holder cannot write the pull: " + failed.reason));
}

void PrefillWorker::StreamBegin(uint64_t rid, const std::vector<int32_t>& blocks) {
  kvtransfer::KvDescriptor d;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = jobs_.find(rid);
    if (it == jobs_.end() || it->second.ended) return;
    d = *it->second.descriptor;
  }
  Status s = sender_->Start(d, 0, SourceFor(blocks, d.num_tokens));
  std::lock_guard<std::mutex> lock(mu_);
  auto it = jobs_.find(rid);
  if (it == jobs_.end()) {  // cannot happen (only this thread's events retire a computing job)
    if (s.ok()) sender_->Abort(rid, Status::Cancelled("prefill job gone"));
    return;
  }
  it->second.sender_started = s.ok();
  it->second.stream_status = s;
  it->second.stream_began_at = Clock::now();
  if (!s.ok())
    RequestLog("worker", it->second.msg.request_tag).Warn("job {}: KV stream not started: {}", rid, s.ToString());
}

void PrefillWorker::StreamLayer(uint64_t rid, int64_t layer) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = jobs_.find(rid);
    if (it == jobs_.end() || !it->second.sender_started) return;
  }
  // A failure here (the decode side aborted, a dead connection) is the request's terminal
  // status, which Finish reports; the forward goes on for the other requests of the step.
  if (sender_->WriteLayers(rid, static_cast<uint32_t>(layer)).ok() && host_->metrics())
    host_->metrics()->layers_streamed.Increment();
}

void PrefillWorker::RetireLocked(Job& job) {
  const uint64_t rid = job.msg.request_id;
  if (job.sender_started) {
    // Writes may be in flight: the transfer thread aborts them, then releases the blocks.
    transfers_.push_back(rid);
    cv_.notify_all();
    return;
  }
  (void)host_->engine().ReleaseKv(job.engine_id);  // NotFound when nothing is held: fine
  jobs_.erase(rid);
}

void PrefillWorker::Sampled(Job& job, const engine::TokenEvent& ev) {
  const uint64_t rid = job.msg.request_id;
  job.sampled_at = Clock::now();
  if (job.sender_started && host_->metrics() && sender_) {
    // How much of the KV already landed on the decode side while the prompt computed.
    if (auto p = sender_->Progress(rid); p.ok())
      host_->metrics()->stream_landed_bytes.Increment(static_cast<double>(p->bytes_written));
  }
  const bool failed =
      ev.token < 0 || ev.reason == FinishReason::kAbort || ev.reason == FinishReason::kError;
  if (job.ended || failed || job.cancel_requested) {
    if (!job.ended) {
      Status err = ev.reason == FinishReason::kError
                       ? (ev.error.ok() ? Status::Internal("prefill failed") : ev.error)
                       : Status::Ok();
      EndLocked(job, err.ok() ? FinishReason::kAbort : FinishReason::kError, err);
    }
    RetireLocked(job);
    return;
  }
  job.token = ev.token;
  job.engine_reason = ev.reason;
  job.constraint_state = ev.constraint_state;
  job.cached_prompt_tokens = static_cast<uint32_t>(ev.cached_prompt_tokens);
  if (job.msg.sampling.logprobs) {
    job.logprob.logprob = ev.logprob;
    for (const auto& [t, v] : ev.top_logprobs) job.logprob.top.push_back({t, v});
  }
  const bool ends_here = ev.reason == FinishReason::kStop || job.msg.sampling.max_tokens <= 1;
  if (ends_here) {
    // Nothing to decode: no transfer (the router aborts the decode side's reservation).
    TokenEventMsg msg;
    msg.request_id = rid;
    msg.tokens = {ev.token};
    if (job.msg.sampling.logprobs) msg.logprobs = {job.logprob};
    msg.constraint_state = job.constraint_state;
    msg.cached_prompt_tokens = job.cached_prompt_tokens;
    msg.finish = ev.reason == FinishReason::kStop ? FinishReason::kStop : FinishReason::kLength;
    msg.prompt_tokens = static_cast<uint32_t>(job.msg.prompt.size());
    msg.completion_tokens = 1;
    job.ended = true;
    host_->Send(std::move(msg));
    RetireLocked(job);
    return;
  }
  transfers_.push_back(rid);
  cv_.notify_all();
}

void PrefillWorker::AbortJob(uint64_t request_id, std::string_view reason) {
  std::unique_lock<std::mutex> lock(mu_);
  auto it = jobs_.find(request_id);
  if (it == jobs_.end()) return;
  Job& job = it->second;
  RequestLog("worker", job.msg.request_tag).Info("abort job {}: {}", request_id, reason);
  const uint64_t rid = job.msg.request_id;
  if (job.pulling) {
    // Not in the engine yet: end it now; the pull's end (hurried by Fail) forgets it.
    EndLocked(job, FinishReason::kAbort, Status::Ok());
    lock.unlock();
    puller_->Fail(rid, Status::Cancelled("aborted by the router"));
    return;
  }
  if (job.token < 0) {
    // Still computing: its abort event ends the job. If the prompt finishes in the step
    // already running (the abort lands after it), the sampled event sees cancel_requested.
    job.cancel_requested = true;
    (void)host_->engine().Abort(job.engine_id);
    return;
  }
  // Sampled: queued for, or in, the transfer. End the job now; the abort thread stops the
  // writes (the transfer thread then skips or ends it and releases the held blocks).
  EndLocked(job, FinishReason::kAbort, Status::Ok());
  aborts_.push_back(rid);
  abort_cv_.notify_all();
}

void PrefillWorker::AbortLoop(std::stop_token stop) {
  while (true) {
    uint64_t rid = 0;
    {
      std::unique_lock<std::mutex> lock(mu_);
      abort_cv_.wait(lock, stop, [this] { return !aborts_.empty(); });
      if (stop.stop_requested()) return;
      rid = aborts_.front();
      aborts_.pop_front();
    }
    sender_->Abort(rid, Status::Cancelled("aborted by the router"));  // a finished request: nothing to do
  }
}

void PrefillWorker::TransferLoop(std::stop_token stop) {
  while (true) {
    uint64_t rid = 0;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, stop, [this] { return !transfers_.empty(); });
      if (stop.stop_requested()) return;
      rid = transfers_.front();
      transfers_.pop_front();
    }
    RunTransfer(rid);
  }
}

void PrefillWorker::RunTransfer(uint64_t rid) {
  kvtransfer::KvDescriptor d;
  engine::RequestId engine_id = 0;
  bool started = false, ended = false;
  Status stream_status;
  Clock::time_point sampled_at, began_at;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = jobs_.find(rid);
    if (it == jobs_.end()) return;
    Job& job = it->second;
    engine_id = job.engine_id;
    started = job.sender_started;
    stream_status = job.stream_status;
    sampled_at = job.sampled_at;
    began_at = job.stream_began_at;
    ended = job.ended;
    d = *job.descriptor;
  }
  if (ended) {
    // Ended early (error, abort, nothing to decode): stop the writes, then free the blocks.
    if (started) sender_->Abort(rid, Status::Cancelled("prefill job ended"));
    (void)host_->engine().ReleaseKv(engine_id);
    std::lock_guard<std::mutex> lock(mu_);
    jobs_.erase(rid);
    return;
  }
  // The transfer time runs from the first write: the stream's start, or now.
  const auto t0 = started ? began_at : Clock::now();
  Status s = stream_status;
  if (s.ok() && !started) {
    // Whole-prompt mode (or the stream never began): every layer now.
    auto held = host_->engine().HeldBlocks(engine_id);
    s = held.ok() ? sender_->Start(d, 0, SourceFor(*held, d.num_tokens)) : held.status();
    started = s.ok();
  }
  if (started) s = sender_->Finish(rid);  // layers not yet queued, flush, completion notice, verdict
  (void)host_->engine().ReleaseKv(engine_id);
  WorkerMetrics* wm = host_->AgentMetrics();
  EngineWorkerMetrics* em = host_->metrics();
  if (s.ok()) {
    if (wm) {
      wm->kv_transfer_bytes.Increment(
          static_cast<double>(kvtransfer::BytesForRanges(host_->kv_layout(), {{0, d.num_tokens}})));
      wm->kv_transfer_seconds.Observe(std::chrono::duration<double>(Clock::now() - t0).count());
    }
    if (em) {
      em->transfers_ok.Increment();
      em->transfer_tail.Observe(Since(sampled_at));
    }
  } else {
    GetLogger("worker")->warn("KV transfer of request {} failed: {}", rid, s.ToString());
    if (wm) wm->kv_transfer_failures.Increment();
    if (em) em->transfers_failed.Increment();
  }
  std::lock_guard<std::mutex> lock(mu_);
  auto it = jobs_.find(rid);
  if (it == jobs_.end()) return;
  Job& job = it->second;
  if (!job.ended) {
    if (!s.ok()) {
      EndLocked(job, FinishReason::kError,
                Status(s.code() == StatusCode::kOk ? StatusCode::kInternal : s.code(),
                       "KV transfer to the decode worker failed: " + s.message()));
    } else {
      TokenEventMsg msg;
      msg.request_id = rid;
      msg.tokens = {job.token};
      if (job.msg.sampling.logprobs) msg.logprobs = {job.logprob};
      msg.constraint_state = job.constraint_state;
      msg.cached_prompt_tokens = job.cached_prompt_tokens;
      msg.finish = FinishReason::kNone;  // the decode worker continues
      msg.prompt_tokens = static_cast<uint32_t>(job.msg.prompt.size());
      msg.completion_tokens = 1;
      job.ended = true;
      host_->Send(std::move(msg));
    }
  }
  jobs_.erase(it);
}

}  // namespace pdserve::services::worker
