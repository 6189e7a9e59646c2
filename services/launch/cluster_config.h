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

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "common/status.h"
#include "services/control/control_messages.h"
#include "services/router/router_config.h"

namespace pdserve::launch {

// What the launcher does when a process of a group exits on its own (not on the launcher's
// stop). A clean exit (status 0) is a worker that drained and left the pool (POST /admin/drain,
// or a scale-down): on-failure leaves it gone, always starts it again.
enum class RestartPolicy {
  kOnFailure,  // restart after a non-zero exit or a signal (the default)
  kAlways,     // restart after any exit
  kNever,      // never restart; the group shrinks
};
const char* RestartPolicyName(RestartPolicy p);

struct RestartConfig {
  RestartPolicy policy = RestartPolicy::kOnFailure;
  // Delay before restart k (k = consecutive failures, from 1): backoff * 2^(k-1), at most
  // max_backoff. Short enough to come back before clients notice, long enough not to spin.
  std::chrono::milliseconds backoff{1000};
  std::chrono::milliseconds max_backoff{30000};
  // Consecutive failed runs after which the launcher gives up on the process (a crash loop):
  // it stays down, the rest of the cluster keeps serving. 0: no cap.
  uint32_t max_restarts = 5;
  // A run that lasted this long was healthy: the consecutive-failure count starts again.
  std::chrono::milliseconds reset_after{60000};
};

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
  RestartConfig restart;
};

struct GenerateModelConfig {
  bool enabled = true;   // make the model with `pdserve make-model` when model_dir has none
  std::string preset = "tiny";
  int64_t seed = 1;
  // Embedding / lm_head rows. The router refuses a model whose vocabulary does not cover its
  // tokenizer, so the default is DeepSeek-V3's 129280 (its tokenizer uses ids < 128815); 0: the
  // preset's own (small) vocabulary, for clusters that only send token ids.
  int64_t vocab = 129280;
};

struct ClusterConfig {
  std::string name = "pdserve";
  std::string bin_dir;                    // empty: the directory of pdserve-launch
  std::string model_dir = "models/demo-tiny-v128k";
  GenerateModelConfig generate_model;
  std::string log_dir;                    // empty: logs are only forwarded to stdout
  // On stop: SIGTERM, then SIGKILL after this long. Workers are told to drain for
  // drain_timeout() (stop_grace minus the time a drained worker needs to deregister and exit),
  // so a busy worker finishes or aborts its requests before the launcher's SIGKILL.
  std::chrono::milliseconds stop_grace{10000};
  std::chrono::milliseconds drain_timeout() const {
    return std::max(std::chrono::milliseconds(500), stop_grace - std::chrono::milliseconds(4000));
  }
  RestartConfig router_restart;           // the router process's supervision
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
