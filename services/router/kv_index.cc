#include "services/router/kv_index.h"

#include <algorithm>

#include <fmt/format.h>

#include "common/block_hash.h"

namespace pdserve::router {

uint64_t PromptChains::BlockHash(uint64_t ns, int64_t block_tokens, int64_t j) {
  std::vector<uint64_t>& chain = chains_[{ns, block_tokens}];
  if (static_cast<int64_t>(chain.size()) <= j) ExtendChain(ns, prompt_, block_tokens, j + 1, &chain);
  return chain[static_cast<size_t>(j)];
}

Status KvIndex::Apply(uint64_t worker, uint64_t ns, int64_t max_blocks, const services::KvEventsMsg& events) {
  if (ns == 0) {
    by_worker_.erase(worker);
    return Status::InvalidArgument("KV events from a worker that registered without a prefix cache (kv_namespace 0)");
  }
  Worker& w = by_worker_[worker];
  if (w.ns != ns || w.block_tokens != events.block_tokens) w.pending.clear();  // other names now
  if (events.reset || w.ns != ns || w.block_tokens != events.block_tokens) w.hashes.clear();
  w.ns = ns;
  w.block_tokens = events.block_tokens;
  w.first_chunk_tokens = events.first_chunk_tokens;
  for (uint64_t h : events.removed) {
    w.hashes.erase(h);
    w.pending.erase(h);  // the worker's word is newer than the dispatch
  }
  for (uint64_t h : events.stored) {
    w.hashes.insert(h);
    w.pending.erase(h);  // reported: no longer a guess
  }
  if (max_blocks > 0 && static_cast<int64_t>(w.hashes.size()) > max_blocks) {
    const size_t claimed = w.hashes.size();
    w.hashes = {};
    w.pending = {};
    return Status::InvalidArgument(
        fmt::format("KV events claim {} cached blocks in a pool of {}; the worker's index is dropped", claimed,
                    max_blocks));
  }
  return Status::Ok();
}

void KvIndex::Forget(uint64_t worker) { by_worker_.erase(worker); }

int64_t KvIndex::Blocks(uint64_t worker) const {
  auto it = by_worker_.find(worker);
  return it == by_worker_.end() ? 0 : static_cast<int64_t>(it->second.hashes.size());
}

void KvIndex::DropExpired(Worker* w, Clock::time_point now) {
  while (!w->expiry_order.empty() && w->expiry_order.front().first <= now) {
    const auto [expires, h] = w->expiry_order.front();
    w->expiry_order.pop_front();
    if (auto p = w->pending.find(h); p != w->pending.end() && p->second == expires) w->pending.erase(p);
  }
}

int64_t KvIndex::PendingBlocks(uint64_t worker, Clock::time_point now) const {
  auto it = by_worker_.find(worker);
  if (it == by_worker_.end()) return 0;
  return std::count_if(it->second.pending.begin(), it->second.pending.end(),
                       [now](const auto& entry) { return entry.second > now; });
}

void KvIndex::NoteDispatched(uint64_t worker, PromptChains* chains, Clock::time_point now) {
  auto it = by_worker_.find(worker);
  if (it == by_worker_.end()) return;
  Worker& w = it->second;
  DropExpired(&w, now);
  const auto n = static_cast<int64_t>(chains->prompt().size());
  const int64_t B = w.block_tokens;
  // The engine registers the blocks of prompts that fill the first chunk (docs/prefix-cache.md
  // rule 2): every full block of the prompt.
  if (B <= 0 || n < std::max<int64_t>(w.first_chunk_tokens, 1)) return;
  const Clock::time_point expires = now + pending_ttl_;
  for (int64_t j = 0; j < n / B; ++j) {
    const uint64_t h = chains->BlockHash(w.ns, B, j);
    if (w.hashes.count(h)) continue;
    w.pending[h] = expires;
    w.expiry_order.emplace_back(expires, h);
  }
}

int64_t KvIndex::PredictHitTokens(uint64_t worker, PromptChains* chains, Clock::time_point now) const {
  return Predict(worker, chains, true, now);
}

int64_t KvIndex::PredictStoredTokens(uint64_t worker, PromptChains* chains) const {
  return Predict(worker, chains, false, Clock::time_point{});
}

int64_t KvIndex::Predict(uint64_t worker, PromptChains* chains, bool pending, Clock::time_point now) const {
  auto it = by_worker_.find(worker);
  if (it == by_worker_.end()) return 0;
  const Worker& w = it->second;
  const auto n = static_cast<int64_t>(chains->prompt().size());
  const int64_t B = w.block_tokens;
  if (B <= 0 || n < 1 || (w.hashes.empty() && w.pending.empty())) return 0;
  auto holds = [&](uint64_t h) {
    if (w.hashes.count(h)) return true;
    if (!pending) return false;
    auto p = w.pending.find(h);
    return p != w.pending.end() && p->second > now;
  };
  // The engine's rule (engine/scheduler.cc MapCachedPrefix): whole blocks, never the last
  // token (its row gives the logits to sample from), the first chunk whole or nothing.
  const int64_t max_blocks = (n - 1) / B;
  const int64_t first_chunk = std::max<int64_t>(w.first_chunk_tokens, 1);
  if (max_blocks * B < first_chunk) return 0;
  int64_t m = 0;
  while (m < max_blocks && holds(chains->BlockHash(w.ns, B, m))) ++m;
  return m * B >= first_chunk ? m * B : 0;
}

}  // namespace pdserve::router
