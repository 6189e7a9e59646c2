// GET /v1/workers: the router's view of its workers for operators and tooling -- role, state
// and health, load (the worker's last heartbeat plus the router's own accounting), data-parallel
// ranks (count and per-rank load when the worker reports them), addresses, capacity.
//
//   {"object": "list", "data": [{"id", "role", "state": "ready"|"draining",
//     "health": "healthy"|"late" (no heartbeat for more than 2 intervals),
//     "last_heartbeat_ms_ago", "uptime_s",
//     "address": {"metrics": "host:port", "transfer": bool},
//     "load": {"running", "waiting", "queued_tokens", "kv_blocks_free", "kv_blocks_total",
//              "outstanding_requests", "outstanding_tokens"},
//     "dp_ranks": N, "ranks": [{"dp_rank", "running", "waiting", "kv_blocks_free"}],
//     "capacity": {"max_context_tokens", "max_batch", "block_tokens"}, "model"}]}
//
// Thread-safety: a pure function of a snapshot (RouterCore::WorkerSnapshot).
#pragma once

#include <chrono>
#include <vector>

#include <nlohmann/json.hpp>

#include "services/router/worker_registry.h"

namespace pdserve::router {

nlohmann::json WorkersView(const std::vector<WorkerEntry>& workers, std::chrono::steady_clock::time_point now,
                           std::chrono::milliseconds heartbeat_interval);

}  // namespace pdserve::router
