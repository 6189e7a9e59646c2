#include "services/common/process_util.h"

#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>

namespace pdserve::services {

namespace {
sigset_t TerminationSet() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGHUP);
  // What mpirun forwards to every rank as is (its SIGTERM becomes a kill sequence instead):
  // how pdserve-launch stops an instance spread over hosts.
  sigaddset(&set, SIGUSR1);
  return set;
}
}  // namespace

void BlockTerminationSignals() {
  sigset_t set = TerminationSet();
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  signal(SIGPIPE, SIG_IGN);
}

int WaitForTerminationSignal(std::chrono::milliseconds timeout) {
  sigset_t set = TerminationSet();
  const auto ms = std::max<int64_t>(0, timeout.count());
  timespec ts{static_cast<time_t>(ms / 1000), static_cast<long>((ms % 1000) * 1000000)};
  const int sig = sigtimedwait(&set, nullptr, &ts);
  return sig > 0 ? sig : 0;
}

uint64_t RandomU64() {
  static thread_local std::mt19937_64 rng{std::random_device{}() ^
                                          (static_cast<uint64_t>(std::random_device{}()) << 32)};
  uint64_t v = 0;
  while (v == 0) v = rng();
  return v;
}

int64_t UnixMillis() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

std::string FindInPath(const std::string& name) {
  const char* path = std::getenv("PATH");
  std::string p = path ? path : "";
  size_t start = 0;
  while (start <= p.size()) {
    size_t end = p.find(':', start);
    if (end == std::string::npos) end = p.size();
    const std::filesystem::path cand = std::filesystem::path(p.substr(start, end - start)) / name;
    if (access(cand.c_str(), X_OK) == 0) return cand.string();
    start = end + 1;
  }
  return "";
}

}  // namespace pdserve::services
