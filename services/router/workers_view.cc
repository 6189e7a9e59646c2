#include "services/router/workers_view.h"

namespace pdserve::router {

nlohmann::json WorkersView(const std::vector<WorkerEntry>& workers, std::chrono::steady_clock::time_point now,
                           std::chrono::milliseconds heartbeat_interval) {
  using std::chrono::duration_cast;
  using std::chrono::milliseconds;
  nlohmann::json data = nlohmann::json::array();
  for (const WorkerEntry& w : workers) {
    const auto silent = duration_cast<milliseconds>(now - w.last_seen);
    data.push_back({
        {"id", w.id},
        {"role", services::WorkerRoleName(w.role)},
        {"state", w.draining ? "draining" : "ready"},
        {"health", silent > 2 * heartbeat_interval ? "late" : "healthy"},
        {"last_heartbeat_ms_ago", silent.count()},
        {"uptime_s", duration_cast<std::chrono::seconds>(now - w.registered_at).count()},
        {"address", {{"metrics", w.http_address}, {"transfer", !w.transfer_address.empty()}}},
        {"load",
         {{"running", w.load.running},
          {"waiting", w.load.waiting},
          {"queued_tokens", w.load.queued_tokens},
          {"kv_blocks_free", w.load.kv_blocks_free},
          {"kv_blocks_total", w.load.kv_blocks_total},
          {"outstanding_requests", w.outstanding_requests},
          {"outstanding_tokens", w.outstanding_tokens},
          // kv_aware's estimate (prefill_pace.h): prompt tokens still to compute, and the pace
          // learned from the prefills served (0: none yet)
          {"prefill_tokens_left_estimate", w.prefill_pace.TokensLeft(now)},
          {"prefill_tokens_per_s", w.prefill_pace.tokens_per_second()}}},
        {"instance", w.instance_id},
        {"dp_rank", w.dp_rank},
        {"dp_ranks", w.capacity.dp_ranks},
        {"capacity",
         {{"max_context_tokens", w.capacity.max_context_tokens},
          {"max_batch", w.capacity.max_batch},
          {"block_tokens", w.capacity.block_tokens}}},
        {"model", w.model_name},
        {"prefix_cache", {{"blocks", w.kv_index_blocks}}},
    });
  }
  return {{"object", "list"}, {"data", std::move(data)}};
}

}  // namespace pdserve::router
