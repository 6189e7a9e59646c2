// KvIndex: the router's index of its workers' prefix caches (docs/router.md "KV-aware routing"),
// and PromptChains: the chained block names of one prompt.
//
// Each engine worker publishes what its prefix cache stores and removes (kvEvents,
// proto/control.capnp): the chained hashes of full KV blocks under its namespace
// (RegisterMsg::kv_namespace), and its hit rule (block size B, first chunk C). The index keeps,
// per worker registration, the set of hashes it holds. For a prompt and a worker it predicts
// the prefix-cache hit the worker's engine would find: it names the prompt's blocks exactly as
// the engine does (common/block_hash.h, the one definition both use), walks them while the
// worker holds each, and applies the engine's rule (docs/prefix-cache.md): whole blocks, never
// the prompt's last token, and at least C tokens or nothing.
//
// A prediction is only advice for routing: the index lags the caches by the event interval,
// and a block may be evicted after its event (or a 64-bit name may collide). A wrong prediction
// sends a request to a worker that then computes more than expected, never a wrong token: the
// worker looks up its own cache, which checks tokens and parents.
//
// Dispatched, not yet reported: when the router sends a prompt to a worker that will compute
// it (NoteDispatched), the prompt's full blocks are the blocks that worker's cache is about to
// hold. They count as held ("pending") until the worker's events report them stored or
// `pending_ttl` passes, so that the next prompt with the same prefix, sent before the events
// arrive (a burst behind one system prompt, the next turn of a fast conversation), sees them.
// A pending name that never comes (the request was cancelled, its blocks were evicted at once)
// misleads routing for at most the TTL, with the cost of any stale entry.
//
// Memory: per worker at most the blocks of its pool (capacity.kv_blocks_total): a worker that
// claims more is refused and its set dropped (a bug or a hostile peer; its next reset restores).
// Thread-safety: none; RouterCore owns it under its mutex.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <map>
#include <span>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "common/status.h"
#include "services/control/control_messages.h"

namespace pdserve::router {

// The chain names of one prompt's full blocks, computed lazily per (namespace, block size), so
// workers of one namespace share the work and a walk that stops early hashes no further.
// Borrows the prompt (it must outlive the object).
class PromptChains {
 public:
  explicit PromptChains(std::span<const int32_t> prompt) : prompt_(prompt) {}
  std::span<const int32_t> prompt() const { return prompt_; }
  // The name of block j (tokens [jB, (j+1)B)). REQUIRES: (j + 1) * block_tokens <= prompt size.
  uint64_t BlockHash(uint64_t ns, int64_t block_tokens, int64_t j);

 private:
  std::span<const int32_t> prompt_;
  std::map<std::pair<uint64_t, int64_t>, std::vector<uint64_t>> chains_;
};

class KvIndex {
 public:
  using Clock = std::chrono::steady_clock;
  explicit KvIndex(Clock::duration pending_ttl = std::chrono::seconds(30)) : pending_ttl_(pending_ttl) {}

  // Applies a worker's events. `worker`: its registration (WorkerEntry::registration); `ns`:
  // its kv_namespace; `max_blocks`: its pool's block count (0: unknown, no cap).
  // Errors: InvalidArgument when the worker announced no cache (ns 0; nothing is kept) or
  // claims more cached blocks than its pool holds (its set is dropped).
  Status Apply(uint64_t worker, uint64_t ns, int64_t max_blocks, const services::KvEventsMsg& events);
  // Drops everything of a worker (removed, replaced, gone).
  void Forget(uint64_t worker);
  // Blocks the index believes `worker` holds.
  int64_t Blocks(uint64_t worker) const;
  size_t workers() const { return by_worker_.size(); }

  // Pending blocks of `worker` (dispatched, not reported, not expired at `now`).
  int64_t PendingBlocks(uint64_t worker, Clock::time_point now) const;

  // The prompt tokens `worker` would find in its prefix cache (0 when it publishes nothing),
  // counting its pending blocks that have not expired at `now`.
  int64_t PredictHitTokens(uint64_t worker, PromptChains* chains, Clock::time_point now = Clock::now()) const;
  // The same, counting only blocks the worker reported stored (what it can hand to another
  // worker now: a pending block may still be computing).
  int64_t PredictStoredTokens(uint64_t worker, PromptChains* chains) const;

  // `worker` was sent `chains`' prompt to compute: the prompt's full blocks become pending for
  // it until reported or `now + pending_ttl`. Nothing for a worker that published no events yet
  // or a prompt shorter than its first chunk (the engine registers no block of such a prompt).
  void NoteDispatched(uint64_t worker, PromptChains* chains, Clock::time_point now = Clock::now());

 private:
  int64_t Predict(uint64_t worker, PromptChains* chains, bool pending, Clock::time_point now) const;

  struct Worker {
    uint64_t ns = 0;
    int64_t block_tokens = 0;
    int64_t first_chunk_tokens = 0;
    std::unordered_set<uint64_t> hashes;
    std::unordered_map<uint64_t, Clock::time_point> pending;  // name -> expiry
    // (expiry, name) in the order they were set: expiries only grow (one TTL, a steady clock),
    // so the expired ones are at the front. A name reported or set again since leaves a stale
    // element here, skipped when it comes out.
    std::deque<std::pair<Clock::time_point, uint64_t>> expiry_order;
  };
  // Drops the pending names that expired by `now`: amortized O(1) per dispatched block.
  static void DropExpired(Worker* w, Clock::time_point now);

  Clock::duration pending_ttl_;
  std::unordered_map<uint64_t, Worker> by_worker_;
};

}  // namespace pdserve::router
