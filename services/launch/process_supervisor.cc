#include "services/launch/process_supervisor.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace pdserve::launch {

using Clock = std::chrono::steady_clock;

ProcessSupervisor::ProcessSupervisor(std::string log_dir) : log_dir_(std::move(log_dir)) {}

ProcessSupervisor::~ProcessSupervisor() {
  for (auto& c : children_) {
    if (c->running) {
      kill(-c->pid, SIGKILL);
      int status;
      waitpid(c->pid, &status, 0);
      c->running = false;
    }
    FlushAndClose(*c);
  }
}

Result<pid_t> ProcessSupervisor::Start(const ProcessSpec& spec) {
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) return Status::Internal(std::string("pipe: ") + std::strerror(errno));
  std::vector<std::string> env_strings;
  for (const auto& [k, v] : spec.env) env_strings.push_back(k + "=" + v);
  std::vector<char*> argv;
  for (const auto& a : spec.argv) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  std::fflush(stdout);
  const pid_t pid = fork();
  if (pid < 0) {
    close(fds[0]);
    close(fds[1]);
    return Status::Internal(std::string("fork: ") + std::strerror(errno));
  }
  if (pid == 0) {
    setpgid(0, 0);
    // The launcher blocks termination signals for its signalfd; services must receive them.
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    signal(SIGPIPE, SIG_DFL);
    dup2(fds[1], 1);
    dup2(fds[1], 2);
    for (auto& e : env_strings) putenv(e.data());
    execvp(argv[0], argv.data());  // a host's command prefix may name a program in PATH (ip, ssh)
    std::fprintf(stderr, "cannot execute %s: %s\n", argv[0], std::strerror(errno));
    _exit(127);
  }
  setpgid(pid, pid);
  close(fds[1]);
  fcntl(fds[0], F_SETFL, fcntl(fds[0], F_GETFL) | O_NONBLOCK);
  auto c = std::make_unique<Child>();
  c->name = spec.name;
  c->pid = pid;
  c->out_fd = fds[0];
  c->stop_through_children = spec.stop_through_children;
  c->stop_signal = spec.stop_signal;
  if (!log_dir_.empty()) c->log_fd = open((log_dir_ + "/" + spec.name + ".log").c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  children_.push_back(std::move(c));
  return pid;
}

void ProcessSupervisor::Forward(Child& c, const char* data, size_t n) {
  if (c.log_fd >= 0) {
    const ssize_t w = write(c.log_fd, data, n);
    (void)w;  // a full disk must not stop the forwarding
  }
  c.partial.append(data, n);
  size_t start = 0, nl;
  while ((nl = c.partial.find('\n', start)) != std::string::npos) {
    // A line from a pty (a process on an ssh host) ends in "\r\n".
    const size_t end = nl > start && c.partial[nl - 1] == '\r' ? nl - 1 : nl;
    std::printf("[%s] %.*s\n", c.name.c_str(), static_cast<int>(end - start), c.partial.data() + start);
    start = nl + 1;
  }
  c.partial.erase(0, start);
  std::fflush(stdout);
}

void ProcessSupervisor::FlushAndClose(Child& c) {
  if (c.out_fd >= 0) {
    char buf[4096];
    ssize_t n;
    while ((n = read(c.out_fd, buf, sizeof(buf))) > 0) Forward(c, buf, static_cast<size_t>(n));
    close(c.out_fd);
    c.out_fd = -1;
  }
  if (!c.partial.empty()) {
    std::printf("[%s] %s\n", c.name.c_str(), c.partial.c_str());
    c.partial.clear();
    std::fflush(stdout);
  }
  if (c.log_fd >= 0) {
    close(c.log_fd);
    c.log_fd = -1;
  }
}

std::vector<ProcessExit> ProcessSupervisor::Reap() {
  std::vector<ProcessExit> exits;
  for (auto& c : children_) {
    if (!c->running) continue;
    int status = 0;
    if (waitpid(c->pid, &status, WNOHANG) != c->pid) continue;
    c->running = false;
    kill(-c->pid, SIGKILL);  // anything it left behind in its group
    FlushAndClose(*c);
    exits.push_back({c->name, c->pid, WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status)});
  }
  // A restarted child reuses its name: forget the dead ones.
  std::erase_if(children_, [](const std::unique_ptr<Child>& c) { return !c->running && c->out_fd < 0; });
  return exits;
}

std::vector<ProcessExit> ProcessSupervisor::Poll(std::chrono::milliseconds timeout, int extra_fd, bool* extra_ready) {
  if (extra_ready) *extra_ready = false;
  const auto deadline = Clock::now() + timeout;
  while (true) {
    std::vector<pollfd> fds;
    std::vector<Child*> owners;
    for (auto& c : children_) {
      if (c->out_fd < 0) continue;
      fds.push_back({c->out_fd, POLLIN, 0});
      owners.push_back(c.get());
    }
    if (extra_fd >= 0) fds.push_back({extra_fd, POLLIN, 0});
    // Exits are noticed by waitpid; poll in short slices so an exit never waits long.
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    const int slice = static_cast<int>(std::max<int64_t>(0, std::min<int64_t>(left, 100)));
    const int n = poll(fds.data(), fds.size(), slice);
    if (n > 0) {
      for (size_t i = 0; i < owners.size(); ++i) {
        if (!(fds[i].revents & (POLLIN | POLLHUP))) continue;
        char buf[8192];
        const ssize_t r = read(owners[i]->out_fd, buf, sizeof(buf));
        if (r > 0) {
          Forward(*owners[i], buf, static_cast<size_t>(r));
        } else if (r == 0) {  // the child closed its output (usually: it exited)
          close(owners[i]->out_fd);
          owners[i]->out_fd = -1;
        }
      }
      if (extra_fd >= 0 && (fds.back().revents & POLLIN)) {
        if (extra_ready) *extra_ready = true;
      }
    }
    auto exits = Reap();
    if (!exits.empty() || (extra_ready && *extra_ready) || Clock::now() >= deadline) return exits;
  }
}

std::vector<ProcessExit> ProcessSupervisor::Stop(const std::vector<std::string>& names, std::chrono::milliseconds grace) {
  std::vector<ProcessExit> exits;
  for (auto& c : children_)
    for (const auto& n : names)
      if (c->name == n && c->running) SendStop(*c);
  const auto deadline = Clock::now() + grace;
  auto any_running = [&] {
    for (const auto& n : names)
      if (Running(n)) return true;
    return false;
  };
  while (any_running() && Clock::now() < deadline) {
    for (auto& e : Poll(std::chrono::milliseconds(50))) exits.push_back(e);
  }
  for (auto& c : children_) {
    for (const auto& n : names) {
      if (c->name != n || !c->running) continue;
      std::printf("[launch] %s did not stop within %lld ms: SIGKILL\n", c->name.c_str(),
                  static_cast<long long>(grace.count()));
      kill(-c->pid, SIGKILL);
      int status = 0;
      waitpid(c->pid, &status, 0);
      c->running = false;
      FlushAndClose(*c);
      exits.push_back({c->name, c->pid, WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status)});
    }
  }
  return exits;
}

bool ProcessSupervisor::Running(const std::string& name) const {
  for (const auto& c : children_)
    if (c->name == name && c->running) return true;
  return false;
}

std::vector<std::string> ProcessSupervisor::RunningNames() const {
  std::vector<std::string> out;
  for (const auto& c : children_)
    if (c->running) out.push_back(c->name);
  return out;
}

std::optional<pid_t> ProcessSupervisor::Pid(const std::string& name) const {
  for (const auto& c : children_)
    if (c->name == name && c->running) return c->pid;
  return std::nullopt;
}

namespace {
// The pids whose parent is `parent` (from /proc).
std::vector<pid_t> ChildrenOf(pid_t parent) {
  std::vector<pid_t> out;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator("/proc", ec)) {
    const std::string name = e.path().filename().string();
    if (name.empty() || name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::ifstream stat(e.path() / "stat");
    std::string line;
    if (!std::getline(stat, line)) continue;
    // pid (comm) state ppid ...: comm may hold spaces and parentheses, so parse after the last ')'.
    const size_t close = line.rfind(')');
    if (close == std::string::npos) continue;
    std::istringstream rest(line.substr(close + 1));
    char state = 0;
    long ppid = 0;
    rest >> state >> ppid;
    if (ppid == parent) out.push_back(static_cast<pid_t>(std::stol(name)));
  }
  return out;
}
}  // namespace

void ProcessSupervisor::SendStop(const Child& c) {
  if (c.stop_signal != SIGTERM) {
    kill(c.pid, c.stop_signal);
    return;
  }
  if (c.stop_through_children) {
    const std::vector<pid_t> ranks = ChildrenOf(c.pid);
    for (pid_t r : ranks) kill(r, SIGTERM);
    if (!ranks.empty()) return;
  }
  kill(-c.pid, SIGTERM);
}

bool ProcessSupervisor::RequestStop(const std::string& name) {
  for (const auto& c : children_) {
    if (c->name != name || !c->running) continue;
    SendStop(*c);
    return true;
  }
  return false;
}

}  // namespace pdserve::launch
