#include "services/worker/agent/job_preparer.h"

#include <utility>

namespace pdserve::services {

JobPreparer::JobPreparer(std::function<Status(const JobMsg&)> prepare, std::function<void()> on_ready)
    : prepare_(std::move(prepare)), on_ready_(std::move(on_ready)), thread_([this](std::stop_token st) { Run(st); }) {}

JobPreparer::~JobPreparer() {
  thread_.request_stop();  // wakes the wait below (condition_variable_any with the stop token)
  thread_.join();
}

void JobPreparer::Submit(JobMsg job) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    pending_.push_back(std::move(job));
  }
  cv_.notify_one();
}

std::vector<JobPreparer::Prepared> JobPreparer::TakeReady() {
  std::lock_guard<std::mutex> lock(mu_);
  return std::exchange(ready_, {});
}

void JobPreparer::Run(std::stop_token stop) {
  for (;;) {
    JobMsg job;
    {
      std::unique_lock<std::mutex> lock(mu_);
      if (!cv_.wait(lock, stop, [this] { return !pending_.empty(); })) return;
      job = std::move(pending_.front());
      pending_.pop_front();
    }
    Status status = prepare_(job);
    {
      std::lock_guard<std::mutex> lock(mu_);
      ready_.push_back({std::move(job), std::move(status)});
    }
    if (on_ready_) on_ready_();
  }
}

}  // namespace pdserve::services
