#include "services/router/worker_registry.h"

#include <algorithm>

#include <fmt/format.h>

namespace pdserve::router {

using services::WorkerRole;

namespace {
bool Pairs(WorkerRole r) { return r == WorkerRole::kPrefill || r == WorkerRole::kDecode; }
int64_t BlocksFor(int64_t tokens, uint32_t block_tokens) {
  return block_tokens == 0 ? 0 : (tokens + block_tokens - 1) / block_tokens;
}
}  // namespace

uint64_t WorkerRegistry::CurrentCompatHash() const {
  if (options_.compat_hash != 0) return options_.compat_hash;
  for (const auto& [peer, e] : by_peer_)
    if (Pairs(e->role)) return e->compat_hash;
  return 0;
}

RegisterOutcome WorkerRegistry::Register(const std::string& peer, const services::RegisterMsg& msg,
                                         Clock::time_point now) {
  RegisterOutcome out;
  if (msg.protocol_version != services::kControlProtocolVersion) {
    out.refusal = Status::FailedPrecondition(fmt::format("control protocol version {} (router speaks {})",
                                                         msg.protocol_version, services::kControlProtocolVersion));
    return out;
  }
  if (msg.model_name != options_.model_name) {
    out.refusal = Status::FailedPrecondition(
        fmt::format("worker serves model '{}', this router serves '{}'", msg.model_name, options_.model_name));
    return out;
  }
  if (msg.vocab_size != 0 && options_.tokenizer_vocab_size != 0 && msg.vocab_size < options_.tokenizer_vocab_size) {
    out.refusal = Status::FailedPrecondition(fmt::format(
        "the model's vocabulary ({} tokens) is smaller than the router's tokenizer ({} tokens): prompts would "
        "hold token ids the model has no embedding for. Serve a model made for this tokenizer (e.g. "
        "`pdserve make-model --vocab 129280`, DeepSeek-V3's size) or point the router at the model's own "
        "tokenizer (router.tokenizer_dir)",
        msg.vocab_size, options_.tokenizer_vocab_size));
    return out;
  }
  if (msg.capacity.max_context_tokens < 2) {
    out.refusal = Status::InvalidArgument("capacity.maxContextTokens must be >= 2");
    return out;
  }
  // A retry of a registration we already accepted: keep the entry (and its requests).
  if (auto* e = FindByPeer(peer); e && e->id == msg.worker_id && e->incarnation == msg.incarnation) {
    e->last_seen = now;
    out.duplicate = true;
    return out;
  }
  // Replacement of the same worker id (restart, or a re-registration after we forgot it).
  if (auto it = peer_by_id_.find(msg.worker_id); it != peer_by_id_.end())
    if (auto old = Remove(it->second)) out.replaced.push_back(std::move(*old));
  if (auto* e = FindByPeer(peer))  // this peer carried another worker id: drop that one too
    if (auto other = Remove(e->peer)) out.replaced.push_back(std::move(*other));
  if (Pairs(msg.role)) {
    const uint64_t want = CurrentCompatHash();
    if (want != 0 && msg.compat_hash != want) {
      out.refusal = Status::FailedPrecondition(fmt::format(
          "compatibility hash {:016x} differs from the cluster's {:016x}: this worker's model or KV layout "
          "cannot pair with the registered prefill/decode workers",
          msg.compat_hash, want));
      return out;
    }
  }
  auto e = std::make_unique<WorkerEntry>();
  e->id = msg.worker_id;
  e->peer = peer;
  e->registration = next_registration_++;
  e->role = msg.role;
  e->incarnation = msg.incarnation;
  e->http_address = msg.http_address;
  e->transfer_address = msg.transfer_address;
  e->model_name = msg.model_name;
  e->capacity = msg.capacity;
  e->instance_id = msg.instance_id;
  e->dp_rank = msg.dp_rank;
  e->compat_hash = msg.compat_hash;
  e->kv_namespace = msg.kv_namespace;
  e->load.kv_blocks_free = msg.capacity.kv_blocks_free;
  e->load.kv_blocks_total = msg.capacity.kv_blocks_total;
  e->kv_free_estimate = msg.capacity.kv_blocks_free;
  e->registered_at = now;
  e->last_seen = now;
  peer_by_id_[e->id] = peer;
  by_peer_[peer] = std::move(e);
  return out;
}

bool WorkerRegistry::Heartbeat(const std::string& peer, const services::HeartbeatMsg& msg, Clock::time_point now) {
  WorkerEntry* e = FindByPeer(peer);
  if (!e) return false;
  e->load = msg.load;
  e->draining = msg.draining || e->drain_requested;
  e->kv_free_estimate = msg.load.kv_blocks_free;
  e->last_seen = now;
  return true;
}

bool WorkerRegistry::Touch(const std::string& peer, Clock::time_point now) {
  WorkerEntry* e = FindByPeer(peer);
  if (!e) return false;
  e->last_seen = now;
  return true;
}

std::optional<WorkerEntry> WorkerRegistry::Remove(const std::string& peer) {
  auto it = by_peer_.find(peer);
  if (it == by_peer_.end()) return std::nullopt;
  WorkerEntry out = std::move(*it->second);
  by_peer_.erase(it);
  if (auto id = peer_by_id_.find(out.id); id != peer_by_id_.end() && id->second == peer) peer_by_id_.erase(id);
  return out;
}

void WorkerRegistry::Forgive(Clock::duration stalled, Clock::time_point now) {
  for (auto& [peer, e] : by_peer_) e->last_seen = std::min(e->last_seen + stalled, std::max(e->last_seen, now));
}

std::vector<WorkerEntry> WorkerRegistry::Expire(Clock::time_point now) {
  std::vector<std::string> dead;
  for (const auto& [peer, e] : by_peer_)
    if (now - e->last_seen > options_.heartbeat_timeout) dead.push_back(peer);
  std::vector<WorkerEntry> out;
  for (const auto& p : dead) out.push_back(*Remove(p));
  return out;
}

WorkerEntry* WorkerRegistry::FindByPeer(const std::string& peer) {
  auto it = by_peer_.find(peer);
  return it == by_peer_.end() ? nullptr : it->second.get();
}

WorkerEntry* WorkerRegistry::FindById(const std::string& id) {
  auto it = peer_by_id_.find(id);
  return it == peer_by_id_.end() ? nullptr : FindByPeer(it->second);
}

Result<WorkerChoice> WorkerRegistry::Choose(WorkerRole role, RoutingPolicy policy, uint32_t prompt_tokens,
                                            std::optional<uint32_t> max_tokens, uint32_t default_max_tokens,
                                            bool produces_output, uint64_t* cursor, const std::string& prefer,
                                            const PredictHitFn& predict_hit, Clock::time_point now) {
  std::vector<WorkerEntry*> eligible;
  std::vector<WorkerChoice> choices;
  std::vector<RoutingCandidate> candidates;
  bool any_ready = false;
  uint32_t largest_context = 0;
  for (auto& [peer, e] : by_peer_) {
    if (e->role != role || e->draining) continue;
    any_ready = true;
    const uint32_t ctx = e->capacity.max_context_tokens;
    largest_context = std::max(largest_context, ctx);
    if (prompt_tokens >= ctx) continue;
    WorkerChoice c;
    c.worker = e.get();
    const uint32_t room = ctx - prompt_tokens;
    if (produces_output) {
      if (max_tokens && *max_tokens > room) continue;
      c.max_tokens = max_tokens ? *max_tokens : (default_max_tokens ? std::min(default_max_tokens, room) : room);
    }
    const uint32_t bt = e->capacity.block_tokens;
    RoutingCandidate rc;
    rc.outstanding_tokens = e->outstanding_tokens;
    rc.computed_estimate_tokens = e->prefill_pace.open_tokens() - e->prefill_pace.TokensLeft(now);
    rc.kv_blocks_free = e->kv_free_estimate;
    rc.kv_blocks_total = e->load.kv_blocks_total;
    rc.blocks_for_prompt = BlocksFor(prompt_tokens, bt);
    rc.blocks_for_request = BlocksFor(static_cast<int64_t>(prompt_tokens) + c.max_tokens, bt);
    c.blocks = produces_output ? rc.blocks_for_request : rc.blocks_for_prompt;
    rc.prompt_tokens = prompt_tokens;
    if (predict_hit) {
      const PredictedHit hit = predict_hit(*e);
      rc.predicted_hit_tokens = c.predicted_hit_tokens = hit.tokens;
      rc.pulled_tokens = hit.pulled_tokens;
    }
    choices.push_back(c);
    candidates.push_back(rc);
  }
  if (!any_ready) return Status::Unavailable(fmt::format("no ready {} worker", services::WorkerRoleName(role)));
  if (choices.empty()) {
    const uint32_t asked = prompt_tokens + (max_tokens ? *max_tokens : 0);
    return Status::InvalidArgument(fmt::format(
        "This model's maximum context length is {} tokens. However, you requested {} tokens ({} in the prompt, {} "
        "for the completion). Please reduce the length of the prompt or the completion.",
        largest_context, asked, prompt_tokens, max_tokens ? *max_tokens : 0));
  }
  if (!prefer.empty()) {
    for (size_t i = 0; i < choices.size(); ++i) {
      if (choices[i].worker->peer != prefer) continue;
      const RoutingCandidate& rc = candidates[i];
      // Without a known pool (no heartbeat yet) there is no estimate to refuse on.
      if (rc.kv_blocks_total == 0 || rc.kv_blocks_free >= choices[i].blocks) return choices[i];
    }
  }
  const int idx = ChooseWorker(policy, candidates, cursor);
  if (idx < 0)
    return Status::ResourceExhausted(fmt::format("no {} worker has free KV blocks for this prompt; retry later",
                                                 services::WorkerRoleName(role)));
  return choices[static_cast<size_t>(idx)];
}

size_t WorkerRegistry::ReadyCount(WorkerRole role) const {
  size_t n = 0;
  for (const auto& [peer, e] : by_peer_) n += e->role == role && !e->draining;
  return n;
}

size_t WorkerRegistry::DrainingCount(WorkerRole role) const {
  size_t n = 0;
  for (const auto& [peer, e] : by_peer_) n += e->role == role && e->draining;
  return n;
}

std::vector<const WorkerEntry*> WorkerRegistry::All() const {
  std::vector<const WorkerEntry*> out;
  for (const auto& [peer, e] : by_peer_) out.push_back(e.get());
  return out;
}

}  // namespace pdserve::router
