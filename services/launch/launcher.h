// Launcher: pdserve-launch's job: start a whole ClusterConfig topology on this machine, keep it
// in the foreground, stop it cleanly.
//
//   1. checks every binary exists (a missing one is an error naming it, before anything starts);
//   2. makes the model with `pdserve make-model` when an engine worker needs it and model_dir
//      has none (cluster.generate_model);
//   3. starts pdserve-router (--config <the same file>) and waits for its ready file;
//   4. starts every worker with the standard worker flags (cluster_config.h);
//   5. waits until GET /health says ready, prints where the API and the metrics are, and writes
//      its own ready file (--ready-file) with the ports and pids;
//   6. forwards every child's output ("[name] line") until SIGINT / SIGTERM, then stops the
//      workers (SIGTERM: they drain and deregister), then the router, SIGKILLing whatever
//      outlives cluster.stop_grace.
// Nothing is restarted: a child that exits on its own, or a readiness timeout, stops the whole
// cluster and makes the launcher exit 1 with the reason.
//
// Thread-safety: Run() on the main thread, after BlockTerminationSignals (it reads signals from
// a signalfd).
#pragma once

#include <string>

#include "common/status.h"
#include "services/launch/cluster_config.h"
#include "services/launch/process_supervisor.h"

namespace pdserve::launch {

class Launcher {
 public:
  Launcher(ClusterConfig config, std::string config_path, std::string ready_file);
  // Returns the process exit code: 0 after a signal-requested stop, 1 on a failure.
  int Run();

 private:
  Status CheckBinaries();
  Status EnsureModel();
  Status StartRouter();
  Status StartWorkers();
  Status WaitReady();
  // Polls the children; false when one exited or a signal arrived (sets signal_ / failure_).
  bool PollOnce(std::chrono::milliseconds timeout);
  int Shutdown(int code);
  std::string Bin(const std::string& name) const { return bin_dir_ + "/" + name; }

  ClusterConfig config_;
  const std::string config_path_;
  const std::string ready_file_;
  std::string bin_dir_;
  std::string run_dir_;
  ProcessSupervisor supervisor_;
  std::vector<std::string> worker_names_;
  int signal_fd_ = -1;
  int signal_ = 0;
  std::string failure_;
  int http_port_ = 0;
  std::string control_endpoint_;
};

}  // namespace pdserve::launch
