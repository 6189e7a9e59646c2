// pdserve-echo-worker: a PROTOCOL TEST WORKER for the control plane (echo_engine.h). It speaks
// the real worker protocol (WorkerAgent over ZeroMQ) with a deterministic echo "engine" instead
// of a model. Used by the router / launcher tests and bench/router; never part of a production
// topology.
//
// Options: pdserve-echo-worker --help.
#include <cstdio>

#include <nlohmann/json.hpp>

#include "common/cpu_features.h"
#include "common/logging.h"
#include "common/mapped_file.h"
#include "services/common/command_line.h"
#include "services/common/metrics.h"
#include "services/common/net_util.h"
#include "services/common/process_util.h"
#include "services/worker/agent/worker_agent.h"
#include "services/testing/echo_worker/echo_engine.h"

namespace {
using namespace pdserve;
using namespace pdserve::services;

const CommandSpec kSpec{
    "pdserve-echo-worker",
    "--router ENDPOINT [--worker-id ID] [--role ROLE] [options]",
    "A PROTOCOL TEST WORKER: speaks the real worker protocol with a deterministic echo engine\n"
    "instead of a model (router, launcher and control-plane tests). Exit: 0 after SIGINT/SIGTERM or\n"
    "a router-requested drain; 3 when the router refuses the registration; 2 for bad arguments.",
    {{"router", "ENDPOINT", "the router's control endpoint (required)"},
     {"worker-id", "ID", "worker name (default echo-0)"},
     {"role", "ROLE", "colocated | prefill | decode"},
     {"model-name", "NAME", "model name to register with (default pdserve)"},
     {"token-delay-us", "N", "delay per generated token"},
     {"prefill-us-per-token", "N", "prefill delay per prompt token"},
     {"max-context", "N", "context limit reported to the router"},
     {"kv-blocks", "N", "KV blocks reported"},
     {"block-tokens", "N", "tokens per KV block"},
     {"max-batch", "N", "concurrent requests"},
     {"compat-hash", "N", "compatibility hash to register with"},
     {"vocab-size", "N", "vocabulary size to register with (0: unknown)"},
     {"metrics-host", "HOST", "metrics listen address"},
     {"advertise-host", "HOST", "address registered for the metrics (default: the listen address, or an "
                                "interface's address when it is 0.0.0.0)"},
     {"metrics-port", "P", "metrics port (0: a free one)"},
     {"ready-file", "PATH", "write {metrics_port, pid} here once up"},
     {"drain-timeout-ms", "N", "drain time on SIGTERM"},
     {"register-retry-ms", "N", "first registration retry delay"},
     {"stall-after", "N", "stop producing tokens after N (stall tests)"},
     {"log-level", "L", "trace | debug | info | warn | error | critical | off"},
     {"curve-secret-key-file", "F", "CURVE secret key (with --router-public-key-file)"},
     {"router-public-key-file", "F", "the router's CURVE public key"}}};

int Run(int argc, char** argv) {
  CommandLine parsed;
  if (auto exit_code = ParseCommandLineOrExit(argc, argv, kSpec, &parsed)) return *exit_code;
  const CommandLine* cl = &parsed;
  auto fail = [](const Status& s) {
    ReportCommandError(kSpec, s);
    return 2;
  };
  if (Status s = InitLogLevelFromEnv(); !s.ok()) return fail(s);
  if (auto v = cl->Get("log-level")) {
    if (Status s = SetLogLevel(*v); !s.ok()) return fail(s);
  }
  if (!cl->Has("router")) return fail(Status::InvalidArgument("--router is required: the router's control endpoint"));
  auto log = GetLogger("echo");
  EchoOptions eo;
  WorkerAgentOptions ao;
  auto role = ParseWorkerRole(cl->GetOr("role", "colocated"));
  if (!role.ok()) return fail(role.status());
  eo.role = ao.role = role.value();
  eo.worker_id = ao.worker_id = cl->GetOr("worker-id", "echo-0");
  ao.router_address = *cl->Get("router");
  ao.model_name = cl->GetOr("model-name", "pdserve");
  if (cl->Has("curve-secret-key-file") || cl->Has("router-public-key-file")) {
    auto curve = LoadClientCurveOptions(cl->GetOr("curve-secret-key-file", ""), cl->GetOr("router-public-key-file", ""));
    if (!curve.ok()) return fail(curve.status());
    ao.curve = std::move(curve).value();
  }
  struct IntOpt {
    const char* key;
    int64_t def;
    int64_t* out;
  };
  int64_t token_delay = 0, prefill_us = 0, max_context = eo.max_context, kv_blocks = eo.kv_blocks,
          block_tokens = eo.block_tokens, max_batch = eo.max_batch, compat = 0x6563686f, metrics_port = 0,
          drain_ms = 10000, retry_ms = 250, stall_after = 0, vocab_size = 0;
  for (IntOpt o : {IntOpt{"token-delay-us", 0, &token_delay}, {"prefill-us-per-token", 0, &prefill_us},
                   {"max-context", max_context, &max_context}, {"kv-blocks", kv_blocks, &kv_blocks},
                   {"block-tokens", block_tokens, &block_tokens}, {"max-batch", max_batch, &max_batch},
                   {"compat-hash", compat, &compat}, {"metrics-port", 0, &metrics_port},
                   {"drain-timeout-ms", drain_ms, &drain_ms}, {"register-retry-ms", retry_ms, &retry_ms},
                   {"stall-after", 0, &stall_after}, {"vocab-size", 0, &vocab_size}}) {
    auto v = cl->GetInt(o.key, o.def);
    if (!v.ok()) return fail(v.status());
    if (v.value() < 0) return fail(Status::InvalidArgument(std::string("--") + o.key + " must be >= 0"));
    *o.out = v.value();
  }
  if (block_tokens == 0 || max_context < 2 || max_batch == 0)
    return fail(Status::InvalidArgument("--block-tokens, --max-batch must be > 0 and --max-context >= 2"));
  eo.token_delay = std::chrono::microseconds(token_delay);
  eo.prefill_per_token = std::chrono::microseconds(prefill_us);
  eo.max_context = static_cast<uint32_t>(max_context);
  eo.kv_blocks = static_cast<uint32_t>(kv_blocks);
  eo.block_tokens = static_cast<uint32_t>(block_tokens);
  eo.max_batch = static_cast<uint32_t>(max_batch);
  eo.stall_after = static_cast<uint32_t>(stall_after);
  ao.compat_hash = static_cast<uint64_t>(compat);
  ao.vocab_size = static_cast<uint32_t>(vocab_size);
  ao.register_retry = std::chrono::milliseconds(std::max<int64_t>(1, retry_ms));

  auto registry = std::make_shared<prometheus::Registry>();
  const std::string metrics_host = cl->GetOr("metrics-host", "127.0.0.1");
  auto exposer = MetricsExposer::Start(metrics_host + ":" + std::to_string(metrics_port), registry);
  if (!exposer.ok()) return fail(exposer.status());
  ao.http_address = AdvertisedHost(metrics_host, cl->GetOr("advertise-host", "")) + ":" +
                    std::to_string(exposer.value()->port());
  ao.metrics_registry = registry;

  EchoEngine engine(eo);
  ao.capacity = engine.Capacity();
  auto agent = WorkerAgent::Start(ao, &engine);
  if (!agent.ok()) return fail(agent.status());
  WorkerAgent* a = agent.value().get();
  engine.SetSinks([a](TokenEventMsg ev) { a->SendTokenEvent(std::move(ev)); },
                  [a](KvReservedMsg kv) { a->SendKvReserved(std::move(kv)); });
  if (auto path = cl->Get("ready-file")) {
    nlohmann::json ready = {{"metrics_port", exposer.value()->port()}, {"pid", getpid()}};
    Status s = WriteStringToFile(*path, ready.dump());
    if (!s.ok()) return fail(s);
  }
  log->info("echo worker {} ({}) up: PROTOCOL TEST WORKER, not a model; metrics on {}", eo.worker_id,
            WorkerRoleName(eo.role), exposer.value()->address());

  int exit_code = 0;
  while (true) {
    const int sig = WaitForTerminationSignal(std::chrono::milliseconds(100));
    const auto state = a->state();
    if (state == WorkerAgent::State::kRefused) {
      log->error("registration refused: {}", a->refusal().ToString());
      exit_code = 3;
      break;
    }
    if (state == WorkerAgent::State::kDeregistered) break;  // drained on the router's request
    if (sig != 0) {
      log->info("signal {}: draining (up to {} ms)", sig, drain_ms);
      a->BeginDrain(std::chrono::milliseconds(drain_ms));
      a->WaitForExit(std::chrono::milliseconds(drain_ms + 6000));
      break;
    }
  }
  agent.value().reset();  // deregisters if still registered; no handler call after this
  log->info("echo worker {} stopped", eo.worker_id);
  return exit_code;
}

}  // namespace

int main(int argc, char** argv) {
  pdserve::RequireCpuFeatures();
  pdserve::services::BlockTerminationSignals();
  return Run(argc, argv);
}
