// DecodeWorker (decode_worker.h): reserve, receive, commit, abort.
#include "services/worker/decode_worker.h"

#include <chrono>

#include "common/logging.h"
#include "kvtransfer/kv_wire.h"
#include "kvtransfer/transfer_plan.h"
#include "services/common/request_log.h"

namespace pdserve::services::worker {

Result<std::unique_ptr<DecodeWorker>> DecodeWorker::Create(std::unique_ptr<EngineHost> host) {
  std::unique_ptr<DecodeWorker> w(new DecodeWorker(std::move(host)));
  EngineHost& h = *w->host_;
  w->allocator_ = std::make_unique<ImportAllocator>(&h.engine().pool(),
                                                    [p = w.get()](uint64_t request_id) { p->OnImportFreed(request_id); });
  kvtransfer::ReceiverBlockPool pool;
  pool.region = h.region();
  pool.first_block_offset = static_cast<uint64_t>(h.engine().pool().base() - h.region()->data());
  pool.layout = h.kv_layout();
  pool.allocator = w->allocator_.get();
  kvtransfer::KvReceiverOptions ro;
  ro.lease = h.config().kv_lease;
  ro.transfer_timeout = h.config().kv_transfer_timeout;
  PDSERVE_ASSIGN_OR_RETURN(w->receiver_, kvtransfer::KvReceiver::Create(h.transport(), pool, ro));
  PDSERVE_ASSIGN_OR_RETURN(w->push_sender_, kvtransfer::KvSender::Create(h.transport()));
  w->pusher_ = std::make_unique<KvPusher>(&h, w->push_sender_.get());
  w->receiver_thread_ = std::jthread([p = w.get()](std::stop_token st) { p->ReceiverLoop(st); });
  h.engine().Start();
  return w;
}

DecodeWorker::~DecodeWorker() {
  host_->SetAgent(nullptr);
  pusher_.reset();
  push_sender_.reset();
  receiver_thread_ = {};
  host_->DestroyEngine();
  receiver_.reset();
  allocator_.reset();
}

void DecodeWorker::EndLocked(Job& job, FinishReason finish, const Status& error) {
  host_->SendEndOnce(job.msg, &job.ended, finish, error);
}

void DecodeWorker::OnEngineEvent(uint64_t request_id, const engine::TokenEvent& ev) {
  host_->ObserveQueueTime(ev);
  std::optional<TokenEventMsg> msg;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = jobs_.find(request_id);
    if (it == jobs_.end()) return;
    Job& job = it->second;
    if (job.ended) {
      if (ev.finished) jobs_.erase(it);
      return;
    }
    // The prefill's token (CommitImport re-emits it) is output index 0, or resumed_output for a
    // migrated request; the router has it.
    // A local job's first token is its own: streamed like every other.
    const bool skip_token = !job.local && ev.index == static_cast<int64_t>(job.msg.sampling.resumed_output);
    msg = EngineHost::StreamEvent(job.msg, ev, skip_token);
    if (ev.finished) {
      job.ended = true;
      jobs_.erase(it);
    }
  }
  if (msg) host_->Send(std::move(*msg));
}

Status DecodeWorker::StartLocalJob(const JobMsg& job) {
  const uint64_t rid = job.request_id;
  PDSERVE_ASSIGN_OR_RETURN(engine::RequestOptions ro,
                           host_->JobOptions(job, [this, rid](const engine::TokenEvent& ev) { OnEngineEvent(rid, ev); }));
  std::lock_guard<std::mutex> lock(mu_);  // the first event must find the job
  PDSERVE_ASSIGN_OR_RETURN(engine::RequestId id, host_->engine().AddRequest(job.prompt, std::move(ro)));
  Job& j = jobs_[rid];
  j.msg = job;
  j.engine_id = id;
  j.local = true;
  j.transfer_done = j.committed = true;  // the engine owns everything: an abort goes to it
  RequestLog("worker", job.request_tag).Debug("job {}: decode-side hit, {} prompt tokens run here", rid, job.prompt.size());
  return Status::Ok();
}

Status DecodeWorker::StartJob(const JobMsg& job) {
  PDSERVE_RETURN_IF_ERROR(host_->CheckDpRank(job));
  if (job.phase == JobPhase::kColocated) return StartLocalJob(job);
  if (job.phase != JobPhase::kDecode)
    return Status::InvalidArgument(std::string("a decode worker does not run ") + JobPhaseName(job.phase) + " jobs");
  const uint64_t rid = job.request_id;
  PDSERVE_ASSIGN_OR_RETURN(engine::RequestOptions ro,
                           host_->JobOptions(job, [this, rid](const engine::TokenEvent& ev) { OnEngineEvent(rid, ev); }));
  ro.imported_kv_namespace = job.prefill_kv_namespace;  // equal to ours: the KV joins our cache
  PDSERVE_ASSIGN_OR_RETURN(engine::KvImport import, host_->engine().ReserveImport(job.prompt, std::move(ro)));
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
  auto descriptor = receiver_->Reserve(rid, n, {kvtransfer::WriterAssignment{0, {{0, n}}}}, host_->config().kv_lease);
  allocator_->Unstage();
  if (!descriptor.ok()) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      jobs_.erase(rid);  // the engine's abort event finds no job
    }
    (void)host_->engine().Abort(import.id);
    return descriptor.status();
  }
  KvReservedMsg reserved;
  reserved.request_id = rid;
  reserved.descriptor = kvtransfer::EncodeDescriptor(*descriptor);
  reserved.transfer_address = host_->transfer_address();
  reserved.blocks = blocks;
  RequestLog("worker", job.request_tag).Debug("job {}: reserved {} blocks for {} prompt tokens", rid, blocks, n);
  host_->SendKvReserved(std::move(reserved));
  return Status::Ok();
}

Status DecodeWorker::CommitFirstToken(const FirstTokenMsg& first) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = jobs_.find(first.request_id);
    if (it == jobs_.end())
      return Status::NotFound("no decode job " + std::to_string(first.request_id));
    it->second.first_token = first.token;
    it->second.constraint_state = first.constraint_state;
  }
  TryCommit(first.request_id);
  return Status::Ok();
}

void DecodeWorker::TryCommit(uint64_t request_id) {
  engine::RequestId engine_id = 0;
  int32_t token = -1;
  std::string constraint_state;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = jobs_.find(request_id);
    if (it == jobs_.end()) return;
    Job& job = it->second;
    if (job.ended || job.committed || !job.transfer_done || !job.first_token) return;
    job.committed = true;
    engine_id = job.engine_id;
    token = *job.first_token;
    constraint_state = std::move(job.constraint_state);
  }
  auto blocks = receiver_->HandOver(request_id);
  Status s = blocks.ok() ? Status::Ok() : blocks.status();
  if (blocks.ok()) {
    if (!blocks->empty()) allocator_->Forget(blocks->front());
    s = host_->engine().CommitImport(engine_id, token, std::move(constraint_state));
    if (!s.ok()) (void)host_->engine().Abort(engine_id);  // the engine owns the blocks now
  }
  // (HandOver failed: the receiver aborted the request and frees the blocks through
  // ImportAllocator::Free -> OnImportFreed.)
  if (!s.ok()) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = jobs_.find(request_id);
    if (it != jobs_.end()) EndLocked(it->second, FinishReason::kError, s);
  }
}

void DecodeWorker::AbortJob(uint64_t request_id, std::string_view reason) {
  std::unique_lock<std::mutex> lock(mu_);
  auto it = jobs_.find(request_id);
  if (it == jobs_.end()) return;
  Job& job = it->second;
  RequestLog("worker", job.msg.request_tag).Info("abort job {}: {}", request_id, reason);
  const uint64_t rid = job.msg.request_id;
  const engine::RequestId engine_id = job.engine_id;
  if (job.committed) {
    lock.unlock();
    (void)host_->engine().Abort(engine_id);  // the engine's abort event ends the job
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
      (void)host_->engine().Abort(engine_id);
    }
  }
}

void DecodeWorker::OnImportFreed(uint64_t request_id) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = jobs_.find(request_id);
  if (it == jobs_.end() || !host_->has_engine()) return;  // (teardown: the engine freed its pool)
  (void)host_->engine().Abort(it->second.engine_id);  // frees the blocks; its event erases the job
}

void DecodeWorker::ReceiverLoop(std::stop_token stop) {
  while (!stop.stop_requested()) {
    receiver_->WaitForEvents(kvtransfer::Clock::now() + std::chrono::milliseconds(100));
    for (const kvtransfer::ReceiverEvent& ev : receiver_->TakeEvents()) {
      const bool complete = ev.state == kvtransfer::TransferState::kComplete;
      {
        std::lock_guard<std::mutex> lock(mu_);
        auto it = jobs_.find(ev.request_id);
        if (it == jobs_.end()) continue;
        Job& job = it->second;
        WorkerMetrics* wm = host_->AgentMetrics();
        EngineWorkerMetrics* em = host_->metrics();
        if (complete) {
          job.transfer_done = true;
          const double secs =
              std::chrono::duration<double>(std::chrono::steady_clock::now() - job.reserved_at).count();
          const auto n = static_cast<uint32_t>(job.msg.prompt.size());
          if (wm) {
            wm->kv_transfer_seconds.Observe(secs);
            wm->kv_transfer_bytes.Increment(
                static_cast<double>(kvtransfer::BytesForRanges(host_->kv_layout(), {{0, n}})));
          }
          if (em) em->transfers_ok.Increment();
        } else {
          if (wm) wm->kv_transfer_failures.Increment();
          if (em) em->transfers_failed.Increment();
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
