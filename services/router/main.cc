// pdserve-router: the OpenAI-compatible front of the cluster (docs/router.md).
//
//   pdserve-router [--config FILE] [--host H] [--port P] [--control ENDPOINT] [--model-name N]
//                  [--tokenizer DIR] [--mode auto|disaggregated|colocated]
//                  [--prefill-policy P] [--decode-policy P] [--colocated-policy P]
//                  [--heartbeat-interval-ms N] [--heartbeat-timeout-ms N]
//                  [--request-timeout-ms N] [--first-token-timeout-ms N]
//                  [--max-body-bytes N] [--max-migrations N] [--stall-timeout-ms N]
//                  [--ready-file PATH] [--log-level L]
//                  [--request-endpoint tcp://HOST:PORT] [--request-keepalive-ms N]
//                  (the ZeroMQ request API, docs/request-api.md)
//                  [--api-keys-file F] [--max-prompt-tokens N] [--control-curve-secret-key-file F]
//                  [--control-curve-allowed-clients-file F] [--request-curve-secret-key-file F]
//                  [--request-curve-allowed-clients-file F]
// --config reads the `router:` section of a YAML file (docs/configuration.md); flags override
// it. Runs until SIGINT / SIGTERM, then stops cleanly (exit 0).
#include <cstdio>

#include "common/cpu_features.h"
#include "common/logging.h"
#include "services/common/process_util.h"
#include "services/router/router_server.h"

namespace {

using pdserve::Result;
using pdserve::Status;
using pdserve::router::RouterConfig;

Result<RouterConfig> BuildConfig(int argc, char** argv) {
  PDSERVE_ASSIGN_OR_RETURN(
      auto cl, pdserve::services::CommandLine::Parse(
                   argc, argv,
                   {"config", "host", "port", "control", "model-name", "tokenizer", "mode", "prefill-policy",
                    "decode-policy", "colocated-policy", "heartbeat-interval-ms", "heartbeat-timeout-ms",
                    "request-timeout-ms", "first-token-timeout-ms", "max-body-bytes", "max-migrations",
                    "stall-timeout-ms", "ready-file", "log-level", "http-threads", "request-endpoint",
                    "request-keepalive-ms", "api-keys-file", "max-prompt-tokens", "control-curve-secret-key-file",
                    "control-curve-allowed-clients-file", "request-curve-secret-key-file",
                    "request-curve-allowed-clients-file"},
                   {}));
  RouterConfig c;
  if (auto path = cl.Get("config")) {
    PDSERVE_ASSIGN_OR_RETURN(c, RouterConfig::LoadFile(*path));
  }
  if (auto v = cl.Get("log-level")) pdserve::SetLogLevel(*v);
  c.host = cl.GetOr("host", c.host);
  PDSERVE_ASSIGN_OR_RETURN(int64_t port, cl.GetInt("port", c.port));
  c.port = static_cast<int>(port);
  c.control_endpoint = cl.GetOr("control", c.control_endpoint);
  c.model_name = cl.GetOr("model-name", c.model_name);
  c.tokenizer_dir = cl.GetOr("tokenizer", c.tokenizer_dir);
  c.routing.mode = cl.GetOr("mode", c.routing.mode);
  c.routing.prefill_policy = cl.GetOr("prefill-policy", c.routing.prefill_policy);
  c.routing.decode_policy = cl.GetOr("decode-policy", c.routing.decode_policy);
  c.routing.colocated_policy = cl.GetOr("colocated-policy", c.routing.colocated_policy);
  auto ms = [&](const char* key, std::chrono::milliseconds* out) -> Status {
    PDSERVE_ASSIGN_OR_RETURN(int64_t v, cl.GetInt(key, out->count()));
    *out = std::chrono::milliseconds(v);
    return Status::Ok();
  };
  PDSERVE_RETURN_IF_ERROR(ms("heartbeat-interval-ms", &c.heartbeat_interval));
  PDSERVE_RETURN_IF_ERROR(ms("heartbeat-timeout-ms", &c.heartbeat_timeout));
  PDSERVE_RETURN_IF_ERROR(ms("request-timeout-ms", &c.request_timeout));
  PDSERVE_RETURN_IF_ERROR(ms("first-token-timeout-ms", &c.first_token_timeout));
  PDSERVE_RETURN_IF_ERROR(ms("request-keepalive-ms", &c.request_keepalive));
  PDSERVE_RETURN_IF_ERROR(ms("stall-timeout-ms", &c.stall_timeout));
  PDSERVE_ASSIGN_OR_RETURN(c.max_body_bytes, cl.GetInt("max-body-bytes", c.max_body_bytes));
  PDSERVE_ASSIGN_OR_RETURN(int64_t migrations, cl.GetInt("max-migrations", c.max_migrations));
  if (migrations < 0) return Status::InvalidArgument("--max-migrations must be >= 0");
  c.max_migrations = static_cast<uint32_t>(migrations);
  PDSERVE_ASSIGN_OR_RETURN(int64_t threads, cl.GetInt("http-threads", c.http_threads));
  c.http_threads = static_cast<int>(threads);
  c.ready_file = cl.GetOr("ready-file", c.ready_file);
  c.request_endpoint = cl.GetOr("request-endpoint", c.request_endpoint);
  c.api_keys_file = cl.GetOr("api-keys-file", c.api_keys_file);
  PDSERVE_ASSIGN_OR_RETURN(int64_t max_prompt, cl.GetInt("max-prompt-tokens", c.max_prompt_tokens));
  if (max_prompt < 0 || max_prompt > UINT32_MAX) return Status::InvalidArgument("--max-prompt-tokens out of range");
  c.max_prompt_tokens = static_cast<uint32_t>(max_prompt);
  c.control_curve_secret_key_file = cl.GetOr("control-curve-secret-key-file", c.control_curve_secret_key_file);
  c.control_curve_allowed_clients_file =
      cl.GetOr("control-curve-allowed-clients-file", c.control_curve_allowed_clients_file);
  c.request_curve_secret_key_file = cl.GetOr("request-curve-secret-key-file", c.request_curve_secret_key_file);
  c.request_curve_allowed_clients_file =
      cl.GetOr("request-curve-allowed-clients-file", c.request_curve_allowed_clients_file);
  if (c.routing.mode != "auto" && c.routing.mode != "disaggregated" && c.routing.mode != "colocated")
    return Status::InvalidArgument("--mode must be auto, disaggregated or colocated");
  PDSERVE_RETURN_IF_ERROR(c.Validate());
  return c;
}

}  // namespace

int main(int argc, char** argv) {
  pdserve::RequireCpuFeatures();
  pdserve::services::BlockTerminationSignals();
  auto log = pdserve::GetLogger("router");
  auto config = BuildConfig(argc, argv);
  if (!config.ok()) {
    std::fprintf(stderr, "pdserve-router: %s\n", config.status().ToString().c_str());
    return 2;
  }
  auto server = pdserve::router::RouterServer::Start(std::move(config).value());
  if (!server.ok()) {
    std::fprintf(stderr, "pdserve-router: %s\n", server.status().ToString().c_str());
    return 1;
  }
  int sig = 0;
  while ((sig = pdserve::services::WaitForTerminationSignal(std::chrono::seconds(1))) == 0) {
  }
  log->info("signal {}: shutting down", sig);
  server->reset();
  log->info("stopped");
  return 0;
}
