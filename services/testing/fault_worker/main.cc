// pdserve-fault-worker: a TEST-ONLY engine-backed worker with fault injection, for the fault
// tests (services/worker/worker_fault_test.cc, worker_e2e_test.cc). It is pdserve-worker (same
// RunWorkerMain, same flags, --role required) plus:
//
//   --fault-tear-kv-writes N          prefill: the first N KV write batches each silently lose
//                                     their last write (kvtransfer/testing/fault_transport.h),
//                                     so the decode side gets KV that does not match the digest
//                                     the completion notice carries (a transfer torn in flight)
//   --fault-fail-prefill-at-layer N   every forward that exports KV fails right after layer N
//                                     was streamed (engine::EngineOptions::layer_fault_hook)
//   --fault-drop-kv-removals 1        the prefix-cache events sent to the router never say a
//                                     block left the cache, so the router's index keeps blocks
//                                     this worker evicted (a stale index)
//
// The faults enter through WorkerHooks; nothing of this is compiled into the shipped worker
// binaries or the Docker image.
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "common/cpu_features.h"
#include "kernels/isa.h"
#include "kvtransfer/testing/fault_transport.h"
#include "services/common/process_util.h"
#include "services/worker/worker_main.h"

namespace {

// Takes "--NAME N" (or --NAME=N) out of args; nullopt when absent. Exits 2 on a bad value.
std::optional<long> TakeInt(std::vector<std::string>& args, const std::string& name) {
  for (size_t i = 0; i < args.size(); ++i) {
    std::string value;
    size_t n = 0;
    if (args[i] == "--" + name && i + 1 < args.size()) {
      value = args[i + 1];
      n = 2;
    } else if (args[i].rfind("--" + name + "=", 0) == 0) {
      value = args[i].substr(name.size() + 3);
      n = 1;
    } else {
      continue;
    }
    char* end = nullptr;
    const long v = std::strtol(value.c_str(), &end, 10);
    if (value.empty() || *end != '\0' || v < 0) {
      std::fprintf(stderr, "pdserve-fault-worker: --%s wants an integer >= 0, got '%s'\n", name.c_str(), value.c_str());
      std::exit(2);
    }
    args.erase(args.begin() + static_cast<std::ptrdiff_t>(i), args.begin() + static_cast<std::ptrdiff_t>(i + n));
    return v;
  }
  return std::nullopt;
}

}  // namespace

int main(int argc, char** argv) {
  pdserve::RequireCpuFeatures();
  pdserve::kernels::RequireIsa();
  pdserve::services::BlockTerminationSignals();
  std::vector<std::string> args(argv, argv + argc);
  const auto tear = TakeInt(args, "fault-tear-kv-writes");
  const auto fail_at = TakeInt(args, "fault-fail-prefill-at-layer");
  const auto drop_removals = TakeInt(args, "fault-drop-kv-removals");
  pdserve::services::worker::WorkerHooks hooks;
  if (tear && *tear > 0) {
    const int n = static_cast<int>(*tear);
    hooks.wrap_sender_transport = [n](pdserve::kvtransfer::Transport* real) {
      auto t = std::make_unique<pdserve::kvtransfer::testing::FaultTransport>(real);
      t->set_drop_writes(n);
      std::fprintf(stderr, "pdserve-fault-worker: TEST FAULT: the first %d KV write batches lose their last write\n", n);
      return std::unique_ptr<pdserve::kvtransfer::Transport>(std::move(t));
    };
  }
  if (fail_at) {
    const long layer = *fail_at;
    hooks.layer_fault = [layer](int64_t at) {
      return at == layer ? pdserve::Status::Internal("injected test fault: forward failed after layer " +
                                                     std::to_string(at))
                         : pdserve::Status::Ok();
    };
  }
  if (drop_removals && *drop_removals > 0) {
    std::fprintf(stderr, "pdserve-fault-worker: TEST FAULT: KV events never report a removed block\n");
    hooks.kv_events = [](pdserve::services::KvEventsMsg* m) { m->removed.clear(); };
  }
  std::vector<char*> rest;
  for (std::string& a : args) rest.push_back(a.data());
  rest.push_back(nullptr);
  return pdserve::services::worker::RunWorkerMain(static_cast<int>(rest.size() - 1), rest.data(), std::nullopt, hooks);
}
