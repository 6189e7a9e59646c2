// WorkerServiceConfig: everything an engine-backed worker process (pdserve-colocated,
// pdserve-prefill, pdserve-decode, pdserve-worker --role R) is configured with. Defaults are the
// member initializers; an optional YAML file (`--config FILE`, section `worker:`) overrides
// them, and command-line flags override the file (docs/services.md lists every key and flag).
//
// Thread-safety: value type.
#pragma once

#include <optional>

#include "comm/parallel_plan.h"

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>

#include "common/status.h"
#include "services/control/control_messages.h"
#include "services/common/command_line.h"

namespace pdserve::services::worker {

struct WorkerServiceConfig {
  WorkerRole role = WorkerRole::kColocated;
  std::string router;                    // required: the router's control endpoint
  std::string worker_id = "worker-0";
  std::string model_name = "pdserve";
  std::string model_dir;                 // required
  // The tokenizer whose token bytes structured output matches (the router's; empty: the
  // bundled DeepSeek-V3 tokenizer, the router's default too).
  std::string tokenizer_dir;
  int threads = 0;                       // engine compute threads (0: PDSERVE_NUM_THREADS / default)
  double kv_cache_gib = 0.25;            // the paged KV pool
  int64_t block_tokens = 64;
  int64_t max_seqs = 0;                  // scheduler batch limit (0: engine default)
  std::string metrics_host = "127.0.0.1";  // metrics listen address (0.0.0.0: every interface)
  int metrics_port = 0;                  // 0: ephemeral
  // Addresses (docs/configuration.md "Addresses"). `network`: the interface ("eth0") or IPv4
  // subnet ("10.0.0.0/24") this worker serves on; its address there is advertised, and UCX
  // uses that interface unless ucx_net_devices names others. `advertise_host`: the address
  // registered with the router for the metrics (/v1/workers), overriding the network's.
  // Both empty: the metrics listen address (an interface's address when it is a wildcard).
  std::string network;
  std::string advertise_host;
  std::string ready_file;                // {"metrics_port", "pid"} once up
  std::chrono::milliseconds drain_timeout{10000};
  std::chrono::milliseconds register_retry{250};
  // KV transfer (prefill / decode): UCX transports ("" = UCX_TLS / UCX_NET_DEVICES from the
  // environment), the decode side's reservation lease and transfer timeout.
  std::string ucx_tls;
  std::string ucx_net_devices;
  std::chrono::milliseconds kv_lease{30000};
  std::chrono::milliseconds kv_transfer_timeout{10000};
  // Pulls (docs/prefix-cache.md "Pulls"): how long a prefill worker's reservation for a pulled
  // prefix waits for the holder to begin writing (its kvPush travels through the router); past
  // it the prefix is computed instead.
  std::chrono::milliseconds kv_pull_lease{2000};
  // Watchdog: an engine step running longer than this (stuck, e.g. a multi-rank instance
  // waiting in a collective for a rank that stopped) makes the worker withhold its heartbeats,
  // so the router moves its requests (WorkerHandler::Health). 0: off.
  std::chrono::milliseconds step_stall_timeout{60000};
  // Prefill: write each layer's KV as soon as the prompt's forward computed it (overlapping
  // the transfer with the remaining layers); false: write all layers after the forward.
  bool kv_stream_layers = true;
  // Keep finished requests' full KV blocks and reuse them for prompts with the same prefix
  // (docs/prefix-cache.md).
  bool prefix_cache = true;
  // The prefix cache's disk tier (docs/prefix-cache.md "Disk tier"): evicted cached blocks go to
  // files under <prefix_cache_disk_dir>/<worker_id> and come back on a hit, up to
  // prefix_cache_disk_gib of files. Empty: off. Off too for multi-rank instances.
  std::string prefix_cache_disk_dir;
  double prefix_cache_disk_gib = 4.0;
  std::string log_level;
  // A multi-rank instance (docs/services.md "Multi-rank workers"): "cp=1,dp=2,ep=2,tp=1" (keys
  // optional, default 1); the process must then run under mpirun with cp * dp * tp ranks.
  // Unset: one process without MPI.
  std::optional<comm::ParallelPlan> plan;
  // CURVE on the control plane (docs/operations.md, "Security"): this worker's secret key file
  // and the router's public key file; both or neither.
  std::string curve_secret_key_file;
  std::string router_public_key_file;
};

// Resolves `config->network` on this host (each rank of a multi-rank instance resolves its own):
// fills advertise_host (unless set) with the address there and ucx_net_devices (unless set) with
// the interface. Errors: FindInterfaceAddress's (NotFound: no such interface or subnet here).
Status ResolveWorkerNetwork(WorkerServiceConfig* config);
// The "HOST:PORT" the worker registers for its metrics (RegisterMsg::http_address).
std::string AdvertisedMetricsAddress(const WorkerServiceConfig& config, int metrics_port);

// The options of a worker binary (docs/services.md); `fixed_role` is the role of a role-named
// binary (pdserve-prefill ...), nullopt for pdserve-worker.
const CommandSpec& WorkerCommandSpec(std::optional<WorkerRole> fixed_role);
// The config from parsed options (over the YAML of --config, over the defaults). With a
// `fixed_role`, --role must be absent or equal. Errors: InvalidArgument naming the flag or key;
// NotFound for a missing --config file.
Result<WorkerServiceConfig> WorkerConfigFromCommandLine(const CommandLine& cl, std::optional<WorkerRole> fixed_role);

}  // namespace pdserve::services::worker
