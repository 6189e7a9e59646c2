#include "services/testing/netns_hosts.h"

#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <sstream>

namespace pdserve::services::testing {

Result<std::string> NetnsHosts::Run(const std::vector<std::string>& argv) {
  int fds[2];
  if (pipe(fds) != 0) return Status::Internal("pipe failed");
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  const pid_t pid = fork();
  if (pid < 0) {
    close(fds[0]);
    close(fds[1]);
    return Status::Internal("fork failed");
  }
  if (pid == 0) {
    dup2(fds[1], 1);
    dup2(fds[1], 2);
    close(fds[0]);
    close(fds[1]);
    execvp(args[0], args.data());
    std::fprintf(stderr, "cannot execute %s\n", args[0]);
    _exit(127);
  }
  close(fds[1]);
  std::string out;
  char buf[4096];
  ssize_t n;
  while ((n = read(fds[0], buf, sizeof(buf))) > 0) out.append(buf, static_cast<size_t>(n));
  close(fds[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  const int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  if (code == 0) return out;
  std::string cmd;
  for (const auto& a : argv) cmd += (cmd.empty() ? "" : " ") + a;
  if (code == 2 && argv.size() > 1 && argv[0].find("netns_hosts.sh") != std::string::npos)
    return Status::Unavailable(out.empty() ? cmd + " exited 2" : out);
  return Status::Internal(cmd + " exited " + std::to_string(code) + ":\n" + out);
}

namespace {
std::string Base36(uint64_t v) {
  std::string s;
  do {
    s.insert(s.begin(), "0123456789abcdefghijklmnopqrstuvwxyz"[v % 36]);
    v /= 36;
  } while (v != 0);
  return s;
}
}  // namespace

Result<std::unique_ptr<NetnsHosts>> NetnsHosts::Create(const std::string& script, int n) {
  static std::atomic<int> beds{0};
  std::unique_ptr<NetnsHosts> h(new NetnsHosts());
  h->script_ = script;
  h->prefix_ = "pdmh" + Base36(static_cast<uint64_t>(getpid())) + Base36(static_cast<uint64_t>(beds++ % 36));
  if (access(script.c_str(), X_OK) != 0) return Status::Unavailable("no test bed script " + script);
  PDSERVE_RETURN_IF_ERROR(Run({script, "check"}).status());
  PDSERVE_ASSIGN_OR_RETURN(std::string out, Run({script, "up", std::to_string(n), "--prefix", h->prefix_, "--owner",
                                                 std::to_string(getpid())}));
  std::istringstream in(out);
  for (std::string line; std::getline(in, line);) {
    std::istringstream words(line);
    std::string kind;
    words >> kind;
    if (kind == "subnet") {
      words >> h->subnet_;
    } else if (kind == "bridge") {
      std::string name;
      words >> name >> h->bridge_address_;
    } else if (kind == "host") {
      int i = 0;
      Host host;
      words >> i >> host.netns >> host.address >> host.interface;
      h->hosts_.push_back(host);
    }
  }
  if (static_cast<int>(h->hosts_.size()) != n || h->subnet_.empty())
    return Status::Internal("netns_hosts.sh up printed an unexpected bed:\n" + out);
  return h;
}

NetnsHosts::~NetnsHosts() {
  auto r = Run({script_, "down", prefix_});
  if (!r.ok()) std::fprintf(stderr, "NetnsHosts: removing bed %s: %s\n", prefix_.c_str(), r.status().ToString().c_str());
}

std::vector<std::string> NetnsHosts::Exec(size_t i) const { return {"ip", "netns", "exec", host(i).netns}; }

std::string NetnsHosts::LinkOf(size_t i) const { return prefix_ + "v" + std::to_string(i); }

Status NetnsHosts::SetLinkUp(size_t i, bool up) {
  return Run({"ip", "link", "set", LinkOf(i), up ? "up" : "down"}).status();
}

}  // namespace pdserve::services::testing
