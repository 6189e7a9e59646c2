#include "services/testing/child_process.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <mutex>
#include <cstring>
#include <fstream>
#include <sstream>
#include <thread>

#include "common/mapped_file.h"

namespace pdserve::services::testing {

Result<nlohmann::json> WaitForReadyFile(const std::string& path, ChildProcess* child, std::chrono::milliseconds timeout) {
  nlohmann::json out;
  const bool ok = WaitFor(
      [&] {
        auto text = ReadFileToString(path);
        if (!text.ok()) return !child->Running();  // stop waiting if it died
        out = nlohmann::json::parse(text.value(), nullptr, false);
        return !out.is_discarded();
      },
      timeout);
  if (!ok || out.is_discarded() || out.is_null())
    return Status::DeadlineExceeded("no ready file " + path + ":\n" + child->Log());
  return out;
}

std::vector<std::string> LoopbackMpiEnv() {
  // Open MPI keeps its session directory (shared-memory backing files) under TMPDIR; a fault
  // test that SIGKILLs mpirun leaves it behind. A directory of this test process's own, removed
  // when it exits, keeps TMPDIR clean whatever happens to the job.
  static const std::string session_tmp = MakeTempDir("pdserve-mpi-session");
  return {"OMPI_ALLOW_RUN_AS_ROOT=1",       "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1", "OMPI_MCA_rmaps_base_oversubscribe=1",
          "OMPI_MCA_mpi_yield_when_idle=1", "OMPI_MCA_btl=self,vader,tcp",      "OMPI_MCA_btl_tcp_if_include=lo",
          "OMPI_MCA_oob_tcp_if_include=lo", "OMPI_MCA_pml=ob1",                 "TMPDIR=" + session_tmp};
}

Result<std::unique_ptr<ChildProcess>> ChildProcess::Spawn(const std::vector<std::string>& argv,
                                                          const std::string& log_path,
                                                          const std::vector<std::string>& extra_env) {
  if (argv.empty()) return Status::InvalidArgument("empty argv");
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  const pid_t pid = fork();
  if (pid < 0) return Status::Internal(std::string("fork: ") + std::strerror(errno));
  if (pid == 0) {
    setpgid(0, 0);
    // Signals blocked by the test (if any) must not stay blocked in the service.
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    signal(SIGPIPE, SIG_DFL);
    const int fd = open(log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
    if (fd >= 0) {
      dup2(fd, 1);
      dup2(fd, 2);
      close(fd);
    }
    for (const auto& e : extra_env) putenv(const_cast<char*>(e.c_str()));
    execv(args[0], args.data());
    std::fprintf(stderr, "exec %s: %s\n", args[0], std::strerror(errno));
    _exit(127);
  }
  setpgid(pid, pid);  // also from the parent: no race with an early Signal()
  return std::unique_ptr<ChildProcess>(new ChildProcess(pid, log_path));
}

ChildProcess::~ChildProcess() { Kill(); }

bool ChildProcess::Running() {
  if (exit_status_) return false;
  int status = 0;
  const pid_t r = waitpid(pid_, &status, WNOHANG);
  if (r == pid_) {
    exit_status_ = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    return false;
  }
  return r == 0;
}

void ChildProcess::Signal(int sig) {
  if (exit_status_) return;
  kill(-pid_, sig);
}

std::optional<int> ChildProcess::WaitExit(std::chrono::milliseconds timeout) {
  WaitFor([&] { return !Running(); }, timeout, std::chrono::milliseconds(5));
  return exit_status_;
}

void ChildProcess::Kill() {
  if (exit_status_) {
    kill(-pid_, SIGKILL);  // stragglers in the group
    return;
  }
  kill(-pid_, SIGKILL);
  int status = 0;
  if (waitpid(pid_, &status, 0) == pid_)
    exit_status_ = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

std::string ChildProcess::Log() const {
  std::ifstream in(log_path_);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

int FreeTcpPort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return -1;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  int port = -1;
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0) {
    socklen_t len = sizeof(addr);
    if (getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0) port = ntohs(addr.sin_port);
  }
  close(fd);
  return port;
}

namespace {
// The directories MakeTempDir made in this process, removed when it exits (a gtest binary exits
// normally after failed tests too; the test's logs have been printed by then).
class TempDirs {
 public:
  ~TempDirs() {
    std::lock_guard<std::mutex> lock(mu_);
    for (const std::string& d : dirs_) {
      std::error_code ec;
      std::filesystem::remove_all(d, ec);
    }
  }
  void Add(const std::string& d) {
    std::lock_guard<std::mutex> lock(mu_);
    dirs_.push_back(d);
  }

 private:
  std::mutex mu_;
  std::vector<std::string> dirs_;
};
TempDirs& OwnTempDirs() {
  static TempDirs dirs;
  return dirs;
}
}  // namespace

std::string MakeTempDir(const std::string& prefix) {
  const char* base = std::getenv("TMPDIR");
  std::string templ = std::string(base && *base ? base : "/tmp") + "/" + prefix + "-XXXXXX";
  std::vector<char> buf(templ.begin(), templ.end());
  buf.push_back('\0');
  if (!mkdtemp(buf.data())) {
    std::fprintf(stderr, "MakeTempDir: mkdtemp(%s) failed: %s\n", templ.c_str(), std::strerror(errno));
    std::abort();
  }
  OwnTempDirs().Add(buf.data());
  return std::string(buf.data());
}

std::string CachedTestModel(const std::string& bin_dir, const std::string& preset, int64_t vocab, uint64_t seed) {
  namespace fs = std::filesystem;
  const fs::path root = fs::path(bin_dir).parent_path() / "test-models";
  const fs::path dir = root / (preset + "-v" + std::to_string(vocab) + "-s" + std::to_string(seed));
  std::error_code ec;
  if (fs::exists(dir / "config.json", ec)) return dir.string();
  fs::create_directories(root, ec);
  // Made aside and renamed into place, so a concurrent test never sees a half-written model.
  const fs::path tmp = root / (dir.filename().string() + ".tmp-" + std::to_string(getpid()));
  fs::remove_all(tmp, ec);
  const std::string cmd = bin_dir + "/pdserve make-model --preset " + preset + " --vocab " + std::to_string(vocab) +
                          " --seed " + std::to_string(seed) + " --out " + tmp.string() + " > /dev/null 2>&1";
  if (std::system(cmd.c_str()) != 0) {
    fs::remove_all(tmp, ec);
    std::fprintf(stderr, "CachedTestModel: `%s` failed\n", cmd.c_str());
    return "";
  }
  fs::rename(tmp, dir, ec);
  if (ec) fs::remove_all(tmp, ec);  // another process won the race: use its model
  return dir.string();
}

bool WaitFor(const std::function<bool()>& pred, std::chrono::milliseconds timeout,
             std::chrono::milliseconds interval) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (true) {
    if (pred()) return true;
    if (std::chrono::steady_clock::now() >= deadline) return false;
    std::this_thread::sleep_for(interval);
  }
}

}  // namespace pdserve::services::testing
