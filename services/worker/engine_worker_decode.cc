// EngineWorker, decode role (engine_worker.h): reserve, receive, commit, abort.
#include <chrono>

#include "common/logging.h"
#include "kvtransfer/kv_wire.h"
#include "kvtransfer/transfer_plan.h"
#include "services/common/request_log.h"
#include "services/worker/engine_worker.h"
#include "services/worker/import_allocator.h"

namespace pdserve::services::worker {

Status EngineWorker::StartDecode(const JobMsg& job) {
  const uint64_t rid = job.request_id;
  engine::RequestOptions ro;
  ro.sampling = ToSampling(job.sampling);
  ro.on_event = [this, rid](const engine::TokenEvent& ev) { OnEngineEvent(rid, ev); };
  PDSERVE_ASSIGN_OR_RETURN(engine::KvImport import, engine_->ReserveImport(job.prompt, std::move(ro)));
  {
    std::lock_guard<std::mutex> lock(mu_);
    Job& j = jobs_[rid];
    j.msg = job;
    j.engine_id = import.id;
    j.reserved_at = std::chrono::steady_clock::now();
  }
  const auto n = static_cast<uint32_t>(job.prompt.size());
  std::vector<uint32_t> ids(import.block_ids.begin(), import.block_ids.end());
  const auto blocks = static_cast<uint32_t>(ids.size());
  allocator_->Stage(rid, std::move(ids));
  // One writer (prefill rank 0) writes every token; a CP prefill group would split this.
  auto descriptor = receiver_->Reserve(rid, n, {kvtransfer::WriterAssignment{0, {{0, n}}}}, config_.kv_lease);
  allocator_->Unstage();
  if (!descriptor.ok()) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      jobs_.erase(rid);  // the engine's abort event finds no job
    }
    (void)engine_->Abort(import.id);
    return descriptor.status();
  }
  KvReservedMsg reserved;
  reserved.request_id = rid;
  reserved.descriptor = kvtransfer::EncodeDescriptor(*descriptor);
  reserved.transfer_address = transport_->address();
  reserved.blocks = blocks;
  RequestLog("worker", job.request_tag).Debug("job {}: reserved {} blocks for {} prompt tokens", rid, blocks, n);
  std::lock_guard<std::mutex> lock(agent_mu_);
  if (agent_) agent_->SendKvReserved(std::move(reserved));
  return Status::Ok();
}

Status EngineWorker::CommitFirstToken(const FirstTokenMsg& first) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = jobs_.find(first.request_id);
    if (it == jobs_.end() || it->second.msg.phase != JobPhase::kDecode)
      return Status::NotFound("no decode job " + std::to_string(first.request_id));
    it->second.first_token = first.token;
  }
  TryCommit(first.request_id);
  return Status::Ok();
}

void EngineWorker::TryCommit(uint64_t request_id) {
  engine::RequestId engine_id = 0;
  int32_t token = -1;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = jobs_.find(request_id);
    if (it == jobs_.end()) return;
    Job& job = it->second;
    if (job.ended || job.committed || !job.transfer_done || !job.first_token) return;
    job.committed = true;
    engine_id = job.engine_id;
    token = *job.first_token;
  }
  auto blocks = receiver_->HandOver(request_id);
  Status s = blocks.ok() ? Status::Ok() : blocks.status();
  if (blocks.ok()) {
    if (!blocks->empty()) allocator_->Forget(blocks->front());
    s = engine_->CommitImport(engine_id, token);
    if (!s.ok()) (void)engine_->Abort(engine_id);  // the engine owns the blocks now
  }
  // (HandOver failed: the receiver aborted the request and frees the blocks through
  // ImportAllocator::Free -> OnImportFreed.)
  if (!s.ok()) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = jobs_.find(request_id);
    if (it != jobs_.end()) EndLocked(it->second, FinishReason::kError, s);
  }
}

void EngineWorker::AbortDecode(std::unique_lock<std::mutex>& lock, Job& job) {
  const uint64_t rid = job.msg.request_id;
  const engine::RequestId engine_id = job.engine_id;
  if (job.committed) {
    lock.unlock();
    (void)engine_->Abort(engine_id);  // the engine's abort event ends the job
    return;
  }
  // Not handed over: the blocks may still be written. The receiver aborts the transfer and
  // frees them after its quarantine (-> OnImportFreed -> Engine::Abort); the job ends now.
  EndLocked(job, FinishReason::kAbort, Status::Ok());
  lock.unlock();
  Status s = receiver_->Abort(rid, Status::Cancelled("aborted by the router"));
  if (!s.ok()) {
    // Already complete (or terminal): take the blocks and let the engine free them.
    auto blocks = receiver_->HandOver(rid);
    if (blocks.ok()) {
      if (!blocks->empty()) allocator_->Forget(blocks->front());
      (void)engine_->Abort(engine_id);
    }
  }
}

void EngineWorker::OnImportFreed(uint64_t request_id) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = jobs_.find(request_id);
  if (it == jobs_.end()) return;
  (void)engine_->Abort(it->second.engine_id);  // frees the blocks; its event erases the job
}

void EngineWorker::ReceiverLoop(std::stop_token stop) {
  while (!stop.stop_requested()) {
    receiver_->WaitForEvents(kvtransfer::Clock::now() + std::chrono::milliseconds(100));
    for (const kvtransfer::ReceiverEvent& ev : receiver_->TakeEvents()) {
      const bool complete = ev.state == kvtransfer::RequestState::kComplete;
      {
        std::lock_guard<std::mutex> lock(mu_);
        auto it = jobs_.find(ev.request_id);
        if (it == jobs_.end()) continue;
        Job& job = it->second;
        WorkerMetrics* wm = nullptr;
        {
          std::lock_guard<std::mutex> al(agent_mu_);
          wm = agent_ ? agent_->metrics() : nullptr;
        }
        if (complete) {
          job.transfer_done = true;
          const double secs =
              std::chrono::duration<double>(std::chrono::steady_clock::now() - job.reserved_at).count();
          const auto n = static_cast<uint32_t>(job.msg.prompt.size());
          if (wm) {
            wm->kv_transfer_seconds.Observe(secs);
            wm->kv_transfer_bytes.Increment(
                static_cast<double>(kvtransfer::BytesForRanges(transfer_layout_, {{0, n}})));
          }
          if (metrics_) metrics_->transfers_ok.Increment();
        } else {
          if (wm) wm->kv_transfer_failures.Increment();
          if (metrics_) metrics_->transfers_failed.Increment();
          if (!job.ended) {
            Status why = ev.status.ok() ? Status::Aborted("KV transfer aborted") : ev.status;
            EndLocked(job, FinishReason::kError,
                      Status(why.code(), "KV transfer failed: " + std::string(why.message())));
          }
          continue;
        }
      }
      TryCommit(ev.request_id);
    }
  }
}

}  // namespace pdserve::services::worker
