// EngineWorker, prefill role (engine_worker.h): compute the prompt with hold_kv, write the held
// KV into the decode worker's blocks, then report the first token.
//
// First step, what remains: the KV is written after the whole prompt was computed (KvSender
// Start + Finish, which queues every layer), because engine::Engine does not report per-layer
// progress. Layer streaming needs an engine hook "layer l of request r is in its blocks"
// (called from the model's forward pass) that calls KvSender::WriteLayers(r, l).
#include <chrono>

#include "common/logging.h"
#include "kvtransfer/kv_wire.h"
#include "kvtransfer/transfer_plan.h"
#include "services/common/request_log.h"
#include "services/worker/engine_worker.h"

namespace pdserve::services::worker {

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
  std::lock_guard<std::mutex> lock(mu_);
  PDSERVE_ASSIGN_OR_RETURN(engine::RequestId id, engine_->AddRequest(job.prompt, std::move(ro)));
  Job& j = jobs_[rid];
  j.msg = job;
  j.engine_id = id;
  j.descriptor = std::move(d);
  return Status::Ok();
}

void EngineWorker::PrefillSampled(Job& job, const engine::TokenEvent& ev) {
  const uint64_t rid = job.msg.request_id;
  if (job.ended || ev.token < 0 || ev.reason == engine::FinishReason::kAbort ||
      ev.reason == engine::FinishReason::kError) {
    (void)engine_->ReleaseKv(job.engine_id);
    if (!job.ended) {
      Status err = ev.reason == engine::FinishReason::kError
                       ? (ev.error.ok() ? Status::Internal("prefill failed") : ev.error)
                       : Status::Ok();
      EndLocked(job, err.ok() ? FinishReason::kAbort : FinishReason::kError, err);
    }
    jobs_.erase(rid);
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
    (void)engine_->ReleaseKv(job.engine_id);
    TokenEventMsg msg;
    msg.request_id = rid;
    msg.tokens = {ev.token};
    if (job.msg.sampling.logprobs) msg.logprobs = {job.logprob};
    msg.finish = ev.reason == engine::FinishReason::kStop ? FinishReason::kStop : FinishReason::kLength;
    msg.prompt_tokens = static_cast<uint32_t>(job.msg.prompt.size());
    msg.completion_tokens = 1;
    job.ended = true;
    jobs_.erase(rid);
    Send(std::move(msg));
    return;
  }
  transfers_.push_back(rid);
  cv_.notify_all();
}

void EngineWorker::AbortPrefill(std::unique_lock<std::mutex>& lock, Job& job) {
  const uint64_t rid = job.msg.request_id;
  if (job.token < 0) {
    (void)engine_->Abort(job.engine_id);  // still computing: its abort event ends the job
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
  std::string tag;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = jobs_.find(rid);
    if (it == jobs_.end()) return;
    Job& job = it->second;
    engine_id = job.engine_id;
    tag = job.msg.request_tag;
    if (job.ended) {
      (void)engine_->ReleaseKv(engine_id);
      jobs_.erase(it);
      return;
    }
    d = *job.descriptor;
  }
  const auto started = std::chrono::steady_clock::now();
  Status s;
  auto held = engine_->HeldBlocks(engine_id);
  if (!held.ok()) {
    s = held.status();
  } else {
    const engine::BlockPool& pool = engine_->pool();
    kvtransfer::KvSource source;
    source.layout = transfer_layout_;
    kvtransfer::SourceRun run;
    run.tokens = {0, d.num_tokens};
    for (int32_t b : *held) run.blocks.push_back(pool.base() + static_cast<int64_t>(b) * pool.block_bytes());
    source.runs.push_back(std::move(run));
    s = sender_->Start(d, 0, std::move(source));
    if (s.ok()) s = sender_->Finish(rid);  // every layer, flush, completion notice, verdict
  }
  (void)engine_->ReleaseKv(engine_id);
  WorkerMetrics* wm = nullptr;
  {
    std::lock_guard<std::mutex> al(agent_mu_);
    wm = agent_ ? agent_->metrics() : nullptr;
  }
  if (s.ok()) {
    if (wm) {
      wm->kv_transfer_bytes.Increment(
          static_cast<double>(kvtransfer::BytesForRanges(transfer_layout_, {{0, d.num_tokens}})));
      wm->kv_transfer_seconds.Observe(
          std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count());
    }
    if (metrics_) metrics_->transfers_ok.Increment();
  } else {
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
