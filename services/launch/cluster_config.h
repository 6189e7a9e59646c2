// ClusterConfig: the topology pdserve-launch starts on one machine (docs/deploy.md,
// docs/configuration.md). One YAML file holds it all:
//
//   cluster:   launcher options (binaries, model, logs, timeouts)
//   router:    RouterConfig (router_config.h); pdserve-router reads this same file
//   workers:   a list of worker groups, each `count` identical processes
//   autoscaler: optional, the SLO autoscaler over some of the groups (AutoscalerSettings)
//
// With a `hosts:` inventory (HostConfig below), the router and each worker group may run on
// other machines; addresses then must not be loopback ones (checked).
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
#include "planner/autoscaler.h"
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

// A machine of the inventory (`hosts:`, docs/deploy.md "Many hosts"): where the launcher runs
// the router and worker groups that name it. Without an inventory everything runs on the
// launcher's machine, as before.
//
//   hosts:
//     - name: node-a
//       address: 10.0.0.11        # how the other hosts and the launcher reach it
//       network: 10.0.0.0/24      # its interface or subnet for serving traffic (default: cluster.network)
//       run: ssh                  # ssh (default) | local | [command, prefix, ...]
//       ssh_target: me@node-a     # default: address
struct HostConfig {
  enum class Run {
    kSsh,     // ssh [ssh_options] <ssh_target> -- 'cd <cwd> && exec env K=V... <command>'
    kPrefix,  // <prefix...> env K=V... <command...>   (e.g. ip netns exec NS; a container exec)
    kLocal,   // the command itself, on the launcher's machine
  };
  std::string name;
  std::string address;
  // The interface ("eth0") or IPv4 subnet ("10.0.0.0/24") serving traffic uses on this host:
  // its workers get --network (their registered address and UCX's device), and an MPI group
  // spread over hosts runs MPI's TCP traffic on it. A subnet suits hosts whose interface names
  // differ. Empty: cluster.network (empty too: the workers' own defaults).
  std::string network;
  Run run = Run::kSsh;
  std::vector<std::string> prefix;  // kPrefix
  std::string ssh_target;           // kSsh; empty: address
  // kSsh. A pty (-tt) makes the remote command get SIGHUP (a drain) when the launcher stops its
  // ssh; BatchMode fails at once rather than asking for a password.
  std::vector<std::string> ssh_options = {"-tt", "-o", "BatchMode=yes"};
  // The host sees the launcher's files at the same paths (its run directory: the router's ready
  // file). Default: true for local and prefix hosts (network namespaces, containers sharing a
  // volume), false for ssh (the launcher then waits on the router's /health instead).
  bool shared_files = false;
};

struct WorkerGroupConfig {
  std::string name;              // instance ids are <name>-<i>
  services::WorkerRole role = services::WorkerRole::kColocated;
  // engine: pdserve-<role>, given --model; custom: any executable speaking the worker protocol
  // (docs/control-plane.md), named by `binary`, given the standard flags without --model.
  std::string type = "engine";
  uint32_t count = 1;
  // A file name in cluster.bin_dir or an absolute path; required with type: custom, empty:
  // pdserve-<role>.
  std::string binary;
  int metrics_port = 0;          // of instance 0; instance i uses +i (+ i * dp + k for DP rank k); 0: ephemeral
  uint32_t mpi_ranks = 1;
  std::optional<comm::ParallelPlan> plan;  // engine groups: a multi-rank instance
  // Router registrations one process of the group makes (its DP ranks).
  uint32_t registrations() const { return plan ? static_cast<uint32_t>(plan->dp) : 1; }
  // Inventory hosts (`host: a` or `hosts: [a, b]`); empty: the launcher's machine. A one-rank
  // process i runs on hosts[i % n]; an MPI instance spreads its ranks over all of them
  // (mpi_ranks / n each, in this order), with mpirun started on the launcher's machine.
  std::vector<std::string> hosts;
  std::vector<std::string> args;           // appended to the standard flags
  std::map<std::string, std::string> env;  // extra environment
  RestartConfig restart;
};

// The SLO autoscaler (docs/planner.md "Autoscaling"): every `interval` the launcher reads the
// router's /metrics, takes TTFT / TPOT / queue-time percentiles over the last `window`, and
// lets planner::AutoscalerPolicy add a worker to a pool (ScaleGroup) or drain one (the least
// loaded, through the router's POST /admin/drain with `drain_timeout`, so its streams finish).
//
//   autoscaler:
//     enabled: true
//     interval_ms: 1000        window_ms: 5000      percentile: 0.9
//     slo: {ttft_ms: 2000, tpot_ms: 50, queue_ms: 0}
//     scale_up_after: 2        scale_down_after: 5  low_water: 0.5
//     cooldown_ms: 10000       min_requests: 3      drain_timeout_ms: 600000
//     metrics_port: 0          # pdserve_planner_* series (0: a free port, in the ready file)
//     pools:
//       prefill: {group: prefill, min: 1, max: 4}
//       decode: {group: decode, min: 1, max: 4}      # or colocated: {...}
struct AutoscalerSettings {
  bool enabled = false;
  std::chrono::milliseconds interval{1000};  // one decision per pool this often
  std::chrono::milliseconds window{5000};    // percentiles over the requests of this long
  // A drained worker finishes its streams within this (then aborts the rest). Long: a
  // scale-down must not cut a stream.
  std::chrono::milliseconds drain_timeout{600000};
  int metrics_port = 0;
  // Listen address of the pdserve_planner_* metrics (on the launcher's machine). Empty after
  // parsing means: router.host when the router runs on the launcher's machine, else 0.0.0.0.
  std::string metrics_host;
  planner::AutoscalerConfig policy;
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
  AutoscalerSettings autoscaler;
  std::vector<HostConfig> hosts;  // the inventory; empty: one machine
  std::string router_host;        // cluster.router_host: the inventory host of the router ("": here)
  std::string network;            // cluster.network: the default HostConfig::network

  // The inventory host `name` (nullptr for "" or an unknown name).
  const HostConfig* FindHost(const std::string& name) const;
  // The host worker process `index` of `group` runs on, or of its rank 0 (nullptr: here).
  const HostConfig* HostOf(const WorkerGroupConfig& group, uint32_t index) const;
  // Whether any service runs on an inventory host.
  bool multi_host() const { return !hosts.empty(); }
  // HostConfig::network, else cluster.network.
  std::string NetworkOf(const HostConfig& host) const { return host.network.empty() ? network : host.network; }

  // Errors: InvalidArgument naming the key; NotFound (no file).
  static Result<ClusterConfig> LoadFile(const std::string& path);
  static Result<ClusterConfig> Parse(std::string_view yaml, const std::string& origin = "<string>");
  // The binary of a group (its `binary`, else the default of its type and role).
  static std::string BinaryName(const WorkerGroupConfig& group);
};

}  // namespace pdserve::launch
