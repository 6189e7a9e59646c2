// Helpers of the operator tests: the binaries under test, files, and pdserve-launch clusters
// started as a new user would (a YAML file, the launcher in the foreground).
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "services/testing/child_process.h"

namespace pdserve::operator_test {

// The path of a built binary (build/bin/NAME).
std::string Bin(const std::string& name);
// Writes a file (parents created). Aborts the test on failure.
void WriteFile(const std::string& path, const std::string& content);
// The output of `command` (stdout + stderr) and its exit status.
struct CommandResult {
  int status = -1;
  std::string output;
};
CommandResult RunCommand(const std::string& command);

// pdserve-launch CONFIG --ready-file (in `dir`), up to its ready file.
struct LaunchedCluster {
  std::unique_ptr<services::testing::ChildProcess> launcher;
  nlohmann::json ready;  // the launcher's ready file when it came up
  int http_port = 0;
  // The ready file as it is now (the launcher rewrites it on every restart).
  nlohmann::json ReadyNow() const;
  std::string ready_path;
};
// Errors show as an empty launcher plus a gtest failure with the launcher's log.
LaunchedCluster StartCluster(const std::string& dir, const std::string& config_path,
                             std::chrono::milliseconds timeout = std::chrono::seconds(120));

// The /health "workers" count of `role` (-1 when the router does not answer).
int HealthyWorkers(int port, const std::string& role);

}  // namespace pdserve::operator_test
