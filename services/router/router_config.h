// RouterConfig: every option of pdserve-router, with its default (docs/configuration.md lists
// them all). Read from the `router:` section of a YAML file (the cluster file of
// pdserve-launch works as is), then optionally overridden on the command line.
//
// Thread-safety: a value type.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"
#include "services/common/yaml_config.h"

namespace pdserve::router {

struct RoutingConfig {
  // auto: disaggregated when >= 1 prefill and >= 1 decode worker are ready, else colocated.
  std::string mode = "auto";  // auto | disaggregated | colocated
  // kv_aware (prefill, colocated): the fewest prompt tokens left to compute after the worker's
  // predicted prefix-cache hit plus its outstanding tokens (docs/router.md "KV-aware routing").
  std::string prefill_policy = "kv_aware";                    // round_robin | least_outstanding_tokens | kv_aware
  std::string decode_policy = "kv_capacity_aware";            // round_robin | least_outstanding_tokens | kv_capacity_aware
  std::string colocated_policy = "kv_aware";                  // any of the above
  // Decode-side hits: at most this many uncached prompt tokens are computed on a decode worker
  // that holds the rest (0: never; docs/router.md "Decode-side hits").
  int64_t decode_local_prefill_tokens = 256;
  // RouterCoreOptions::pull_min_tokens (docs/prefix-cache.md "Pulls"); 0: no pulls.
  int64_t pull_min_tokens = 128;
};

struct RouterConfig {
  std::string host = "127.0.0.1";  // HTTP listen address (0.0.0.0: every interface)
  int port = 8000;                 // HTTP port; 0 picks a free one (see the ready file)
  // ZeroMQ ROUTER endpoint the router binds and the workers connect to ("tcp://HOST:*" picks a
  // free port; "tcp://0.0.0.0:7000" listens on every interface).
  std::string control_endpoint = "tcp://127.0.0.1:7000";
  // The address clients and workers reach this router on (docs/configuration.md "Addresses"):
  // the host of the endpoints in the ready file and the log. Empty: `host` / the control
  // endpoint's host when they name one address, else the first address of a non-loopback
  // interface (services::AdvertisedHost). Set it when the router listens on a wildcard and
  // the host has several interfaces, or sits behind NAT.
  std::string advertise_host;
  std::string model_name = "pdserve";  // the one model served; workers must register with it
  std::string tokenizer_dir;           // empty: tokenizer::DefaultTokenizerDir()
  // The chat prompt format (tokenizer/chat_template.h). deepseek_v31: DeepSeek-V3.1 /
  // V3.2-Exp's template for every chat request (tools, the thinking switch, V3.1 tool-call
  // markers). deepseek_v3: the tokenizer package's template (no tools). auto: the package
  // template, and V3.1's for requests that offer tools (the package template has no tools
  // block).
  std::string chat_format = "auto";  // auto | deepseek_v3 | deepseek_v31
  RoutingConfig routing;
  std::chrono::milliseconds heartbeat_interval{500};  // told to workers in RegisterAck
  std::chrono::milliseconds heartbeat_timeout{2500};  // silence after which a worker is removed
  std::chrono::milliseconds request_timeout{600000};  // whole request, router side
  std::chrono::milliseconds first_token_timeout{120000};
  uint32_t default_max_tokens = 0;    // when the client sends none; 0: up to the context limit
  int64_t max_body_bytes = 8 << 20;   // larger bodies get 413
  uint32_t max_outstanding_requests = 1024;  // admitted and unfinished; beyond: 429
  // New attempts of one request after its workers failed (docs/router.md "Migration"); past
  // it the request ends with an error. 0: no migration, a worker failure fails its requests.
  uint32_t max_migrations = 3;
  // A stream whose worker produced no token for this long (while still heartbeating: a wedged
  // engine) is migrated as if the worker had failed. 0: off.
  std::chrono::milliseconds stall_timeout{60000};
  // HTTP threads kept ready. A streaming request holds one; the pool starts more on demand, up to
  // max_outstanding_requests + 64 (services/router/http_thread_pool.h).
  int http_threads = 64;
  uint64_t compat_hash = 0;           // 0: adopt the first prefill/decode worker's hash
  std::chrono::milliseconds disconnect_poll{50};  // how often waits check for a gone client
  bool admin_api = true;              // GET /admin/workers, POST /admin/drain
  std::string ready_file;             // when set: JSON {http_port, control_endpoint} after start
  // ZeroMQ request API (docs/request-api.md): a ROUTER socket clients connect a DEALER to;
  // empty: off. "tcp://HOST:*" picks a free port (see the ready file's request_endpoint).
  std::string request_endpoint;
  // Silence towards a client with requests in flight after which the router probes it (and
  // ZMTP heartbeat interval): a client that is gone is noticed within about this long.
  std::chrono::milliseconds request_keepalive{1000};

  // Hardening (docs/operations.md, "Security").
  // File of API keys (one a line, '#' comments): when set, every HTTP request but those to
  // auth_exempt_paths needs `Authorization: Bearer KEY` (else 401). Empty: no authentication.
  std::string api_keys_file;
  std::vector<std::string> auth_exempt_paths = {"/health", "/metrics"};
  uint32_t max_prompt_tokens = 0;     // longer prompts get 400; 0: only the workers' context limit
  uint32_t retry_after_s = 1;         // Retry-After header of 429 replies
  std::chrono::milliseconds http_read_timeout{30000};  // a client sending its request slower: dropped
  // ZeroMQ CURVE on the control socket: the router's secret key file (`pdserve keygen`), and
  // optionally a file of the worker public keys allowed to connect (empty: any worker key).
  std::string control_curve_secret_key_file;
  std::string control_curve_allowed_clients_file;
  // ZeroMQ CURVE on the request API socket (request_endpoint): the router's secret key file,
  // and optionally a file of the client public keys allowed to connect (empty: any client key).
  std::string request_curve_secret_key_file;
  std::string request_curve_allowed_clients_file;

  // Errors: InvalidArgument naming the key.
  static Result<RouterConfig> FromYaml(const services::YamlSection& section);
  // Reads the `router:` section of a file.
  static Result<RouterConfig> LoadFile(const std::string& path);
  Status Validate() const;
};

}  // namespace pdserve::router
