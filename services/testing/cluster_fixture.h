// TestCluster: a real pdserve-router process and real pdserve-echo-worker processes on loopback
// for the end-to-end tests: ephemeral ports, ready files instead of sleeps, deadlines on every
// wait, every child killed in the destructor, logs kept in a temp dir (printed on failure).
//
// Thread-safety: one test thread; the HTTP helpers may be called from many threads.
#pragma once

#include <chrono>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/status.h"
#include "services/testing/child_process.h"
#include "services/testing/http_test_client.h"

namespace pdserve::router::testing {

class TestCluster {
 public:
  explicit TestCluster(const std::string& name);
  ~TestCluster();

  // Starts pdserve-router (control on `control_port`, 0: ephemeral) with fast test heartbeats
  // plus `extra_args`; waits for its ready file.
  Status StartRouter(const std::vector<std::string>& extra_args = {}, int control_port = 0);
  void KillRouter();  // SIGKILL
  // Starts an echo worker `id` connected to the router's control endpoint; waits for its ready
  // file (metrics port). Registration is not awaited (see WaitForWorkers).
  Status StartWorker(const std::string& id, const std::string& role = "colocated",
                     const std::vector<std::string>& extra_args = {});
  services::testing::ChildProcess* worker(const std::string& id) { return workers_.at(id).get(); }
  int worker_metrics_port(const std::string& id) const { return metrics_ports_.at(id); }

  // Waits until the router lists exactly `n` workers (and /health is ready when n > 0).
  bool WaitForWorkers(size_t n, std::chrono::milliseconds timeout = std::chrono::seconds(10));
  nlohmann::json Workers();  // /admin/workers "workers"

  // A worker's Prometheus counter/gauge value (first series whose labels contain `label`).
  double WorkerMetric(const std::string& id, const std::string& name, const std::string& label = "");

  int http_port() const { return http_port_; }
  const std::string& control_endpoint() const { return control_endpoint_; }
  // The ZeroMQ request API endpoint (with --request-endpoint; else empty).
  const std::string& request_endpoint() const { return request_endpoint_; }
  services::testing::ChildProcess* router() { return router_.get(); }
  const std::string& dir() const { return dir_; }
  // Every child's log, for failure messages.
  std::string Logs() const;

 private:
  std::string dir_;
  std::vector<std::string> router_args_;
  std::unique_ptr<services::testing::ChildProcess> router_;
  std::map<std::string, std::unique_ptr<services::testing::ChildProcess>> workers_;
  std::map<std::string, int> metrics_ports_;
  int http_port_ = 0;
  std::string control_endpoint_;
  std::string request_endpoint_;
  int router_starts_ = 0;
};

// The value of the first sample `name{...label...} value` in Prometheus text.
double MetricValue(const std::string& text, const std::string& name, const std::string& label = "");
// Runs `promtool check metrics` on the text; returns its output, empty when it passed.
std::string PromtoolProblems(const std::string& metrics_text);

}  // namespace pdserve::router::testing
