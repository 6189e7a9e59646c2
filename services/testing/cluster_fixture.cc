#include "services/testing/cluster_fixture.h"

#include <cstdio>
#include <fstream>
#include <sstream>

#include "services/common/process_util.h"

namespace pdserve::router::testing {

using services::testing::ChildProcess;
using services::testing::WaitFor;
using services::testing::WaitForReadyFile;
using namespace std::chrono_literals;

namespace {
const std::string kBin = PDSERVE_BIN_DIR;
}  // namespace

TestCluster::TestCluster(const std::string& name) : dir_(services::testing::MakeTempDir("pdserve-" + name)) {}

TestCluster::~TestCluster() {
  workers_.clear();  // SIGKILL each
  router_.reset();
}

Status TestCluster::StartRouter(const std::vector<std::string>& extra_args, int control_port) {
  const std::string ready = dir_ + "/router" + std::to_string(router_starts_) + ".ready";
  const std::string control =
      control_port > 0 ? "tcp://127.0.0.1:" + std::to_string(control_port) : std::string("tcp://127.0.0.1:*");
  std::vector<std::string> argv = {kBin + "/pdserve-router", "--port", "0", "--control", control, "--ready-file", ready,
                                   "--heartbeat-interval-ms", "100", "--heartbeat-timeout-ms", "1500",
                                   "--model-name", "pdserve"};
  argv.insert(argv.end(), extra_args.begin(), extra_args.end());
  auto child = ChildProcess::Spawn(argv, dir_ + "/router.log");
  if (!child.ok()) return child.status();
  router_ = std::move(child).value();
  ++router_starts_;
  PDSERVE_ASSIGN_OR_RETURN(nlohmann::json r, WaitForReadyFile(ready, router_.get(), 20s));
  http_port_ = r["http_port"].get<int>();
  control_endpoint_ = r["control_endpoint"].get<std::string>();
  request_endpoint_ = r.value("request_endpoint", std::string());
  return Status::Ok();
}

void TestCluster::KillRouter() {
  if (router_) router_->Kill();
}

Status TestCluster::StartWorker(const std::string& id, const std::string& role,
                                const std::vector<std::string>& extra_args) {
  const std::string ready = dir_ + "/" + id + ".ready";
  std::remove(ready.c_str());
  std::vector<std::string> argv = {kBin + "/pdserve-echo-worker", "--router", control_endpoint_, "--worker-id", id,
                                   "--role", role, "--ready-file", ready, "--register-retry-ms", "50"};
  argv.insert(argv.end(), extra_args.begin(), extra_args.end());
  auto child = ChildProcess::Spawn(argv, dir_ + "/" + id + ".log");
  if (!child.ok()) return child.status();
  auto* c = child.value().get();
  workers_[id] = std::move(child).value();
  PDSERVE_ASSIGN_OR_RETURN(nlohmann::json r, WaitForReadyFile(ready, c, 10s));
  metrics_ports_[id] = r["metrics_port"].get<int>();
  return Status::Ok();
}

nlohmann::json TestCluster::Workers() {
  auto r = services::testing::HttpGet(http_port_, "/admin/workers", 2s);
  if (r.status != 200) return nlohmann::json::array();
  try {
    return nlohmann::json::parse(r.body)["workers"];
  } catch (...) {
    return nlohmann::json::array();
  }
}

bool TestCluster::WaitForWorkers(size_t n, std::chrono::milliseconds timeout) {
  return WaitFor(
      [&] {
        if (Workers().size() != n) return false;
        if (n == 0) return true;
        return services::testing::HttpGet(http_port_, "/health", 2s).status == 200;
      },
      timeout, 20ms);
}

double TestCluster::WorkerMetric(const std::string& id, const std::string& name, const std::string& label) {
  auto r = services::testing::HttpGet(metrics_ports_.at(id), "/metrics", 2s);
  return MetricValue(r.body, name, label);
}

std::string TestCluster::Logs() const {
  std::ostringstream out;
  if (router_) out << "==== router\n" << router_->Log();
  for (const auto& [id, w] : workers_) out << "==== " << id << "\n" << w->Log();
  return out.str();
}

double MetricValue(const std::string& text, const std::string& name, const std::string& label) {
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    if (line.compare(0, name.size(), name) != 0) continue;
    const char next = line.size() > name.size() ? line[name.size()] : '\0';
    if (next != '{' && next != ' ') continue;
    if (!label.empty() && line.find(label) == std::string::npos) continue;
    return std::stod(line.substr(line.rfind(' ') + 1));
  }
  return -1;
}

std::string PromtoolProblems(const std::string& metrics_text) {
  const std::string path = services::testing::MakeTempDir("pdserve-promtool") + "/metrics.txt";
  {
    std::ofstream out(path);
    out << metrics_text;
  }
  const std::string cmd = "promtool check metrics < " + path + " 2>&1";
  std::string output;
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return "cannot run promtool";
  char buf[512];
  while (fgets(buf, sizeof(buf), p)) output += buf;
  const int rc = pclose(p);
  return rc == 0 ? std::string() : "promtool failed (" + std::to_string(rc) + "): " + output;
}

}  // namespace pdserve::router::testing
