// WorkerRegistry: the router's view of its workers: who registered (role, capacity, model,
// compatibility hash, addresses), their last reported load, liveness, and the router-side
// accounting the routing policies use (outstanding tokens, free-KV estimate).
//
// Registration rules (a refused worker gets RegisterRefuse and does not retry):
//   * protocol version and model name must match the router's;
//   * a model's vocabulary must cover the router's tokenizer (else every chat request would
//     fail with a token outside the vocabulary);
//   * every prefill and decode worker must carry the same compatibility hash (model + KV
//     layout), so any prefill worker may write into any decode worker's blocks. The hash is the
//     router's router.compat_hash when set, else the first registered prefill/decode worker's
//     (forgotten when the last of them leaves). Colocated workers never pair and are exempt;
//   * a worker id already registered from another peer or incarnation is a restart (or a
//     reconnect after the router forgot it): the new registration replaces the old entry, and
//     the caller fails the old entry's requests.
//
// Thread-safety: none; RouterCore owns it under its mutex. Entry pointers stay valid until the
// entry is removed or replaced.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/status.h"
#include "services/control/control_messages.h"
#include "services/router/prefill_pace.h"
#include "services/router/routing_policy.h"

namespace pdserve::router {

using Clock = std::chrono::steady_clock;

struct WorkerEntry {
  std::string id;
  std::string peer;  // ZeroMQ routing id of its DEALER
  // This registration's number, unique for the registry's life: tells a worker entry from a
  // later one at the same peer or with the same id (charge_ledger.h).
  uint64_t registration = 0;
  services::WorkerRole role = services::WorkerRole::kColocated;
  uint64_t incarnation = 0;
  std::string http_address;
  std::string transfer_address;
  std::string model_name;
  services::WorkerCapacity capacity;
  uint64_t compat_hash = 0;
  uint64_t kv_namespace = 0;  // RegisterMsg::kv_namespace (0: no prefix cache)
  std::string instance_id;  // a DP rank of a multi-rank instance ("" : one-process worker)
  uint32_t dp_rank = 0;
  services::WorkerLoad load;
  bool draining = false;
  bool drain_requested = false;  // the router sent Drain: draining whatever heartbeats say
  Clock::time_point registered_at{};
  Clock::time_point last_seen{};
  // Router-side accounting, written only by ChargeLedger (charge_ledger.h): the open charges
  // of the attempts placed here. kv_free_estimate is also reset by every heartbeat.
  int64_t outstanding_tokens = 0;
  int64_t outstanding_requests = 0;
  int64_t kv_free_estimate = 0;
  // How far the worker has probably got through its prefill charges (kv_aware reads it).
  PrefillPace prefill_pace;
  // Blocks the router's prefix-cache index (kv_index.h) holds for this worker, from its KV
  // events (0: it publishes none).
  int64_t kv_index_blocks = 0;
};

struct RegisterOutcome {
  Status refusal;                       // non-OK: refuse with this
  // Entries this registration removed: an older entry of the same worker id, and one of
  // another worker id at the same peer. The caller fails their requests.
  std::vector<WorkerEntry> replaced;
  bool duplicate = false;               // a retry of an accepted registration
};

struct WorkerChoice {
  WorkerEntry* worker = nullptr;
  uint32_t max_tokens = 0;       // resolved for this worker's context (output workers)
  int64_t blocks = 0;            // KV blocks the request needs there
  int64_t predicted_hit_tokens = 0;  // of the prompt, predicted cached there (with predict_hit)
};

// The prefix-cache hit (prompt tokens) a worker is predicted to find (KvIndex), and how many of
// them it would pull from another worker first (docs/prefix-cache.md "Pulls").
struct PredictedHit {
  PredictedHit(int64_t hit_tokens = 0, int64_t pulled = 0) : tokens(hit_tokens), pulled_tokens(pulled) {}
  int64_t tokens = 0;
  int64_t pulled_tokens = 0;
};
using PredictHitFn = std::function<PredictedHit(const WorkerEntry&)>;

class WorkerRegistry {
 public:
  struct Options {
    std::string model_name;
    uint64_t compat_hash = 0;  // 0: adopt the first prefill/decode worker's
    std::chrono::milliseconds heartbeat_timeout{2500};
    // Token ids the router's tokenizer can produce (its vocabulary incl. added tokens); a
    // worker whose model has fewer embedding rows is refused. 0: no check.
    uint32_t tokenizer_vocab_size = 0;
  };
  explicit WorkerRegistry(Options options) : options_(std::move(options)) {}

  RegisterOutcome Register(const std::string& peer, const services::RegisterMsg& msg, Clock::time_point now);
  // False when the peer is not registered.
  bool Heartbeat(const std::string& peer, const services::HeartbeatMsg& msg, Clock::time_point now);
  bool Touch(const std::string& peer, Clock::time_point now);
  std::optional<WorkerEntry> Remove(const std::string& peer);
  // Moves every worker's last-heard time forward by `stalled` (at most to `now`): the router's
  // own stall does not count as the workers' silence (services/worker/agent/listening_clock.h).
  void Forgive(Clock::duration stalled, Clock::time_point now);
  // Removes and returns every worker silent for longer than the heartbeat timeout.
  std::vector<WorkerEntry> Expire(Clock::time_point now);

  WorkerEntry* FindByPeer(const std::string& peer);
  WorkerEntry* FindById(const std::string& id);

  // Picks a worker of `role` for a prompt. `produces_output`: the worker generates (decode,
  // colocated), so max_tokens must fit its context and its KV must hold them.
  // Errors: Unavailable (no ready worker of the role), InvalidArgument (the request exceeds
  // every ready worker's context; the message is OpenAI's context-length message),
  // ResourceExhausted (kv_capacity_aware: no worker can hold even the prompt).
  // `prefer` (a peer; empty: none): taken instead of the policy's pick when it is eligible and
  // its free-KV estimate holds the request (prompt + max_tokens for an output worker, the prompt
  // for a prefill worker); the choices of one client request share their workers this way.
  // `predict_hit` (optional): each candidate's predicted prefix-cache hit, which kv_aware
  // scores by and the choice reports. `now`: when the choice is made (kv_aware takes the
  // prompt tokens each worker has probably computed by then off its outstanding tokens).
  Result<WorkerChoice> Choose(services::WorkerRole role, RoutingPolicy policy, uint32_t prompt_tokens,
                              std::optional<uint32_t> max_tokens, uint32_t default_max_tokens,
                              bool produces_output, uint64_t* cursor, const std::string& prefer = {},
                              const PredictHitFn& predict_hit = {}, Clock::time_point now = Clock::now());

  size_t ReadyCount(services::WorkerRole role) const;
  size_t DrainingCount(services::WorkerRole role) const;
  std::vector<const WorkerEntry*> All() const;
  size_t size() const { return by_peer_.size(); }
  // The compatibility hash prefill/decode workers must carry now (0: none yet).
  uint64_t CurrentCompatHash() const;

 private:
  const Options options_;
  std::map<std::string, std::unique_ptr<WorkerEntry>> by_peer_;
  std::map<std::string, std::string> peer_by_id_;
  uint64_t next_registration_ = 1;
};

}  // namespace pdserve::router
