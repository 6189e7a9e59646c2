// ClusterConfig: the topology pdserve-launch starts on one machine (docs/deploy.md,
// docs/configuration.md). One YAML file holds it all:
//
//   cluster:   launcher options (binaries, model, logs, timeouts)
//   router:    RouterConfig (router_config.h); pdserve-router reads this same file
//   workers:   a list of worker groups, each `count` identical processes
//
// Each worker process gets the standard worker command line
//   <binary> --router <control endpoint> --worker-id <name>-<i> --role <role>
//            --model-name <router.model_name> --metrics-port <port>
//            [--model <cluster.model_dir>] [args...]
// where --model is passed to engine workers (type: engine) only, and the port is
// metrics_port + i (0: ephemeral). With mpi_ranks > 1 the process is started as
// `mpirun -n <mpi_ranks> <binary> ...` (services that run an MPI group). An engine group with a
// `plan` ("dp=2,ep=2") is a multi-rank instance: --plan is passed, mpi_ranks defaults to (and
// must equal) cp * dp * tp, and each of its dp DP ranks registers as a worker of its own
// (<name>-<i>-dp<k>, metrics port + k) (docs/services.md "Multi-rank workers").
//
// Thread-safety: value types.
#pragma once

#include <optional>

#include "comm/parallel_plan.h"

#include <chrono>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "common/status.h"
#include "services/common/control_messages.h"
#include "services/router/router_config.h"

namespace pdserve::launch {

struct WorkerGroupConfig {
  std::string name;              // instance ids are <name>-<i>
  services::WorkerRole role = services::WorkerRole::kColocated;
  std::string type = "engine";   // engine | echo (pdserve-echo-worker: protocol test worker)
  uint32_t count = 1;
  std::string binary;            // empty: pdserve-<role> (engine) or pdserve-echo-worker (echo)
  int metrics_port = 0;          // of instance 0; instance i uses +i (+ i * dp + k for DP rank k); 0: ephemeral
  uint32_t mpi_ranks = 1;
  std::optional<comm::ParallelPlan> plan;  // engine groups: a multi-rank instance
  // Router registrations one process of the group makes (its DP ranks).
  uint32_t registrations() const { return plan ? static_cast<uint32_t>(plan->dp) : 1; }
  std::vector<std::string> args;           // appended to the standard flags
  std::map<std::string, std::string> env;  // extra environment
};

struct GenerateModelConfig {
  bool enabled = true;   // make the model with `pdserve make-model` when model_dir has none
  std::string preset = "tiny";
  int64_t seed = 1;
};

struct ClusterConfig {
  std::string name = "pdserve";
  std::string bin_dir;                    // empty: the directory of pdserve-launch
  std::string model_dir = "models/demo-tiny";
  GenerateModelConfig generate_model;
  std::string log_dir;                    // empty: logs are only forwarded to stdout
  std::chrono::milliseconds stop_grace{10000};    // SIGTERM -> SIGKILL
  std::chrono::milliseconds ready_timeout{120000};  // router ready file + /health ready
  router::RouterConfig router;
  std::vector<WorkerGroupConfig> workers;

  // Errors: InvalidArgument naming the key; NotFound (no file).
  static Result<ClusterConfig> LoadFile(const std::string& path);
  static Result<ClusterConfig> Parse(std::string_view yaml, const std::string& origin = "<string>");
  // The binary of a group (its `binary`, else the default of its type and role).
  static std::string BinaryName(const WorkerGroupConfig& group);
};

}  // namespace pdserve::launch
