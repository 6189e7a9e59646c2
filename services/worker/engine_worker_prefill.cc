// EngineWorker, prefill role (engine_worker.h): compute the prompt with hold_kv, write its KV
// into the decode worker's blocks, then report the first token.
//
// Layer streaming (config kv_stream_layers, the default): the engine's KV export hooks run on
// its step thread during the forward of the prompt's last chunk. `begin` starts the KvSender
// over the request's blocks; `layer_done(l)` queues layer l's writes (KvSender::WriteLayers
// returns at once; the transport writes while the next layers compute). After the first token
// is sampled, the transfer thread only has to Finish (flush, completion notice, verdict).
// Without streaming the transfer thread writes every layer after the forward (Start + Finish).
//
// Safety: once the sender started, the request's blocks stay held by the engine whatever way
// the request ends (engine KvExportHooks contract) and are released only by the transfer
// thread after KvSender::Finish or Abort returned, so no write ever reads a block given to
// another request. A job ending early (error mid-layers, abort, nothing to decode) is queued
// to the transfer thread for that abort + release: the engine thread never waits on the
// network.
#include <chrono>

#include "common/logging.h"
#include "kvtransfer/kv_wire.h"
#include "kvtransfer/transfer_plan.h"
#include "services/common/request_log.h"
#include "services/worker/engine_worker.h"

namespace pdserve::services::worker {

namespace {
using Clock = std::chrono::steady_clock;
double Since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }
}  // namespace

kvtransfer::KvSource EngineWorker::SourceFor(const std::vector<int32_t>& blocks, uint32_t num_tokens) const {
  const engine::BlockPool& pool = engine_->pool();
  kvtransfer::KvSource source;
  source.layout = transfer_layout_;
  kvtransfer::SourceRun run;
  run.tokens = {0, num_tokens};
  for (int32_t b : blocks) run.blocks.push_back(pool.base() + static_cast<int64_t>(b) * pool.block_bytes());
  source.runs.push_back(std::move(run));
  return source;
}

Status EngineWorker::StartPrefill(const JobMsg& job) {
  PDSERVE_ASSIGN_OR_RETURN(kvtransfer::KvDescriptor d, kvtransfer::DecodeDescriptor(job.kv_descriptor));
  PDSERVE_RETURN_IF_ERROR(d.Validate());
  if (d.request_id != job.request_id || d.num_tokens != job.prompt.size())
    return Status::InvalidArgument("the KV descriptor is for another request or prompt length");
  if (!d.layout.SameTokenFormat(transfer_layout_))
    return Status::InvalidArgument("the decode worker's KV layout " + d.layout.ToString() +
                                   " differs from this prefill worker's " + transfer_layout_.ToString());
  const uint64_t rid = job.request_id;
  engine::RequestOptions ro;
  ro.sampling = ToSampling(job.sampling);
  ro.sampling.max_tokens = 1;
  ro.hold_kv = true;
  ro.on_event = [this, rid](const engine::TokenEvent& ev) { OnEngineEvent(rid, ev); };
  if (config_.kv_stream_layers) {
    ro.kv_export.begin = [this, rid](const std::vector<int32_t>& blocks) { StreamBegin(rid, blocks); };
    ro.kv_export.layer_done = [this, rid](int64_t layer) { StreamLayer(rid, layer); };
  }
  std::lock_guard<std::mutex> lock(mu_);
  PDSERVE_ASSIGN_OR_RETURN(engine::RequestId id, engine_->AddRequest(job.prompt, std::move(ro)));
  Job& j = jobs_[rid];
  j.msg = job;
  j.engine_id = id;
  j.descriptor = std::move(d);
  return Status::Ok();
}

void EngineWorker::StreamBegin(uint64_t rid, const std::vector<int32_t>& blocks) {
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

void EngineWorker::StreamLayer(uint64_t rid, int64_t layer) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = jobs_.find(rid);
    if (it == jobs_.end() || !it->second.sender_started) return;
  }
  // A failure here (the decode side aborted, a dead connection) is the request's terminal
  // status, which Finish reports; the forward goes on for the other requests of the step.
  if (sender_->WriteLayers(rid, static_cast<uint32_t>(layer)).ok() && metrics_) metrics_->layers_streamed.Increment();
}

void EngineWorker::RetirePrefillLocked(Job& job) {
  const uint64_t rid = job.msg.request_id;
  if (job.sender_started) {
    // Writes may be in flight: the transfer thread aborts them, then releases the blocks.
    transfers_.push_back(rid);
    cv_.notify_all();
    return;
  }
  (void)engine_->ReleaseKv(job.engine_id);  // NotFound when nothing is held: fine
  jobs_.erase(rid);
}

void EngineWorker::PrefillSampled(Job& job, const engine::TokenEvent& ev) {
  const uint64_t rid = job.msg.request_id;
  job.sampled_at = Clock::now();
  if (job.sender_started && metrics_ && sender_) {
    // How much of the KV already landed on the decode side while the prompt computed.
    if (auto p = sender_->Progress(rid); p.ok())
      metrics_->stream_landed_bytes.Increment(static_cast<double>(p->bytes_written));
  }
  const bool failed =
      ev.token < 0 || ev.reason == engine::FinishReason::kAbort || ev.reason == engine::FinishReason::kError;
  if (job.ended || failed || job.cancel_requested) {
    if (!job.ended) {
      Status err = ev.reason == engine::FinishReason::kError
                       ? (ev.error.ok() ? Status::Internal("prefill failed") : ev.error)
                       : Status::Ok();
      EndLocked(job, err.ok() ? FinishReason::kAbort : FinishReason::kError, err);
    }
    RetirePrefillLocked(job);
    return;
  }
  job.token = ev.token;
  job.engine_reason = ev.reason;
  if (job.msg.sampling.logprobs) {
    job.logprob.logprob = ev.logprob;
    for (const auto& [t, v] : ev.top_logprobs) job.logprob.top.push_back({t, v});
  }
  const bool ends_here = ev.reason == engine::FinishReason::kStop || job.msg.sampling.max_tokens <= 1;
  if (ends_here) {
    // Nothing to decode: no transfer (the router aborts the decode side's reservation).
    TokenEventMsg msg;
    msg.request_id = rid;
    msg.tokens = {ev.token};
    if (job.msg.sampling.logprobs) msg.logprobs = {job.logprob};
    msg.finish = ev.reason == engine::FinishReason::kStop ? FinishReason::kStop : FinishReason::kLength;
    msg.prompt_tokens = static_cast<uint32_t>(job.msg.prompt.size());
    msg.completion_tokens = 1;
    job.ended = true;
    Send(std::move(msg));
    RetirePrefillLocked(job);
    return;
  }
  transfers_.push_back(rid);
  cv_.notify_all();
}

void EngineWorker::AbortPrefill(std::unique_lock<std::mutex>& lock, Job& job) {
  const uint64_t rid = job.msg.request_id;
  if (job.token < 0) {
    // Still computing: its abort event ends the job. If the prompt finishes in the step
    // already running (the abort lands after it), the sampled event sees cancel_requested.
    job.cancel_requested = true;
    (void)engine_->Abort(job.engine_id);
    return;
  }
  // Sampled: queued for, or in, the transfer. End the job now; the transfer stops (or is
  // skipped) and releases the held blocks.
  EndLocked(job, FinishReason::kAbort, Status::Ok());
  lock.unlock();
  sender_->Abort(rid, Status::Cancelled("aborted by the router"));
}

void EngineWorker::TransferLoop(std::stop_token stop) {
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

void EngineWorker::RunTransfer(uint64_t rid) {
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
    (void)engine_->ReleaseKv(engine_id);
    std::lock_guard<std::mutex> lock(mu_);
    jobs_.erase(rid);
    return;
  }
  // The transfer time runs from the first write: the stream's start, or now.
  const auto t0 = started ? began_at : Clock::now();
  Status s = stream_status;
  if (s.ok() && !started) {
    // Whole-prompt mode (or the stream never began): every layer now.
    auto held = engine_->HeldBlocks(engine_id);
    s = held.ok() ? sender_->Start(d, 0, SourceFor(*held, d.num_tokens)) : held.status();
    started = s.ok();
  }
  if (started) s = sender_->Finish(rid);  // layers not yet queued, flush, completion notice, verdict
  (void)engine_->ReleaseKv(engine_id);
  WorkerMetrics* wm = AgentMetrics();
  if (s.ok()) {
    if (wm) {
      wm->kv_transfer_bytes.Increment(
          static_cast<double>(kvtransfer::BytesForRanges(transfer_layout_, {{0, d.num_tokens}})));
      wm->kv_transfer_seconds.Observe(std::chrono::duration<double>(Clock::now() - t0).count());
    }
    if (metrics_) {
      metrics_->transfers_ok.Increment();
      metrics_->transfer_tail.Observe(Since(sampled_at));
    }
  } else {
    GetLogger("worker")->warn("KV transfer of request {} failed: {}", rid, s.ToString());
    if (wm) wm->kv_transfer_failures.Increment();
    if (metrics_) metrics_->transfers_failed.Increment();
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
      msg.finish = FinishReason::kNone;  // the decode worker continues
      msg.prompt_tokens = static_cast<uint32_t>(job.msg.prompt.size());
      msg.completion_tokens = 1;
      job.ended = true;
      Send(std::move(msg));
    }
  }
  jobs_.erase(it);
}

}  // namespace pdserve::services::worker
