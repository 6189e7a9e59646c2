#include "services/router/router_config.h"

namespace pdserve::router {

Result<RouterConfig> RouterConfig::FromYaml(const services::YamlSection& s) {
  RouterConfig c;
  PDSERVE_RETURN_IF_ERROR(s.CheckKeys({"host", "port", "control_endpoint", "model_name", "tokenizer_dir", "chat_format", "routing",
                                       "heartbeat_interval_ms", "heartbeat_timeout_ms", "request_timeout_ms",
                                       "first_token_timeout_ms", "default_max_tokens", "max_body_bytes",
                                       "max_outstanding_requests", "max_migrations", "stall_timeout_ms", "http_threads",
                                       "compat_hash", "disconnect_poll_ms", "admin_api", "ready_file", "request_endpoint",
                                       "request_keepalive_ms", "api_keys_file", "auth_exempt_paths", "max_prompt_tokens",
                                       "retry_after_s", "http_read_timeout_ms", "control_curve_secret_key_file",
                                       "control_curve_allowed_clients_file", "request_curve_secret_key_file",
                                       "request_curve_allowed_clients_file", "advertise_host"}));
  PDSERVE_RETURN_IF_ERROR(s.Get("host", &c.host));
  int64_t port = c.port;
  PDSERVE_RETURN_IF_ERROR(s.Get("port", &port));
  c.port = static_cast<int>(port);
  PDSERVE_RETURN_IF_ERROR(s.Get("control_endpoint", &c.control_endpoint));
  PDSERVE_RETURN_IF_ERROR(s.Get("advertise_host", &c.advertise_host));
  PDSERVE_RETURN_IF_ERROR(s.Get("model_name", &c.model_name));
  PDSERVE_RETURN_IF_ERROR(s.Get("tokenizer_dir", &c.tokenizer_dir));
  PDSERVE_RETURN_IF_ERROR(s.GetEnum("chat_format", {"auto", "deepseek_v3", "deepseek_v31"}, &c.chat_format));
  PDSERVE_ASSIGN_OR_RETURN(services::YamlSection r, s.Section("routing"));
  PDSERVE_RETURN_IF_ERROR(
      r.CheckKeys({"mode", "prefill_policy", "decode_policy", "colocated_policy", "decode_local_prefill_tokens",
                   "pull_min_tokens"}));
  PDSERVE_RETURN_IF_ERROR(r.Get("pull_min_tokens", &c.routing.pull_min_tokens));
  if (c.routing.pull_min_tokens < 0 || c.routing.pull_min_tokens > (int64_t{1} << 24))
    return Status::InvalidArgument("router.routing.pull_min_tokens must be in [0, 16777216], got " +
                                   std::to_string(c.routing.pull_min_tokens));
  PDSERVE_RETURN_IF_ERROR(r.Get("decode_local_prefill_tokens", &c.routing.decode_local_prefill_tokens));
  if (c.routing.decode_local_prefill_tokens < 0 || c.routing.decode_local_prefill_tokens > (int64_t{1} << 24))
    return Status::InvalidArgument("router.routing.decode_local_prefill_tokens must be in [0, 16777216], got " +
                                   std::to_string(c.routing.decode_local_prefill_tokens));
  PDSERVE_RETURN_IF_ERROR(r.GetEnum("mode", {"auto", "disaggregated", "colocated"}, &c.routing.mode));
  PDSERVE_RETURN_IF_ERROR(
      r.GetEnum("prefill_policy", {"round_robin", "least_outstanding_tokens", "kv_aware"}, &c.routing.prefill_policy));
  PDSERVE_RETURN_IF_ERROR(r.GetEnum("decode_policy", {"round_robin", "least_outstanding_tokens", "kv_capacity_aware"},
                                    &c.routing.decode_policy));
  PDSERVE_RETURN_IF_ERROR(r.GetEnum("colocated_policy",
                                    {"round_robin", "least_outstanding_tokens", "kv_capacity_aware", "kv_aware"},
                                    &c.routing.colocated_policy));
  PDSERVE_RETURN_IF_ERROR(s.Get("heartbeat_interval_ms", &c.heartbeat_interval));
  PDSERVE_RETURN_IF_ERROR(s.Get("heartbeat_timeout_ms", &c.heartbeat_timeout));
  PDSERVE_RETURN_IF_ERROR(s.Get("request_timeout_ms", &c.request_timeout));
  PDSERVE_RETURN_IF_ERROR(s.Get("first_token_timeout_ms", &c.first_token_timeout));
  PDSERVE_RETURN_IF_ERROR(s.Get("default_max_tokens", &c.default_max_tokens));
  PDSERVE_RETURN_IF_ERROR(s.Get("max_body_bytes", &c.max_body_bytes));
  PDSERVE_RETURN_IF_ERROR(s.Get("max_outstanding_requests", &c.max_outstanding_requests));
  PDSERVE_RETURN_IF_ERROR(s.Get("max_migrations", &c.max_migrations));
  PDSERVE_RETURN_IF_ERROR(s.Get("stall_timeout_ms", &c.stall_timeout));
  int32_t threads = c.http_threads;
  PDSERVE_RETURN_IF_ERROR(s.Get("http_threads", &threads));
  c.http_threads = threads;
  int64_t hash = 0;
  PDSERVE_RETURN_IF_ERROR(s.Get("compat_hash", &hash));
  c.compat_hash = static_cast<uint64_t>(hash);
  PDSERVE_RETURN_IF_ERROR(s.Get("disconnect_poll_ms", &c.disconnect_poll));
  PDSERVE_RETURN_IF_ERROR(s.Get("admin_api", &c.admin_api));
  PDSERVE_RETURN_IF_ERROR(s.Get("ready_file", &c.ready_file));
  PDSERVE_RETURN_IF_ERROR(s.Get("request_endpoint", &c.request_endpoint));
  PDSERVE_RETURN_IF_ERROR(s.Get("request_keepalive_ms", &c.request_keepalive));
  PDSERVE_RETURN_IF_ERROR(s.Get("api_keys_file", &c.api_keys_file));
  PDSERVE_RETURN_IF_ERROR(s.Get("auth_exempt_paths", &c.auth_exempt_paths));
  PDSERVE_RETURN_IF_ERROR(s.Get("max_prompt_tokens", &c.max_prompt_tokens));
  PDSERVE_RETURN_IF_ERROR(s.Get("retry_after_s", &c.retry_after_s));
  PDSERVE_RETURN_IF_ERROR(s.Get("http_read_timeout_ms", &c.http_read_timeout));
  PDSERVE_RETURN_IF_ERROR(s.Get("control_curve_secret_key_file", &c.control_curve_secret_key_file));
  PDSERVE_RETURN_IF_ERROR(s.Get("control_curve_allowed_clients_file", &c.control_curve_allowed_clients_file));
  PDSERVE_RETURN_IF_ERROR(s.Get("request_curve_secret_key_file", &c.request_curve_secret_key_file));
  PDSERVE_RETURN_IF_ERROR(s.Get("request_curve_allowed_clients_file", &c.request_curve_allowed_clients_file));
  PDSERVE_RETURN_IF_ERROR(c.Validate());
  return c;
}

Result<RouterConfig> RouterConfig::LoadFile(const std::string& path) {
  PDSERVE_ASSIGN_OR_RETURN(services::YamlSection root, services::YamlSection::LoadFile(path));
  PDSERVE_ASSIGN_OR_RETURN(services::YamlSection section, root.Section("router"));
  auto c = FromYaml(section);
  if (!c.ok()) return c.status().WithContext(path);
  return c;
}

Status RouterConfig::Validate() const {
  if (port < 0 || port > 65535) return Status::InvalidArgument("router.port must be in [0, 65535]");
  if (control_endpoint.rfind("tcp://", 0) != 0 && control_endpoint.rfind("ipc://", 0) != 0)
    return Status::InvalidArgument("router.control_endpoint must be tcp://HOST:PORT or ipc://PATH");
  if (advertise_host.find_first_of(" /\t") != std::string::npos || advertise_host.find("://") != std::string::npos)
    return Status::InvalidArgument("router.advertise_host must be a host name or address, not '" + advertise_host + "'");
  if (model_name.empty()) return Status::InvalidArgument("router.model_name is empty");
  if (chat_format != "auto" && chat_format != "deepseek_v3" && chat_format != "deepseek_v31")
    return Status::InvalidArgument("router.chat_format must be auto, deepseek_v3 or deepseek_v31");
  // A decode worker takes the whole prompt's KV from the transfer and looks nothing up.
  if (routing.decode_policy == "kv_aware")
    return Status::InvalidArgument(
        "router.routing.decode_policy cannot be kv_aware (decode workers import the whole prompt; use it for "
        "prefill_policy / colocated_policy)");
  if (heartbeat_interval.count() <= 0) return Status::InvalidArgument("router.heartbeat_interval_ms must be > 0");
  if (heartbeat_timeout <= heartbeat_interval)
    return Status::InvalidArgument("router.heartbeat_timeout_ms must exceed heartbeat_interval_ms");
  if (request_timeout.count() <= 0 || first_token_timeout.count() <= 0)
    return Status::InvalidArgument("router timeouts must be > 0");
  if (max_body_bytes < 1024) return Status::InvalidArgument("router.max_body_bytes must be >= 1024");
  if (max_outstanding_requests == 0) return Status::InvalidArgument("router.max_outstanding_requests must be > 0");
  if (max_migrations > 100) return Status::InvalidArgument("router.max_migrations must be in [0, 100]");
  if (stall_timeout.count() < 0) return Status::InvalidArgument("router.stall_timeout_ms must be >= 0 (0: off)");
  if (http_threads < 2 || http_threads > 4096) return Status::InvalidArgument("router.http_threads must be in [2, 4096]");
  if (disconnect_poll.count() <= 0) return Status::InvalidArgument("router.disconnect_poll_ms must be > 0");
  if (!request_endpoint.empty() && request_endpoint.rfind("tcp://", 0) != 0 && request_endpoint.rfind("ipc://", 0) != 0)
    return Status::InvalidArgument("router.request_endpoint must be empty (off), tcp://HOST:PORT or ipc://PATH");
  if (request_keepalive.count() < 10 || request_keepalive.count() > 3600000)
    return Status::InvalidArgument("router.request_keepalive_ms must be in [10, 3600000]");
  if (http_read_timeout.count() <= 0) return Status::InvalidArgument("router.http_read_timeout_ms must be > 0");
  for (const auto& p : auth_exempt_paths)
    if (p.empty() || p[0] != '/') return Status::InvalidArgument("router.auth_exempt_paths entries must start with '/'");
  if (control_curve_secret_key_file.empty() && !control_curve_allowed_clients_file.empty())
    return Status::InvalidArgument(
        "router.control_curve_allowed_clients_file needs router.control_curve_secret_key_file");
  if (request_curve_secret_key_file.empty() && !request_curve_allowed_clients_file.empty())
    return Status::InvalidArgument(
        "router.request_curve_allowed_clients_file needs router.request_curve_secret_key_file");
  if (!request_curve_secret_key_file.empty() && request_endpoint.empty())
    return Status::InvalidArgument("router.request_curve_secret_key_file needs router.request_endpoint");
  return Status::Ok();
}

}  // namespace pdserve::router
