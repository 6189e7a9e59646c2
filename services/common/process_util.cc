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

Result<CommandLine> CommandLine::Parse(int argc, char** argv, const std::vector<std::string>& options,
                                       const std::vector<std::string>& flags) {
  auto contains = [](const std::vector<std::string>& v, const std::string& k) {
    for (const auto& x : v)
      if (x == k) return true;
    return false;
  };
  CommandLine cl;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a.rfind("--", 0) != 0) return Status::InvalidArgument("unexpected argument '" + a + "'");
    std::string key = a.substr(2), value;
    const size_t eq = key.find('=');
    const bool inline_value = eq != std::string::npos;
    if (inline_value) {
      value = key.substr(eq + 1);
      key = key.substr(0, eq);
    }
    if (cl.values_.count(key)) return Status::InvalidArgument("option --" + key + " given twice");
    if (contains(flags, key)) {
      if (inline_value) return Status::InvalidArgument("flag --" + key + " takes no value");
      cl.values_[key] = "1";
    } else if (contains(options, key)) {
      if (!inline_value) {
        if (i + 1 >= argc) return Status::InvalidArgument("option --" + key + " needs a value");
        value = argv[++i];
      }
      cl.values_[key] = value;
    } else {
      return Status::InvalidArgument("unknown option --" + key);
    }
  }
  return cl;
}

std::optional<std::string> CommandLine::Get(const std::string& key) const {
  auto it = values_.find(key);
  if (it == values_.end()) return std::nullopt;
  return it->second;
}

std::string CommandLine::GetOr(const std::string& key, const std::string& fallback) const {
  auto v = Get(key);
  return v ? *v : fallback;
}

Result<int64_t> CommandLine::GetInt(const std::string& key, int64_t fallback) const {
  auto v = Get(key);
  if (!v) return fallback;
  char* end = nullptr;
  errno = 0;
  const long long x = std::strtoll(v->c_str(), &end, 10);
  if (v->empty() || *end != '\0' || errno != 0)
    return Status::InvalidArgument("option --" + key + " wants an integer, got '" + *v + "'");
  return static_cast<int64_t>(x);
}

Result<double> CommandLine::GetDouble(const std::string& key, double fallback) const {
  auto v = Get(key);
  if (!v) return fallback;
  char* end = nullptr;
  errno = 0;
  const double x = std::strtod(v->c_str(), &end);
  if (v->empty() || *end != '\0' || errno != 0)
    return Status::InvalidArgument("option --" + key + " wants a number, got '" + *v + "'");
  return x;
}

Status WriteFileAtomically(const std::string& path, const std::string& content) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) return Status::Unavailable("cannot write '" + tmp + "'");
    out << content;
    if (!out.flush()) return Status::Unavailable("cannot write '" + tmp + "'");
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) return Status::Unavailable("cannot rename '" + tmp + "' to '" + path + "': " + ec.message());
  return Status::Ok();
}

Result<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return Status::NotFound("cannot read '" + path + "'");
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
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
