// Launcher: pdserve-launch's job: start a whole ClusterConfig topology on this machine or on
// the hosts of its inventory (each service through its host's ssh / command prefix,
// host_command.h), keep it in the foreground and supervise it, stop it cleanly.
//
//   1. checks every binary exists (a missing one is an error naming it, before anything starts);
//   2. makes the model with `pdserve make-model` when an engine worker needs it and model_dir
//      has none (cluster.generate_model: a tokenizer-sized vocabulary by default);
//   3. starts pdserve-router (--config <the same file>, --advertise-host <its host's address>
//      on an inventory host) and waits for its ready file (for a host that does not share the
//      launcher's files: for its /health at the advertised address);
//   4. starts every worker with the standard worker flags (cluster_config.h), telling each to
//      drain for cluster.drain_timeout() on SIGTERM;
//   5. waits until GET /health lists every configured worker, prints where the API and the
//      metrics are, and writes its own ready file (--ready-file) with the ports and pids;
//   6. supervises: a process that exits is restarted by its group's RestartConfig (backoff
//      doubling per consecutive failure, a cap after which it stays down) or leaves the pool
//      (a drained worker exits 0); the cluster keeps serving while pools shrink and grow. The
//      ready file is rewritten with the current pids after every change;
//   6b. with an `autoscaler` section, runs the SLO autoscaler (autoscaler_loop.h) from the same
//      loop: it grows a pool with ScaleGroup and drains the least loaded worker of a pool
//      through the router; the ready file then also holds its metrics port;
//   7. forwards every child's output ("[name] line") until SIGINT / SIGTERM, then stops the
//      workers (SIGTERM: they drain and deregister), then the router, SIGKILLing whatever
//      outlives cluster.stop_grace.
// Before the cluster is ready nothing is restarted: an exit during start-up is a configuration
// or model problem, and the launcher stops everything and exits 1 with the reason.
//
// Exit codes: 0 after a signal-requested stop of a ready cluster; 128 + signal when the signal
// came during start-up (the cluster never served); 1 on a failure.
//
// Thread-safety: Run() on the main thread, after BlockTerminationSignals (it reads signals from
// a signalfd). ScaleGroup() only from that thread (e.g. a planner step called from Run's loop).
#pragma once

#include <chrono>
#include <deque>
#include <string>
#include <vector>

#include "common/status.h"
#include "services/launch/autoscaler_loop.h"
#include "services/launch/cluster_config.h"
#include "services/launch/process_supervisor.h"

namespace pdserve::launch {

class Launcher {
 public:
  Launcher(ClusterConfig config, std::string config_path, std::string ready_file);
  // Returns the process exit code (see above).
  int Run();

  // Sets the number of processes of worker group `group` (as if its `count` were `count`):
  // starts the missing ones, or drains the highest-numbered running ones (SIGTERM: they finish
  // their streams and deregister). Errors: NotFound (no such group), InvalidArgument (count 0).
  Status ScaleGroup(const std::string& group, uint32_t count);

 private:
  using Clock = std::chrono::steady_clock;
  enum class InstanceState {
    kRunning,
    kRestartPending,  // exited; starts again at restart_at
    kDraining,        // told to leave (scale-down); gone when it exits
    kLeft,            // exited cleanly and its policy does not restart it
    kGaveUp,          // crash loop: max_restarts consecutive failures
  };
  struct Instance {
    std::string name;  // "router" or "<group>-<i>"
    int group = -1;    // index into config_.workers; -1 for the router
    uint32_t index = 0;
    InstanceState state = InstanceState::kRunning;
    Clock::time_point started{};
    Clock::time_point restart_at{};
    uint32_t consecutive_failures = 0;
    uint32_t restarts = 0;
  };

  Status CheckBinaries();
  Status EnsureModel();
  Status StartRouter();
  Status StartWorkers();
  Status WaitReady();
  Status StartInstance(Instance& instance);
  std::vector<std::string> WorkerArgv(const WorkerGroupConfig& group, uint32_t index) const;
  // An MPI instance whose ranks run on inventory hosts: mpirun runs here with a hostfile and
  // the launch agent (host_command.h).
  static bool SpreadOverHosts(const WorkerGroupConfig& group);
  std::string HostfilePath(const WorkerGroupConfig& group, uint32_t index) const;
  // <run_dir>/launch-agent.sh when an instance is spread over hosts.
  Status WriteLaunchAgent();
  const RestartConfig& RestartOf(const Instance& instance) const;
  // Applies the restart policy to an exit seen after the cluster was ready.
  void OnExit(const ProcessExit& exit);
  void StartDueRestarts();
  Instance* Find(const std::string& name);
  Status WriteReadyFile();
  Status StartAutoscaler();
  // Processes counted towards group `group`'s size (running or about to restart).
  uint32_t LiveCount(const std::string& group) const;
  // Polls the children; false when a signal arrived (sets signal_) or, before ready_, when a
  // child exited (sets failure_).
  bool PollOnce(std::chrono::milliseconds timeout);
  int Shutdown(int code);
  // `name` in bin_dir_, or `name` itself when it is an absolute path (a custom worker's binary).
  std::string Bin(const std::string& name) const { return !name.empty() && name[0] == '/' ? name : bin_dir_ + "/" + name; }

  ClusterConfig config_;
  const std::string config_path_;
  const std::string ready_file_;
  std::string bin_dir_;
  std::string run_dir_;
  std::string cwd_;  // the launcher's working directory (ssh hosts cd there)
  ProcessSupervisor supervisor_;
  std::deque<Instance> instances_;  // the router first, then the workers in start order (stable addresses)
  int signal_fd_ = -1;
  int signal_ = 0;
  bool ready_ = false;
  std::string failure_;
  int http_port_ = 0;
  std::string http_host_;  // the router's advertised HTTP host (its ready file)
  std::string control_endpoint_;
  std::unique_ptr<AutoscalerLoop> autoscaler_;  // after ready_, with config_.autoscaler.enabled
};

}  // namespace pdserve::launch
