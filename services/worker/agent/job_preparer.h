// JobPreparer: the thread that runs WorkerHandler::PrepareJob for a WorkerAgent, so per-job
// set-up that can take long -- building the structured-output vocabulary on the first
// constrained job (about a second of CPU), compiling a large grammar -- never holds the agent's
// thread. That thread sends the heartbeats: held for longer than the router's heartbeat
// timeout, it gets the worker removed and every request on it failed.
//
// Jobs are prepared one at a time, in Submit order. Each result waits in a queue until the
// agent takes it (TakeReady) on its own thread; `on_ready` runs after each one is queued so the
// agent can be woken.
//
// Thread-safety: Submit and TakeReady from any thread. The destructor stops and joins the thread:
// a PrepareJob call under way finishes first, jobs not yet prepared are dropped.
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include "common/status.h"
#include "services/control/control_messages.h"

namespace pdserve::services {

class JobPreparer {
 public:
  struct Prepared {
    JobMsg job;
    Status status;  // PrepareJob's: not OK means the job is refused with this error
  };

  // `prepare` and `on_ready` run on the preparer's thread.
  JobPreparer(std::function<Status(const JobMsg&)> prepare, std::function<void()> on_ready);
  ~JobPreparer();
  JobPreparer(const JobPreparer&) = delete;
  JobPreparer& operator=(const JobPreparer&) = delete;

  void Submit(JobMsg job);
  // The jobs prepared since the last call, in the order they were submitted.
  std::vector<Prepared> TakeReady();

 private:
  void Run(std::stop_token stop);

  const std::function<Status(const JobMsg&)> prepare_;
  const std::function<void()> on_ready_;
  std::mutex mu_;
  std::condition_variable_any cv_;
  std::deque<JobMsg> pending_;    // guarded by mu_
  std::vector<Prepared> ready_;   // guarded by mu_
  std::jthread thread_;           // last: started after the rest exists, joined before it goes
};

}  // namespace pdserve::services
