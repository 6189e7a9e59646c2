#include "services/worker/worker_config.h"

#include <string>
#include <vector>

#include "services/common/yaml_config.h"

namespace pdserve::services::worker {
namespace {

Status LoadYaml(const std::string& path, WorkerServiceConfig* c, std::string* role) {
  PDSERVE_ASSIGN_OR_RETURN(YamlSection root, YamlSection::LoadFile(path));
  PDSERVE_ASSIGN_OR_RETURN(YamlSection w, root.Section("worker"));
  PDSERVE_RETURN_IF_ERROR(w.CheckKeys({"role", "router", "worker_id", "model_name", "model_dir", "threads",
                                       "kv_cache_gib", "block_tokens", "max_seqs", "metrics_host", "metrics_port",
                                       "ready_file", "drain_timeout_ms", "register_retry_ms", "ucx_tls",
                                       "ucx_net_devices", "kv_lease_ms", "kv_transfer_timeout_ms", "kv_stream_layers",
                                       "log_level", "curve_secret_key_file", "router_public_key_file", "plan",
                                       "step_stall_timeout_ms"}));
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
  PDSERVE_RETURN_IF_ERROR(w.Get("threads", &threads));
  PDSERVE_RETURN_IF_ERROR(w.Get("kv_cache_gib", &c->kv_cache_gib));
  PDSERVE_RETURN_IF_ERROR(w.Get("block_tokens", &c->block_tokens));
  PDSERVE_RETURN_IF_ERROR(w.Get("max_seqs", &c->max_seqs));
  PDSERVE_RETURN_IF_ERROR(w.Get("metrics_host", &c->metrics_host));
  PDSERVE_RETURN_IF_ERROR(w.Get("metrics_port", &port));
  PDSERVE_RETURN_IF_ERROR(w.Get("ready_file", &c->ready_file));
  PDSERVE_RETURN_IF_ERROR(w.Get("drain_timeout_ms", &c->drain_timeout));
  PDSERVE_RETURN_IF_ERROR(w.Get("register_retry_ms", &c->register_retry));
  PDSERVE_RETURN_IF_ERROR(w.Get("ucx_tls", &c->ucx_tls));
  PDSERVE_RETURN_IF_ERROR(w.Get("ucx_net_devices", &c->ucx_net_devices));
  PDSERVE_RETURN_IF_ERROR(w.Get("kv_lease_ms", &c->kv_lease));
  PDSERVE_RETURN_IF_ERROR(w.Get("kv_transfer_timeout_ms", &c->kv_transfer_timeout));
  PDSERVE_RETURN_IF_ERROR(w.Get("step_stall_timeout_ms", &c->step_stall_timeout));
  PDSERVE_RETURN_IF_ERROR(w.Get("kv_stream_layers", &c->kv_stream_layers));
  PDSERVE_RETURN_IF_ERROR(w.Get("log_level", &c->log_level));
  PDSERVE_RETURN_IF_ERROR(w.Get("curve_secret_key_file", &c->curve_secret_key_file));
  PDSERVE_RETURN_IF_ERROR(w.Get("router_public_key_file", &c->router_public_key_file));
  c->threads = static_cast<int>(threads);
  c->metrics_port = static_cast<int>(port);
  return Status::Ok();
}

}  // namespace

Result<WorkerServiceConfig> ParseWorkerConfig(int argc, char** argv, std::optional<WorkerRole> fixed_role) {
  PDSERVE_ASSIGN_OR_RETURN(
      CommandLine cl,
      CommandLine::Parse(argc, argv,
                         {"config", "role", "router", "worker-id", "model-name", "model", "threads", "kv-gib",
                          "block-tokens", "max-seqs", "metrics-host", "metrics-port", "ready-file", "drain-timeout-ms",
                          "register-retry-ms", "ucx-tls", "ucx-net-devices", "kv-lease-ms",
                          "kv-transfer-timeout-ms", "kv-stream-layers", "log-level", "test-fail-prefill-at-layer",
                           "test-tear-kv-writes", "curve-secret-key-file", "router-public-key-file", "plan",
                          "step-stall-timeout-ms"},
                         {}));
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
  c.metrics_host = cl.GetOr("metrics-host", c.metrics_host);
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
  PDSERVE_ASSIGN_OR_RETURN(int64_t stall, cl.GetInt("step-stall-timeout-ms", c.step_stall_timeout.count()));
  if (stall < 0) return Status::InvalidArgument("--step-stall-timeout-ms must be >= 0 (0: off)");
  c.step_stall_timeout = std::chrono::milliseconds(stall);
  if (auto v = cl.Get("kv-stream-layers")) {
    if (*v == "true" || *v == "1") c.kv_stream_layers = true;
    else if (*v == "false" || *v == "0") c.kv_stream_layers = false;
    else return Status::InvalidArgument("--kv-stream-layers must be true or false, not '" + *v + "'");
  }
  PDSERVE_ASSIGN_OR_RETURN(c.test_fail_prefill_at_layer,
                           cl.GetInt("test-fail-prefill-at-layer", c.test_fail_prefill_at_layer));
  PDSERVE_ASSIGN_OR_RETURN(c.test_tear_kv_writes, cl.GetInt("test-tear-kv-writes", c.test_tear_kv_writes));
  if (c.test_tear_kv_writes < 0) return Status::InvalidArgument("--test-tear-kv-writes must be >= 0");
  c.threads = static_cast<int>(threads);
  c.metrics_port = static_cast<int>(port);
  c.drain_timeout = std::chrono::milliseconds(drain);
  c.register_retry = std::chrono::milliseconds(std::max<int64_t>(1, retry));
  c.kv_lease = std::chrono::milliseconds(lease);
  c.kv_transfer_timeout = std::chrono::milliseconds(xfer);
  if (c.curve_secret_key_file.empty() != c.router_public_key_file.empty())
    return Status::InvalidArgument("CURVE needs both --curve-secret-key-file and --router-public-key-file");
  if (c.model_dir.empty()) return Status::InvalidArgument("--model (or worker.model_dir) is required");
  if (c.threads < 0 || c.kv_cache_gib <= 0 || c.block_tokens <= 0 || c.max_seqs < 0 || port < 0 || port > 65535 ||
      drain < 0 || lease <= 0 || xfer <= 0)
    return Status::InvalidArgument("--threads, --max-seqs, --metrics-port, --drain-timeout-ms must be >= 0; "
                                   "--kv-gib, --block-tokens, --kv-lease-ms, --kv-transfer-timeout-ms > 0");
  return c;
}

}  // namespace pdserve::services::worker
