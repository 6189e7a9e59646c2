#include "tests/kvtransfer/child_process.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <fmt/format.h>

extern char** environ;

namespace pdserve::kvtransfer::testing {

namespace {
int MillisUntil(ChildProcess::Clock::time_point deadline) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
      deadline - ChildProcess::Clock::now());
  return static_cast<int>(std::max<int64_t>(0, left.count()));
}
}  // namespace

Result<std::unique_ptr<ChildProcess>> ChildProcess::Spawn(
    const std::string& path, const std::vector<std::string>& args,
    const std::map<std::string, std::string>& env) {
  int in_pipe[2];
  int out_pipe[2];
  if (pipe2(in_pipe, O_CLOEXEC) != 0 || pipe2(out_pipe, O_CLOEXEC) != 0) {
    return Status::Internal("pipe2 failed");
  }
  // Build argv / envp before fork (no allocation in the child).
  std::vector<std::string> env_strings;
  for (char** e = environ; *e != nullptr; ++e) {
    std::string_view entry(*e);
    const std::string name(entry.substr(0, entry.find('=')));
    if (env.count(name) == 0) env_strings.emplace_back(entry);
  }
  for (const auto& [name, value] : env) env_strings.push_back(name + "=" + value);
  std::vector<char*> envp;
  for (auto& s : env_strings) envp.push_back(s.data());
  envp.push_back(nullptr);
  std::vector<std::string> argv_strings = {path};
  argv_strings.insert(argv_strings.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& s : argv_strings) argv.push_back(s.data());
  argv.push_back(nullptr);

  const pid_t pid = fork();
  if (pid < 0) return Status::Internal("fork failed");
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);  // never outlive the test
    dup2(in_pipe[0], STDIN_FILENO);
    dup2(out_pipe[1], STDOUT_FILENO);
    execve(path.c_str(), argv.data(), envp.data());
    _exit(127);
  }
  close(in_pipe[0]);
  close(out_pipe[1]);
  // glibc 2.36's <sys/pidfd.h> lacks C linkage for C++: call the syscall directly.
  const int pidfd = static_cast<int>(syscall(SYS_pidfd_open, pid, 0));
  fcntl(out_pipe[0], F_SETFL, O_NONBLOCK);
  return std::unique_ptr<ChildProcess>(new ChildProcess(pid, pidfd, in_pipe[1], out_pipe[0]));
}

ChildProcess::~ChildProcess() {
  if (!exited_) {
    kill(pid_, SIGKILL);
    int status = 0;
    waitpid(pid_, &status, 0);
  }
  if (pidfd_ >= 0) close(pidfd_);
  if (stdin_fd_ >= 0) close(stdin_fd_);
  if (stdout_fd_ >= 0) close(stdout_fd_);
}

bool ChildProcess::ReadSome(Clock::time_point deadline) {
  if (stdout_fd_ < 0) return false;
  pollfd pfd{stdout_fd_, POLLIN, 0};
  if (poll(&pfd, 1, MillisUntil(deadline)) <= 0) return true;
  char buffer[4096];
  const ssize_t n = read(stdout_fd_, buffer, sizeof(buffer));
  if (n == 0) {
    close(stdout_fd_);
    stdout_fd_ = -1;
    if (!partial_.empty()) lines_.push_back(std::move(partial_));
    partial_.clear();
    return false;
  }
  if (n < 0) return errno == EAGAIN || errno == EINTR;
  partial_.append(buffer, static_cast<size_t>(n));
  size_t newline;
  while ((newline = partial_.find('\n')) != std::string::npos) {
    lines_.push_back(partial_.substr(0, newline));
    partial_.erase(0, newline + 1);
  }
  return true;
}

Result<std::string> ChildProcess::WaitForLine(std::string_view prefix,
                                              Clock::time_point deadline) {
  while (true) {
    for (; scanned_ < lines_.size(); ++scanned_) {
      if (std::string_view(lines_[scanned_]).substr(0, prefix.size()) == prefix) {
        return lines_[scanned_++];
      }
    }
    if (Clock::now() >= deadline) {
      return Status::DeadlineExceeded(fmt::format("no '{}' line from pid {}", prefix, pid_));
    }
    if (!ReadSome(deadline)) {
      for (; scanned_ < lines_.size(); ++scanned_) {
        if (std::string_view(lines_[scanned_]).substr(0, prefix.size()) == prefix) {
          return lines_[scanned_++];
        }
      }
      return Status::Unavailable(fmt::format("pid {} closed stdout before '{}'", pid_, prefix));
    }
  }
}

Status ChildProcess::WriteLine(const std::string& line) {
  const std::string data = line + "\n";
  if (write(stdin_fd_, data.data(), data.size()) != static_cast<ssize_t>(data.size())) {
    return Status::Unavailable("cannot write to the child's stdin");
  }
  return Status::Ok();
}

void ChildProcess::Signal(int signal) {
  if (!exited_) kill(pid_, signal);
}

Result<int> ChildProcess::Wait(Clock::time_point deadline) {
  while (!exited_) {
    // Drain stdout so the child never blocks on a full pipe.
    while (stdout_fd_ >= 0 && ReadSome(Clock::now())) {
      pollfd probe{stdout_fd_, POLLIN, 0};
      if (poll(&probe, 1, 0) <= 0) break;
    }
    pollfd pfds[2] = {{pidfd_, POLLIN, 0}, {stdout_fd_, POLLIN, 0}};
    const int n = poll(pfds, stdout_fd_ >= 0 ? 2 : 1, MillisUntil(deadline));
    if (n > 0 && (pfds[0].revents & POLLIN)) {
      int status = 0;
      if (waitpid(pid_, &status, 0) == pid_) {
        exited_ = true;
        exit_code_ = WIFEXITED(status) ? WEXITSTATUS(status) : -WTERMSIG(status);
      }
    } else if (n == 0 && Clock::now() >= deadline) {
      return Status::DeadlineExceeded(fmt::format("pid {} still running", pid_));
    }
  }
  const auto drain_until = Clock::now() + std::chrono::seconds(1);
  while (Clock::now() < drain_until && ReadSome(drain_until)) {
  }
  return exit_code_;
}

}  // namespace pdserve::kvtransfer::testing
