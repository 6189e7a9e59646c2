// RunWorkerMain: the whole life of an engine-backed worker process (pdserve-colocated,
// pdserve-prefill, pdserve-decode, pdserve-worker --role R share it): parse the config, load the
// engine (and the UCX transport for prefill / decode), serve /metrics, register with the router
// through WorkerAgent, and on SIGINT / SIGTERM drain (up to drain_timeout) and exit.
// REQUIRES: termination signals blocked in every thread (BlockTerminationSignals) first.
// Returns the exit code: 0 after a clean stop, 2 for bad arguments or a failed start, 3 when
// the router refused the registration.
#pragma once

#include <optional>

#include "services/control/control_messages.h"
#include "services/worker/worker_hooks.h"

namespace pdserve::services::worker {

// `hooks`: fault injection for the test-only pdserve-fault-worker; shipped binaries pass none.
int RunWorkerMain(int argc, char** argv, std::optional<WorkerRole> fixed_role, const WorkerHooks& hooks = {});

}  // namespace pdserve::services::worker
