#include "services/worker/colocated_worker.h"

#include "services/common/request_log.h"

namespace pdserve::services::worker {

ColocatedWorker::~ColocatedWorker() { host_->DestroyEngine(); }

Status ColocatedWorker::StartJob(const JobMsg& job) {
  PDSERVE_RETURN_IF_ERROR(host_->CheckDpRank(job));
  if (job.phase != JobPhase::kColocated)
    return Status::InvalidArgument(std::string("a colocated worker does not run ") + JobPhaseName(job.phase) + " jobs");
  const uint64_t rid = job.request_id;
  PDSERVE_ASSIGN_OR_RETURN(engine::RequestOptions ro,
                           host_->JobOptions(job, [this, rid](const engine::TokenEvent& ev) { OnEngineEvent(rid, ev); }));
  std::lock_guard<std::mutex> lock(mu_);  // the first event must find the job
  PDSERVE_ASSIGN_OR_RETURN(engine::RequestId id, host_->engine().AddRequest(job.prompt, std::move(ro)));
  jobs_[rid] = Job{job, id};
  return Status::Ok();
}

void ColocatedWorker::OnEngineEvent(uint64_t request_id, const engine::TokenEvent& ev) {
  host_->ObserveQueueTime(ev);
  std::optional<TokenEventMsg> msg;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = jobs_.find(request_id);
    if (it == jobs_.end()) return;
    msg = EngineHost::StreamEvent(it->second.msg, ev, /*skip_token=*/false);
    if (ev.finished) jobs_.erase(it);
  }
  if (msg) host_->Send(std::move(*msg));
}

void ColocatedWorker::AbortJob(uint64_t request_id, std::string_view reason) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = jobs_.find(request_id);
  if (it == jobs_.end()) return;
  RequestLog("worker", it->second.msg.request_tag).Info("abort job {}: {}", request_id, reason);
  (void)host_->engine().Abort(it->second.engine_id);  // its abort event ends the job
}

}  // namespace pdserve::services::worker
