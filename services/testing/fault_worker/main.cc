// pdserve-fault-worker: a TEST-ONLY engine-backed worker with fault injection, for the fault
// tests (services/worker/worker_fault_test.cc, worker_e2e_test.cc). It is pdserve-worker (same
// RunWorkerMain, same flags, --role required) plus:
//
//   --fault-tear-kv-writes N          prefill: the first N KV write batches each silently lose
//                                     their last write (kvtransfer/testing/fault_transport.h),
//                                     so the decode side gets KV that does not match the digest
//                                     the completion notice carries (a transfer torn in flight)
//   --fault-slow-kv-writes MS         prefill: every KV write batch (prompts to decode workers,
//                                     cached prefixes to pullers) waits MS ms before it is
//                                     issued, so a test can kill the worker mid-transfer
//   --fault-fail-prefill-at-layer N   every forward that exports KV fails right after layer N
//                                     was streamed (engine::EngineOptions::layer_fault_hook)
//   --fault-kv-events-freeze-file F   while file F exists, the prefix-cache events this worker
//                                     would send the router are lost: the router's index keeps
//                                     what it knew (blocks evicted since stay in it: stale)
//
// The faults enter through WorkerHooks; nothing of this is compiled into the shipped worker
// binaries or the Docker image.
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <optional>
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

// Takes "--NAME VALUE" (or --NAME=VALUE) out of args; nullopt when absent.
std::optional<std::string> TakeText(std::vector<std::string>& args, const std::string& name) {
  for (size_t i = 0; i < args.size(); ++i) {
    if (args[i] == "--" + name && i + 1 < args.size()) {
      std::string v = args[i + 1];
      args.erase(args.begin() + static_cast<std::ptrdiff_t>(i), args.begin() + static_cast<std::ptrdiff_t>(i + 2));
      return v;
    }
    if (args[i].rfind("--" + name + "=", 0) == 0) {
      std::string v = args[i].substr(name.size() + 3);
      args.erase(args.begin() + static_cast<std::ptrdiff_t>(i));
      return v;
    }
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
  const auto slow = TakeInt(args, "fault-slow-kv-writes");
  const auto freeze_file = TakeText(args, "fault-kv-events-freeze-file");
  pdserve::services::worker::WorkerHooks hooks;
  if ((tear && *tear > 0) || (slow && *slow > 0)) {
    const int n = tear ? static_cast<int>(*tear) : 0;
    const long delay_ms = slow ? *slow : 0;
    hooks.wrap_sender_transport = [n, delay_ms](pdserve::kvtransfer::Transport* real) {
      auto t = std::make_unique<pdserve::kvtransfer::testing::FaultTransport>(real);
      if (n > 0) {
        t->set_drop_writes(n);
        std::fprintf(stderr, "pdserve-fault-worker: TEST FAULT: the first %d KV write batches lose their last write\n", n);
      }
      if (delay_ms > 0) {
        t->set_write_delay(std::chrono::milliseconds(delay_ms));
        std::fprintf(stderr, "pdserve-fault-worker: TEST FAULT: every KV write batch waits %ld ms\n", delay_ms);
      }
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
  if (freeze_file) {
    std::fprintf(stderr, "pdserve-fault-worker: TEST FAULT: KV events are lost while %s exists\n",
                 freeze_file->c_str());
    hooks.kv_events = [path = *freeze_file](pdserve::services::KvEventsMsg* m) {
      std::error_code ec;
      if (!std::filesystem::exists(path, ec)) return;
      m->reset = false;  // nothing goes out (an empty message is not sent)
      m->stored.clear();
      m->removed.clear();
    };
  }
  std::vector<char*> rest;
  for (std::string& a : args) rest.push_back(a.data());
  rest.push_back(nullptr);
  return pdserve::services::worker::RunWorkerMain(static_cast<int>(rest.size() - 1), rest.data(), std::nullopt, hooks);
}
