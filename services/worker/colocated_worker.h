// ColocatedWorker: a worker running whole requests (prompt and decode) on its own engine:
// Job -> Engine::AddRequest; every engine TokenEvent -> a control TokenEvent.
//
// Threading: as EngineWorker (engine_worker.h). `mu_` guards the job table.
#pragma once

#include <mutex>
#include <unordered_map>

#include "services/worker/engine_worker.h"

namespace pdserve::services::worker {

class ColocatedWorker final : public EngineWorker {
 public:
  explicit ColocatedWorker(std::unique_ptr<EngineHost> host) : EngineWorker(std::move(host)) {}
  // Stops the engine before the job table goes.
  ~ColocatedWorker() override;

  Status StartJob(const JobMsg& job) override;
  void AbortJob(uint64_t request_id, std::string_view reason) override;

 private:
  struct Job {
    JobMsg msg;
    engine::RequestId engine_id = 0;
  };
  void OnEngineEvent(uint64_t request_id, const engine::TokenEvent& ev);

  std::mutex mu_;
  std::unordered_map<uint64_t, Job> jobs_;  // by router request id
};

}  // namespace pdserve::services::worker
