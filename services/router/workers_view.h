// GET /v1/workers: the router's view of its workers for operators and tooling -- role, state
// and health, load (the worker's last heartbeat plus the router's own accounting), its place in
// a multi-rank instance (every DP rank of a decode instance is listed as a worker of its own,
// with its own load), addresses, capacity.
//
//   {"object": "list", "data": [{"id", "role", "state": "ready"|"draining",
//     "health": "healthy"|"late" (no heartbeat for more than 2 intervals),
//     "last_heartbeat_ms_ago", "uptime_s",
//     "address": {"metrics": "host:port", "transfer": bool},
//     "load": {"running", "waiting", "queued_tokens", "kv_blocks_free", "kv_blocks_total",
//              "outstanding_requests", "outstanding_tokens"},
//     "instance": "" (one-process worker) | the instance id, "dp_rank": r, "dp_ranks": N,
//     "capacity": {"max_context_tokens", "max_batch", "block_tokens"}, "model",
//     "prefix_cache": {"blocks": the cached blocks the router's index holds for it (kv_index.h;
//                      0 when the worker publishes no KV events)}}]}
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
