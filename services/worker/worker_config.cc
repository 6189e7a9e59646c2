#include "services/worker/worker_config.h"

#include <string>
#include <vector>

#include "services/common/net_util.h"
#include "services/common/yaml_config.h"

namespace pdserve::services::worker {
namespace {

Status LoadYaml(const std::string& path, WorkerServiceConfig* c, std::string* role) {
  PDSERVE_ASSIGN_OR_RETURN(YamlSection root, YamlSection::LoadFile(path));
  PDSERVE_ASSIGN_OR_RETURN(YamlSection w, root.Section("worker"));
  PDSERVE_RETURN_IF_ERROR(w.CheckKeys({"role", "router", "worker_id", "model_name", "model_dir", "threads",
                                       "kv_cache_gib", "block_tokens", "max_seqs", "metrics_host", "metrics_port",
                                       "ready_file", "drain_timeout_ms", "register_retry_ms", "ucx_tls",
                                       "ucx_net_devices", "kv_lease_ms", "kv_transfer_timeout_ms", "kv_pull_lease_ms", "kv_stream_layers",
                                       "log_level", "curve_secret_key_file", "router_public_key_file", "plan",
                                       "step_stall_timeout_ms", "tokenizer_dir", "prefix_cache", "network",
                                       "advertise_host", "prefix_cache_disk_dir", "prefix_cache_disk_gib"}));
  int64_t threads = c->threads, port = c->metrics_port;
  std::string plan;
  PDSERVE_RETURN_IF_ERROR(w.Get("plan", &plan));
  if (!plan.empty()) {
    PDSERVE_ASSIGN_OR_RETURN(c->plan, comm::ParallelPlan::FromString(plan, "worker.plan"));
  }
  PDSERVE_RETURN_IF_ERROR(w.Get("role", role));
  PDSERVE_RETURN_IF_ERROR(w.Get("router", &c->router));
  PDSERVE_RETURN_IF_ERROR(w.Get("worker_id", &c->worker_id));
  PDSERVE_RETURN_IF_ERROR(w.Get("model_name", &c->model_name));
  PDSERVE_RETURN_IF_ERROR(w.Get("model_dir", &c->model_dir));
  PDSERVE_RETURN_IF_ERROR(w.Get("tokenizer_dir", &c->tokenizer_dir));
  PDSERVE_RETURN_IF_ERROR(w.Get("threads", &threads));
  PDSERVE_RETURN_IF_ERROR(w.Get("kv_cache_gib", &c->kv_cache_gib));
  PDSERVE_RETURN_IF_ERROR(w.Get("block_tokens", &c->block_tokens));
  PDSERVE_RETURN_IF_ERROR(w.Get("max_seqs", &c->max_seqs));
  PDSERVE_RETURN_IF_ERROR(w.Get("metrics_host", &c->metrics_host));
  PDSERVE_RETURN_IF_ERROR(w.Get("metrics_port", &port));
  PDSERVE_RETURN_IF_ERROR(w.Get("network", &c->network));
  PDSERVE_RETURN_IF_ERROR(w.Get("advertise_host", &c->advertise_host));
  PDSERVE_RETURN_IF_ERROR(w.Get("ready_file", &c->ready_file));
  PDSERVE_RETURN_IF_ERROR(w.Get("drain_timeout_ms", &c->drain_timeout));
  PDSERVE_RETURN_IF_ERROR(w.Get("register_retry_ms", &c->register_retry));
  PDSERVE_RETURN_IF_ERROR(w.Get("ucx_tls", &c->ucx_tls));
  PDSERVE_RETURN_IF_ERROR(w.Get("ucx_net_devices", &c->ucx_net_devices));
  PDSERVE_RETURN_IF_ERROR(w.Get("kv_lease_ms", &c->kv_lease));
  PDSERVE_RETURN_IF_ERROR(w.Get("kv_transfer_timeout_ms", &c->kv_transfer_timeout));
  PDSERVE_RETURN_IF_ERROR(w.Get("kv_pull_lease_ms", &c->kv_pull_lease));
  PDSERVE_RETURN_IF_ERROR(w.Get("step_stall_timeout_ms", &c->step_stall_timeout));
  PDSERVE_RETURN_IF_ERROR(w.Get("kv_stream_layers", &c->kv_stream_layers));
  PDSERVE_RETURN_IF_ERROR(w.Get("prefix_cache", &c->prefix_cache));
  PDSERVE_RETURN_IF_ERROR(w.Get("prefix_cache_disk_dir", &c->prefix_cache_disk_dir));
  PDSERVE_RETURN_IF_ERROR(w.Get("prefix_cache_disk_gib", &c->prefix_cache_disk_gib));
  PDSERVE_RETURN_IF_ERROR(w.Get("log_level", &c->log_level));
  PDSERVE_RETURN_IF_ERROR(w.Get("curve_secret_key_file", &c->curve_secret_key_file));
  PDSERVE_RETURN_IF_ERROR(w.Get("router_public_key_file", &c->router_public_key_file));
  c->threads = static_cast<int>(threads);
  c->metrics_port = static_cast<int>(port);
  return Status::Ok();
}

}  // namespace

const CommandSpec& WorkerCommandSpec(std::optional<WorkerRole> fixed_role) {
  static const std::vector<OptionSpec> kOptions = {
      {"config", "FILE", "YAML file with a `worker:` section (docs/services.md); options override it"},
      {"role", "ROLE", "colocated | prefill | decode (pdserve-worker only)"},
      {"router", "ENDPOINT", "the router's control endpoint, e.g. tcp://127.0.0.1:7000 (required)"},
      {"worker-id", "ID", "unique worker name, stable across restarts (default worker-0)"},
      {"model-name", "NAME", "the model name the router serves (default pdserve)"},
      {"model", "DIR", "checkpoint directory (required)"},
      {"tokenizer", "DIR", "the router's tokenizer, for structured output (default: the bundled DeepSeek-V3 one)"},
      {"threads", "N", "engine compute threads (0: PDSERVE_NUM_THREADS or all cores)"},
      {"kv-gib", "X", "paged KV pool size in GiB (default 0.25)"},
      {"block-tokens", "N", "tokens per KV block (default 64)"},
      {"max-seqs", "N", "scheduler batch limit (0: engine default)"},
      {"metrics-host", "HOST", "metrics listen address (default 127.0.0.1; 0.0.0.0: every interface)"},
      {"network", "IF|CIDR", "interface (eth0) or IPv4 subnet (10.0.0.0/24) this worker serves on: its address "
                             "there is registered, and UCX uses that interface (unless --ucx-net-devices)"},
      {"advertise-host", "HOST", "address registered for the metrics (default: the --network address, else the "
                                 "listen address, else an interface's address)"},
      {"metrics-port", "P", "metrics port (0: a free one)"},
      {"ready-file", "PATH", "write {metrics_port, pid} here once registered"},
      {"drain-timeout-ms", "N", "on SIGTERM: how long running requests may finish (default 10000)"},
      {"register-retry-ms", "N", "first registration retry delay; doubles up to 5 s (default 250)"},
      {"ucx-tls", "LIST", "UCX transports for KV transfer (default: UCX_TLS from the environment)"},
      {"ucx-net-devices", "LIST", "UCX network devices (default: UCX_NET_DEVICES)"},
      {"kv-lease-ms", "N", "decode: how long reserved KV blocks wait for prefill"},
      {"kv-pull-lease-ms", "N", "prefill: how long blocks reserved for a pulled prefix wait for its holder (default 2000)"},
      {"kv-transfer-timeout-ms", "N", "deadline of one KV transfer"},
      {"kv-stream-layers", "BOOL", "prefill: send each layer's KV as soon as it is computed (default true)"},
      {"prefix-cache", "BOOL", "reuse cached KV of earlier prompts with the same prefix (default true)"},
      {"prefix-cache-disk-dir", "DIR", "spill evicted cached KV blocks to files under DIR/<worker-id> and restore "
                                       "them on a hit (default: off)"},
      {"prefix-cache-disk-gib", "X", "bound on the disk tier's files in GiB (default 4)"},
      {"log-level", "L", "trace | debug | info | warn | error | critical | off"},
      {"curve-secret-key-file", "F", "this worker's CURVE secret key (with --router-public-key-file)"},
      {"router-public-key-file", "F", "the router's CURVE public key"},
      {"plan", "PLAN", "multi-rank instance, e.g. dp=2,ep=2 (run under mpirun with cp*dp*tp ranks)"},
      {"step-stall-timeout-ms", "N", "an engine step longer than this withholds heartbeats (0: off)"}};
  static const CommandSpec kWorker{"pdserve-worker", "--router ENDPOINT --model DIR [--role ROLE] [options]",
                                   "An engine-backed pdserve worker (docs/services.md). Runs until SIGINT or SIGTERM,\n"
                                   "then drains its requests (up to --drain-timeout-ms) and exits 0.",
                                   kOptions};
  static const CommandSpec kColocated{"pdserve-colocated", "--router ENDPOINT --model DIR [options]",
                                      "A colocated (prefill + decode) engine worker (docs/services.md).", kOptions};
  static const CommandSpec kPrefill{"pdserve-prefill", "--router ENDPOINT --model DIR [options]",
                                    "A prefill engine worker: runs prompts and streams their KV to decode workers.",
                                    kOptions};
  static const CommandSpec kDecode{"pdserve-decode", "--router ENDPOINT --model DIR [options]",
                                   "A decode engine worker: receives prompts' KV and generates tokens.", kOptions};
  if (!fixed_role) return kWorker;
  switch (*fixed_role) {
    case WorkerRole::kPrefill: return kPrefill;
    case WorkerRole::kDecode: return kDecode;
    default: return kColocated;
  }
}

Result<WorkerServiceConfig> WorkerConfigFromCommandLine(const CommandLine& cl, std::optional<WorkerRole> fixed_role) {
  WorkerServiceConfig c;
  std::string role = fixed_role ? WorkerRoleName(*fixed_role) : "colocated";
  if (auto path = cl.Get("config")) PDSERVE_RETURN_IF_ERROR(LoadYaml(*path, &c, &role));
  role = cl.GetOr("role", role);
  PDSERVE_ASSIGN_OR_RETURN(c.role, ParseWorkerRole(role));
  if (fixed_role && c.role != *fixed_role)
    return Status::InvalidArgument(std::string("this binary serves role ") + WorkerRoleName(*fixed_role) +
                                   ", not " + role);
  c.router = cl.GetOr("router", c.router);
  c.worker_id = cl.GetOr("worker-id", c.worker_id);
  c.model_name = cl.GetOr("model-name", c.model_name);
  c.model_dir = cl.GetOr("model", c.model_dir);
  c.tokenizer_dir = cl.GetOr("tokenizer", c.tokenizer_dir);
  c.metrics_host = cl.GetOr("metrics-host", c.metrics_host);
  c.network = cl.GetOr("network", c.network);
  c.advertise_host = cl.GetOr("advertise-host", c.advertise_host);
  c.ready_file = cl.GetOr("ready-file", c.ready_file);
  c.ucx_tls = cl.GetOr("ucx-tls", c.ucx_tls);
  c.ucx_net_devices = cl.GetOr("ucx-net-devices", c.ucx_net_devices);
  c.log_level = cl.GetOr("log-level", c.log_level);
  c.curve_secret_key_file = cl.GetOr("curve-secret-key-file", c.curve_secret_key_file);
  c.router_public_key_file = cl.GetOr("router-public-key-file", c.router_public_key_file);
  if (auto plan = cl.Get("plan")) {
    PDSERVE_ASSIGN_OR_RETURN(c.plan, comm::ParallelPlan::FromString(*plan));
  }
  PDSERVE_ASSIGN_OR_RETURN(int64_t threads, cl.GetInt("threads", c.threads));
  PDSERVE_ASSIGN_OR_RETURN(c.kv_cache_gib, cl.GetDouble("kv-gib", c.kv_cache_gib));
  PDSERVE_ASSIGN_OR_RETURN(c.block_tokens, cl.GetInt("block-tokens", c.block_tokens));
  PDSERVE_ASSIGN_OR_RETURN(c.max_seqs, cl.GetInt("max-seqs", c.max_seqs));
  PDSERVE_ASSIGN_OR_RETURN(int64_t port, cl.GetInt("metrics-port", c.metrics_port));
  PDSERVE_ASSIGN_OR_RETURN(int64_t drain, cl.GetInt("drain-timeout-ms", c.drain_timeout.count()));
  PDSERVE_ASSIGN_OR_RETURN(int64_t retry, cl.GetInt("register-retry-ms", c.register_retry.count()));
  PDSERVE_ASSIGN_OR_RETURN(int64_t lease, cl.GetInt("kv-lease-ms", c.kv_lease.count()));
  PDSERVE_ASSIGN_OR_RETURN(int64_t xfer, cl.GetInt("kv-transfer-timeout-ms", c.kv_transfer_timeout.count()));
  PDSERVE_ASSIGN_OR_RETURN(int64_t pull_lease, cl.GetInt("kv-pull-lease-ms", c.kv_pull_lease.count()));
  PDSERVE_ASSIGN_OR_RETURN(int64_t stall, cl.GetInt("step-stall-timeout-ms", c.step_stall_timeout.count()));
  if (stall < 0) return Status::InvalidArgument("--step-stall-timeout-ms must be >= 0 (0: off)");
  c.step_stall_timeout = std::chrono::milliseconds(stall);
  PDSERVE_ASSIGN_OR_RETURN(c.kv_stream_layers, cl.GetBool("kv-stream-layers", c.kv_stream_layers));
  PDSERVE_ASSIGN_OR_RETURN(c.prefix_cache, cl.GetBool("prefix-cache", c.prefix_cache));
  c.prefix_cache_disk_dir = cl.GetOr("prefix-cache-disk-dir", c.prefix_cache_disk_dir);
  PDSERVE_ASSIGN_OR_RETURN(c.prefix_cache_disk_gib, cl.GetDouble("prefix-cache-disk-gib", c.prefix_cache_disk_gib));
  if (!(c.prefix_cache_disk_gib > 0))
    return Status::InvalidArgument("--prefix-cache-disk-gib (worker.prefix_cache_disk_gib) must be > 0");
  c.threads = static_cast<int>(threads);
  c.metrics_port = static_cast<int>(port);
  c.drain_timeout = std::chrono::milliseconds(drain);
  c.register_retry = std::chrono::milliseconds(std::max<int64_t>(1, retry));
  c.kv_lease = std::chrono::milliseconds(lease);
  c.kv_transfer_timeout = std::chrono::milliseconds(xfer);
  c.kv_pull_lease = std::chrono::milliseconds(pull_lease);
  if (c.curve_secret_key_file.empty() != c.router_public_key_file.empty())
    return Status::InvalidArgument("CURVE needs both --curve-secret-key-file and --router-public-key-file");
  if (c.model_dir.empty()) return Status::InvalidArgument("--model (or worker.model_dir) is required");
  if (c.router.empty()) return Status::InvalidArgument("--router (or worker.router) is required: the control endpoint of the router");
  if (c.threads < 0 || c.kv_cache_gib <= 0 || c.block_tokens <= 0 || c.max_seqs < 0 || port < 0 || port > 65535 ||
      drain < 0 || lease <= 0 || xfer <= 0 || pull_lease <= 0)
    return Status::InvalidArgument("--threads, --max-seqs, --metrics-port, --drain-timeout-ms must be >= 0; "
                                   "--kv-gib, --block-tokens, --kv-lease-ms, --kv-transfer-timeout-ms, "
                                   "--kv-pull-lease-ms > 0");
  return c;
}

Status ResolveWorkerNetwork(WorkerServiceConfig* c) {
  if (c->network.empty()) return Status::Ok();
  auto found = FindInterfaceAddress(c->network);
  if (!found.ok()) return found.status().WithContext("--network");
  if (c->advertise_host.empty()) c->advertise_host = found->address;
  if (c->ucx_net_devices.empty()) c->ucx_net_devices = found->interface;
  return Status::Ok();
}

std::string AdvertisedMetricsAddress(const WorkerServiceConfig& c, int metrics_port) {
  return AdvertisedHost(c.metrics_host, c.advertise_host) + ":" + std::to_string(metrics_port);
}

}  // namespace pdserve::services::worker
