// pdserve-router: the OpenAI-compatible front of the cluster (docs/router.md).
//
//   pdserve-router [--config FILE] [--host H] [--advertise-host H] [--port P] [--control ENDPOINT]
//                  [--model-name N] [--tokenizer DIR] [--chat-format F]
//                  [--mode auto|disaggregated|colocated]
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
#include "services/common/command_line.h"
#include "services/common/process_util.h"
#include "services/router/router_server.h"

namespace {

using pdserve::Result;
using pdserve::Status;
using pdserve::router::RouterConfig;

const pdserve::services::CommandSpec kSpec{
    "pdserve-router",
    "--config FILE | --port P --control ENDPOINT [options]",
    "The OpenAI-compatible front of a pdserve cluster (docs/router.md): HTTP API, ZeroMQ control\n"
    "plane for the workers, optional ZeroMQ request API. --config reads the `router:` section of a\n"
    "YAML file (the cluster file of pdserve-launch works as is); options override it. With no\n"
    "arguments at all it refuses to start rather than bind default ports. Runs until SIGINT or\n"
    "SIGTERM, then stops cleanly (exit 0).",
    {{"config", "FILE", "YAML file with a `router:` section (docs/configuration.md)"},
     {"host", "HOST", "HTTP listen address (default 127.0.0.1; 0.0.0.0: every interface)"},
     {"advertise-host", "HOST", "address clients and workers reach this router on (default: the listen address, "
                                "or an interface's address when listening on 0.0.0.0)"},
     {"port", "P", "HTTP port (default 8000; 0: a free one, see --ready-file)"},
     {"control", "ENDPOINT", "control endpoint the workers dial (default tcp://127.0.0.1:7000; tcp://HOST:* picks a port)"},
     {"model-name", "NAME", "the model served; workers must register with it (default pdserve)"},
     {"tokenizer", "DIR", "tokenizer.json + tokenizer_config.json (default: the bundled DeepSeek-V3 tokenizer)"},
     {"chat-format", "F", "auto | deepseek_v3 | deepseek_v31 (chat prompt format; default auto)"},
     {"mode", "MODE", "auto | disaggregated | colocated"},
     {"prefill-policy", "P", "kv_aware (default) | round_robin | least_outstanding_tokens"},
     {"decode-policy", "P", "round_robin | least_outstanding_tokens | kv_capacity_aware"},
     {"colocated-policy", "P", "kv_aware (default) | round_robin | least_outstanding_tokens | kv_capacity_aware"},
     {"decode-local-prefill-tokens", "N",
      "a decode worker holding all but <= N prompt tokens computes them itself (default 256; 0: never)"},
     {"pull-min-tokens", "N",
      "a prefill worker pulls a cached prefix from another worker when it gains >= N tokens (default 128; 0: never)"},
     {"heartbeat-interval-ms", "N", "heartbeat period told to workers"},
     {"heartbeat-timeout-ms", "N", "silence after which a worker is removed"},
     {"request-timeout-ms", "N", "whole-request deadline"},
     {"first-token-timeout-ms", "N", "deadline for the first token"},
     {"max-body-bytes", "N", "larger request bodies get 413"},
     {"max-migrations", "N", "new attempts of a request after its workers failed"},
     {"stall-timeout-ms", "N", "a stream silent this long is migrated (0: off)"},
     {"ready-file", "PATH", "write {http_port, control_endpoint, ...} here once serving"},
     {"log-level", "L", "trace | debug | info | warn | error | critical | off"},
     {"http-threads", "N", "HTTP worker threads (a streaming request holds one)"},
     {"request-endpoint", "ENDPOINT", "ZeroMQ request API endpoint (docs/request-api.md; empty: off)"},
     {"request-keepalive-ms", "N", "request API client liveness probe period"},
     {"api-keys-file", "F", "API keys, one a line: requests need Authorization: Bearer KEY"},
     {"max-prompt-tokens", "N", "longer prompts get 400 (0: only the workers' context limit)"},
     {"control-curve-secret-key-file", "F", "CURVE secret key of the control socket"},
     {"control-curve-allowed-clients-file", "F", "worker public keys allowed on the control socket"},
     {"request-curve-secret-key-file", "F", "CURVE secret key of the request API socket"},
     {"request-curve-allowed-clients-file", "F", "client public keys allowed on the request API"}}};

Result<RouterConfig> BuildConfig(const pdserve::services::CommandLine& cl) {
  RouterConfig c;
  if (auto path = cl.Get("config")) {
    PDSERVE_ASSIGN_OR_RETURN(c, RouterConfig::LoadFile(*path));
  }
  if (auto v = cl.Get("log-level")) PDSERVE_RETURN_IF_ERROR(pdserve::SetLogLevel(*v));
  c.host = cl.GetOr("host", c.host);
  c.advertise_host = cl.GetOr("advertise-host", c.advertise_host);
  PDSERVE_ASSIGN_OR_RETURN(int64_t port, cl.GetInt("port", c.port));
  c.port = static_cast<int>(port);
  c.control_endpoint = cl.GetOr("control", c.control_endpoint);
  c.model_name = cl.GetOr("model-name", c.model_name);
  c.tokenizer_dir = cl.GetOr("tokenizer", c.tokenizer_dir);
  c.chat_format = cl.GetOr("chat-format", c.chat_format);
  c.routing.mode = cl.GetOr("mode", c.routing.mode);
  c.routing.prefill_policy = cl.GetOr("prefill-policy", c.routing.prefill_policy);
  c.routing.decode_policy = cl.GetOr("decode-policy", c.routing.decode_policy);
  c.routing.colocated_policy = cl.GetOr("colocated-policy", c.routing.colocated_policy);
  PDSERVE_ASSIGN_OR_RETURN(c.routing.decode_local_prefill_tokens,
                           cl.GetInt("decode-local-prefill-tokens", c.routing.decode_local_prefill_tokens, 0, 1 << 24));
  PDSERVE_ASSIGN_OR_RETURN(c.routing.pull_min_tokens, cl.GetInt("pull-min-tokens", c.routing.pull_min_tokens, 0, 1 << 24));
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
  pdserve::services::CommandLine cl;
  if (auto exit_code = pdserve::services::ParseCommandLineOrExit(argc, argv, kSpec, &cl)) return *exit_code;
  if (cl.empty()) {
    // No silent default ports: an operator who typed the bare name gets the usage instead.
    std::fprintf(stderr, "%s\npdserve-router: give --config FILE or the listen options (--port, --control)\n",
                 pdserve::services::FormatUsage(kSpec).c_str());
    return 2;
  }
  if (pdserve::Status s = pdserve::InitLogLevelFromEnv(); !s.ok()) return pdserve::services::ReportCommandError(kSpec, s);
  auto log = pdserve::GetLogger("router");
  auto config = BuildConfig(cl);
  if (!config.ok()) return pdserve::services::ReportCommandError(kSpec, config.status());
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
