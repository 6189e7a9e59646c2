// Test helpers for multi-process tests: real child processes with deadlines and guaranteed
// clean-up, free loopback ports, and polling with deadlines (never fixed sleeps).
//
// Thread-safety: a ChildProcess is used by one test thread. FreeTcpPort / WaitFor are pure.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/status.h"

namespace pdserve::services::testing {

class ChildProcess {
 public:
  // Starts argv[0] (a path) in its own process group with stdout and stderr appended to
  // log_path. extra_env entries are "KEY=VALUE". Errors: Internal (fork/exec failures are
  // reported by the child's exit status 127 and its log).
  static Result<std::unique_ptr<ChildProcess>> Spawn(const std::vector<std::string>& argv,
                                                     const std::string& log_path,
                                                     const std::vector<std::string>& extra_env = {});
  // SIGKILLs the whole process group and reaps the child.
  ~ChildProcess();
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;

  pid_t pid() const { return pid_; }
  bool Running();
  // Sends `sig` to the child's process group.
  void Signal(int sig);
  // The exit status (WEXITSTATUS, or 128 + signal) once exited, nullopt if still running after
  // `timeout`.
  std::optional<int> WaitExit(std::chrono::milliseconds timeout);
  void Kill();
  std::string Log() const;
  const std::string& log_path() const { return log_path_; }

 private:
  ChildProcess(pid_t pid, std::string log_path) : pid_(pid), log_path_(std::move(log_path)) {}
  pid_t pid_;
  std::string log_path_;
  std::optional<int> exit_status_;
};

// A TCP port on 127.0.0.1 that was free a moment ago (bind to 0, read, close).
int FreeTcpPort();

// A fresh directory under $TMPDIR, removed with everything in it when the test process exits
// (also after failed tests: their assertions print the logs they need first).
std::string MakeTempDir(const std::string& prefix);

// A random checkpoint (`pdserve make-model --preset P --vocab V --seed S`) made once per build
// tree in <build>/test-models/ (next to bin_dir) and shared by every test process and run, so
// tests neither remake nor leave 100+ MB models behind. "" (and a message) when it cannot be made.
std::string CachedTestModel(const std::string& bin_dir, const std::string& preset, int64_t vocab, uint64_t seed);

// Polls `pred` every `interval` until it is true (returns true) or `timeout` passes (false).
bool WaitFor(const std::function<bool()>& pred, std::chrono::milliseconds timeout,
             std::chrono::milliseconds interval = std::chrono::milliseconds(20));

// The JSON a service writes to its --ready-file once up. Errors: DeadlineExceeded (with the
// child's log) when `child` exits first or `timeout` passes.
Result<nlohmann::json> WaitForReadyFile(const std::string& path, ChildProcess* child, std::chrono::milliseconds timeout);

// The environment that makes mpirun work on one host without a hostfile (as root, more ranks
// than cores, shared memory and loopback TCP only, MPI kept off UCX so the KV transfer's own UCX
// context is the only one): the same settings as cmake/pdserve_mpi.cmake's, plus pml ob1.
std::vector<std::string> LoopbackMpiEnv();

}  // namespace pdserve::services::testing
