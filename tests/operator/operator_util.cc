#include "tests/operator/operator_util.h"

#include <sys/wait.h>

#include <cstdio>
#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>

#include "services/testing/http_test_client.h"

namespace pdserve::operator_test {

std::string Bin(const std::string& name) { return std::string(PDSERVE_BIN_DIR) + "/" + name; }

void WriteFile(const std::string& path, const std::string& content) {
  std::filesystem::create_directories(std::filesystem::path(path).parent_path());
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << content;
  ASSERT_TRUE(out.good()) << "cannot write " << path;
}

CommandResult RunCommand(const std::string& command) {
  CommandResult r;
  FILE* p = popen((command + " 2>&1").c_str(), "r");
  if (p == nullptr) return r;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), p)) > 0) r.output.append(buf, n);
  const int status = pclose(p);
  r.status = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return r;
}

nlohmann::json LaunchedCluster::ReadyNow() const {
  std::ifstream in(ready_path);
  return nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
}

LaunchedCluster StartCluster(const std::string& dir, const std::string& config_path,
                             std::chrono::milliseconds timeout) {
  LaunchedCluster c;
  c.ready_path = dir + "/launch.ready";
  auto launched = services::testing::ChildProcess::Spawn({Bin("pdserve-launch"), config_path, "--ready-file", c.ready_path},
                                                         dir + "/launch.log");
  EXPECT_TRUE(launched.ok()) << launched.status().ToString();
  if (!launched.ok()) return c;
  c.launcher = std::move(launched).value();
  auto ready = services::testing::WaitForReadyFile(c.ready_path, c.launcher.get(), timeout);
  EXPECT_TRUE(ready.ok()) << ready.status().ToString();
  if (!ready.ok()) return c;
  c.ready = ready.value();
  c.http_port = c.ready["http_port"].get<int>();
  return c;
}

int HealthyWorkers(int port, const std::string& role) {
  auto r = services::testing::HttpGet(port, "/health", std::chrono::seconds(2));
  if (r.status == 0) return -1;
  const auto j = nlohmann::json::parse(r.body, nullptr, false);
  if (!j.is_object() || !j.contains("workers") || !j["workers"].contains(role)) return 0;
  return j["workers"][role].get<int>();
}

}  // namespace pdserve::operator_test
