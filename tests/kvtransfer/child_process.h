// ChildProcess: a helper process started by a multi-process test (fork + execve), with its
// stdin and stdout piped to the test and its stderr inherited. Every wait takes a deadline.
//
// Thread-safety: one thread per object. Ownership: the destructor SIGKILLs and reaps a child
// that is still running, so no test leaves processes behind.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace pdserve::kvtransfer::testing {

class ChildProcess {
 public:
  using Clock = std::chrono::steady_clock;

  // Runs `path` with `args` and the current environment plus `env` overrides.
  static Result<std::unique_ptr<ChildProcess>> Spawn(const std::string& path,
                                                     const std::vector<std::string>& args,
                                                     const std::map<std::string, std::string>& env);
  ~ChildProcess();
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;

  pid_t pid() const { return pid_; }
  // Reads stdout until a line starting with `prefix` arrives (returns it) or the deadline
  // passes (kDeadlineExceeded) or stdout closes (kUnavailable).
  Result<std::string> WaitForLine(std::string_view prefix, Clock::time_point deadline);
  // Every complete stdout line read so far.
  const std::vector<std::string>& lines() const { return lines_; }
  Status WriteLine(const std::string& line);
  void Signal(int signal);
  // Waits for the exit (reading the rest of stdout); returns the exit code, or -signal.
  Result<int> Wait(Clock::time_point deadline);

 private:
  ChildProcess(pid_t pid, int pidfd, int stdin_fd, int stdout_fd)
      : pid_(pid), pidfd_(pidfd), stdin_fd_(stdin_fd), stdout_fd_(stdout_fd) {}
  // Reads what is available (waiting at most until `deadline`); false once stdout is closed.
  bool ReadSome(Clock::time_point deadline);

  pid_t pid_;
  int pidfd_;
  int stdin_fd_;
  int stdout_fd_;
  bool exited_ = false;
  int exit_code_ = 0;
  std::string partial_;
  std::vector<std::string> lines_;
  size_t scanned_ = 0;  // lines already returned by WaitForLine
};

}  // namespace pdserve::kvtransfer::testing
