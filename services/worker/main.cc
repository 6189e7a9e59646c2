// pdserve-worker / pdserve-colocated / pdserve-prefill / pdserve-decode: the engine-backed
// worker processes (docs/services.md). One source; the role-named binaries are built with
// PDSERVE_WORKER_ROLE set and accept only their role.
#include "common/cpu_features.h"
#include "common/heap_policy.h"
#include "kernels/isa.h"
#include "services/common/process_util.h"
#include "services/worker/worker_main.h"

int main(int argc, char** argv) {
  pdserve::RequireCpuFeatures();
  pdserve::kernels::RequireIsa();
  pdserve::services::BlockTerminationSignals();
  pdserve::ApplyHeapPolicy(argv[0]);
#ifdef PDSERVE_WORKER_ROLE
  return pdserve::services::worker::RunWorkerMain(argc, argv, pdserve::services::WorkerRole::PDSERVE_WORKER_ROLE);
#else
  return pdserve::services::worker::RunWorkerMain(argc, argv, std::nullopt);
#endif
}
