// ApiCluster: a real pdserve-router and real engine workers (one pdserve-colocated, or one
// pdserve-prefill and one pdserve-decode) running the tests' tiny model over DeepSeek's
// vocabulary (services/testing/worker_test_cluster.h), for the API end-to-end tests. A cluster
// that does not start is a test failure (with the logs).
//
// Thread-safety: construction and Logs() on the test thread; port() from any.
#pragma once

#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "services/testing/cluster_fixture.h"
#include "services/testing/worker_test_cluster.h"

namespace pdserve::api_e2e::testing {

class ApiCluster {
 public:
  ApiCluster(const std::string& name, bool disaggregated, std::vector<std::string> router_args = {})
      : c_(name), w_(&c_) {
    router_args.push_back("--mode");
    router_args.push_back(disaggregated ? "disaggregated" : "colocated");
    Status s = c_.StartRouter(router_args);
    if (s.ok() && disaggregated) s = w_.Start("p0", "prefill");
    if (s.ok() && disaggregated) s = w_.Start("d0", "decode");
    if (s.ok() && !disaggregated) s = w_.Start("c0", "colocated");
    ok_ = s.ok() && c_.WaitForWorkers(disaggregated ? 2 : 1, std::chrono::seconds(60));
    if (!ok_) ADD_FAILURE() << "cluster " << name << " did not start: " << s.ToString() << "\n" << w_.Logs();
  }
  bool ok() const { return ok_; }
  int port() const { return c_.http_port(); }
  const std::string& request_endpoint() const { return c_.request_endpoint(); }
  const std::string& dir() const { return c_.dir(); }
  std::string Logs() { return w_.Logs(); }

 private:
  router::testing::TestCluster c_;
  services::worker::e2e::Workers w_;
  bool ok_ = false;
};

}  // namespace pdserve::api_e2e::testing
