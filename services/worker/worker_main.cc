#include "services/worker/worker_main.h"

#include <unistd.h>

#include <cstdio>
#include <string>

#include <nlohmann/json.hpp>
#include <prometheus/gauge.h>

#include "common/logging.h"
#include "common/mapped_file.h"
#include "kernels/isa.h"
#include "services/common/metrics.h"
#include "services/common/process_util.h"
#include "services/worker/agent/worker_agent.h"
#include "services/worker/engine_worker.h"
#include "services/worker/model_instance.h"
#include "services/worker/worker_config.h"

namespace pdserve::services::worker {

int RunWorkerMain(int argc, char** argv, std::optional<WorkerRole> fixed_role, const WorkerHooks& hooks) {
  const std::string name = fixed_role ? std::string("pdserve-") + WorkerRoleName(*fixed_role) : "pdserve-worker";
  const CommandSpec& spec = WorkerCommandSpec(fixed_role);
  auto fail = [&spec](const Status& s) {
    ReportCommandError(spec, s);
    return 2;
  };
  try {
    CommandLine cl;
    if (auto exit_code = ParseCommandLineOrExit(argc, argv, spec, &cl)) return *exit_code;
    if (Status s = InitLogLevelFromEnv(); !s.ok()) return fail(s);
    auto config = WorkerConfigFromCommandLine(cl, fixed_role);
    if (!config.ok()) return fail(config.status());
    if (Status s = ResolveWorkerNetwork(&config.value()); !s.ok()) return fail(s);
    if (!config.value().log_level.empty()) {
      if (Status s = SetLogLevel(config.value().log_level); !s.ok()) return fail(s);
    }
    auto log = GetLogger("worker");
    // Key files are checked before the model loads: a typo fails in milliseconds.
    CurveOptions curve;
    if (!config.value().curve_secret_key_file.empty()) {
      auto loaded = LoadClientCurveOptions(config.value().curve_secret_key_file, config.value().router_public_key_file);
      if (!loaded.ok()) return fail(loaded.status());
      curve = std::move(loaded).value();
    }
    // Then the model (under a plan: collectively, on every rank of the instance; a rank that
    // exits early makes mpirun end the whole instance).
    auto instance = ModelInstance::Load(config.value(), &argc, &argv);
    if (!instance.ok()) return fail(instance.status());
    ModelInstance* in = instance.value().get();
    if (!in->serves()) {
      // A follower: no router, no metrics; it replays its unit leader's steps. Termination
      // signals stay blocked here: the leader's stop vote ends the loop.
      log->info("{} follower rank up ({})", name, in->Describe());
      const Status s = in->RunFollower();
      if (!s.ok()) return fail(s);
      log->info("{} follower rank stopped", name);
      return 0;
    }
    const WorkerServiceConfig c = ForDpRank(config.value(), in->dp_rank(), in->dp_size());

    auto registry = std::make_shared<prometheus::Registry>();
    // Which kernel variants this process runs (kernels/isa.h): a constant series for dashboards
    // and side-by-side runs (PDSERVE_ISA).
    prometheus::BuildGauge()
        .Name("pdserve_worker_kernels_isa_info")
        .Help("The kernels' ISA level in use (isa) and the best one the CPU has (detected); value 1")
        .Register(*registry)
        .Add({{"worker", c.worker_id},
              {"isa", kernels::IsaName(kernels::ActiveIsa())},
              {"detected", kernels::IsaName(kernels::DetectedIsa())}})
        .Set(1);
    auto exposer = MetricsExposer::Start(c.metrics_host + ":" + std::to_string(c.metrics_port), registry);
    if (!exposer.ok()) return fail(exposer.status());
    auto worker = EngineWorker::Create(c, registry, in, hooks);
    if (!worker.ok()) return fail(worker.status());
    EngineWorker* w = worker.value().get();

    WorkerAgentOptions ao;
    ao.router_address = c.router;
    ao.worker_id = c.worker_id;
    ao.role = c.role;
    ao.model_name = c.model_name;
    ao.compat_hash = w->compat_hash();
    ao.vocab_size = static_cast<uint32_t>(in->model().config().vocab_size);
    ao.kv_namespace = w->kv_namespace();
    ao.http_address = AdvertisedMetricsAddress(c, exposer.value()->port());
    ao.transfer_address = w->transfer_address();
    ao.capacity = w->Capacity();
    if (in->group()) {
      ao.instance_id = config.value().worker_id;
      ao.dp_rank = static_cast<uint32_t>(in->dp_rank());
    }
    ao.register_retry = c.register_retry;
    ao.metrics_registry = registry;
    ao.curve = std::move(curve);
    auto agent = WorkerAgent::Start(ao, w);
    if (!agent.ok()) return fail(agent.status());
    WorkerAgent* a = agent.value().get();
    w->SetAgent(a);
    if (!c.ready_file.empty()) {
      nlohmann::json ready = {{"metrics_port", exposer.value()->port()}, {"pid", getpid()}};
      Status s = WriteStringToFile(c.ready_file, ready.dump());
      if (!s.ok()) return fail(s);
    }
    log->info("{} {} up: router {}, metrics on http://{}/metrics{}, kernels {} ({})", name, c.worker_id, c.router,
              ao.http_address,
              c.ucx_net_devices.empty() ? std::string() : ", UCX on " + c.ucx_net_devices,
              kernels::IsaName(kernels::ActiveIsa()),
              kernels::IsaFeatures(kernels::ActiveIsa()));

    int exit_code = 0;
    while (true) {
      const int sig = WaitForTerminationSignal(std::chrono::milliseconds(100));
      const auto state = a->state();
      if (state == WorkerAgent::State::kRefused) {
        log->error("the router refused this worker: {}", a->refusal().ToString());
        std::fprintf(stderr, "%s: the router refused this worker: %s\n", spec.program.c_str(),
                     a->refusal().ToString().c_str());
        exit_code = 3;
        break;
      }
      if (state == WorkerAgent::State::kDeregistered) break;  // drained on the router's request
      if (Status broken = w->failure(); !broken.ok()) {
        // The instance's rank group broke (a rank failed): this rank cannot step any more.
        log->error("the multi-rank instance failed: {}", broken.ToString());
        exit_code = 4;
        break;
      }
      if (sig != 0) {
        log->info("signal {}: draining (up to {} ms)", sig, c.drain_timeout.count());
        a->BeginDrain(c.drain_timeout);
        a->WaitForExit(c.drain_timeout + std::chrono::seconds(6));
        break;
      }
    }
    // The agent first (no handler call after its destructor), then the engine and transport.
    agent.value().reset();
    worker.value().reset();
    log->info("{} {} stopped", name, c.worker_id);
    return exit_code;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: unexpected exception: %s\n", name.c_str(), e.what());
    return 2;
  }
}

}  // namespace pdserve::services::worker
