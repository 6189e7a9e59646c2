// ProcessSupervisor: the launcher's child processes. Each child runs in its own process group
// (so a SIGTERM / SIGKILL reaches everything it started, e.g. mpirun's ranks) with stdout and
// stderr on a pipe; every line it prints is forwarded to the launcher's stdout as
// "[name] line" and, with a log directory, appended to <log_dir>/<name>.log.
//
// Thread-safety: one thread (the launcher's main loop) owns it. The destructor SIGKILLs every
// process group still running and reaps it.
#pragma once

#include <sys/types.h>

#include <csignal>

#include <chrono>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/status.h"

namespace pdserve::launch {

struct ProcessSpec {
  std::string name;
  std::vector<std::string> argv;           // argv[0]: a path, or a program name looked up in PATH
  std::map<std::string, std::string> env;  // added to the launcher's environment
  // An MPI launcher (mpirun): its ranks sit in process groups of their own, and mpirun turns a
  // SIGTERM of its own into a job abort (exit 1) even when every rank stops cleanly. Stopping
  // it therefore sends SIGTERM to its child processes (the ranks, which drain and exit 0, after
  // which mpirun exits 0), and to mpirun only when it has none.
  bool stop_through_children = false;
  // Otherwise the stop is this signal to the process's group; a signal other than SIGTERM goes
  // to the process alone (mpirun forwards SIGUSR1 to every rank of an instance spread over
  // hosts, where its SIGTERM would start a kill sequence).
  int stop_signal = SIGTERM;
};

struct ProcessExit {
  std::string name;
  pid_t pid = 0;
  int status = 0;  // exit code, or 128 + signal
};

class ProcessSupervisor {
 public:
  explicit ProcessSupervisor(std::string log_dir = "");
  ~ProcessSupervisor();
  ProcessSupervisor(const ProcessSupervisor&) = delete;
  ProcessSupervisor& operator=(const ProcessSupervisor&) = delete;

  // Errors: Internal (pipe / fork failed). An exec failure shows as exit status 127.
  Result<pid_t> Start(const ProcessSpec& spec);

  // Forwards output and reaps children for up to `timeout` (returns early on an exit or when
  // `extra_fd` >= 0 becomes readable; *extra_ready says which). Returns the exits seen.
  std::vector<ProcessExit> Poll(std::chrono::milliseconds timeout, int extra_fd = -1, bool* extra_ready = nullptr);

  // SIGTERM to the process groups of `names` (to an MPI launcher's ranks, see ProcessSpec), then
  // waits up to `grace` for them (forwarding their last words), then SIGKILLs what is left.
  // Returns their exits.
  std::vector<ProcessExit> Stop(const std::vector<std::string>& names, std::chrono::milliseconds grace);

  // Asks the running child `name` to stop (SIGTERM, as Stop does, without waiting). False when
  // no such child runs.
  bool RequestStop(const std::string& name);

  bool Running(const std::string& name) const;
  std::vector<std::string> RunningNames() const;
  // The pid of the running child `name`.
  std::optional<pid_t> Pid(const std::string& name) const;

 private:
  struct Child {
    std::string name;
    pid_t pid = 0;
    int out_fd = -1;
    std::string partial;  // output not yet ending in a newline
    int log_fd = -1;
    bool running = true;
    bool stop_through_children = false;
    int stop_signal = SIGTERM;
  };
  static void SendStop(const Child& c);
  void Forward(Child& c, const char* data, size_t n);
  void FlushAndClose(Child& c);
  std::vector<ProcessExit> Reap();

  const std::string log_dir_;
  std::vector<std::unique_ptr<Child>> children_;
};

}  // namespace pdserve::launch
