// WorkerHooks: the only way fault injection reaches an engine-backed worker. A shipped binary
// passes none (every hook empty); the test-only pdserve-fault-worker (services/testing/) builds
// them from its own flags. No test flag or test type is compiled into pdserve-prefill /
// -decode / -colocated.
//
// Thread-safety: value type; each hook is called on the thread documented with it.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>

#include "common/status.h"
#include "kvtransfer/transport.h"
#include "services/control/control_messages.h"

namespace pdserve::services::worker {

struct WorkerHooks {
  // Prefill: the transport its KvSender writes through, wrapping the real one (borrowed; it
  // outlives the wrapper). Called once at start-up. Empty: the real transport.
  std::function<std::unique_ptr<kvtransfer::Transport>(kvtransfer::Transport* real)> wrap_sender_transport;
  // Becomes engine::EngineOptions::layer_fault_hook: called on the engine's step thread after
  // each layer of a forward that exports KV; a non-OK status fails that forward.
  std::function<Status(int64_t layer)> layer_fault;
  // Edits each batch of prefix-cache events before the agent sends it (e.g. drops the
  // removals, so the router's index goes stale). Called on the agent's thread.
  std::function<void(KvEventsMsg*)> kv_events;
};

}  // namespace pdserve::services::worker
