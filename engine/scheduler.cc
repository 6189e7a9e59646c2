#include "engine/scheduler.h"

#include <algorithm>

#include "engine/block_hash.h"

namespace pdserve::engine {

Status SchedulerOptions::Validate() const {
  if (max_num_seqs < 1) return Status::InvalidArgument("max_num_seqs must be >= 1");
  if (max_step_tokens < 1) return Status::InvalidArgument("max_step_tokens must be >= 1");
  if (prefill_chunk < 1 || prefill_chunk > max_step_tokens)
    return Status::InvalidArgument("prefill_chunk must be in [1, max_step_tokens]");
  return Status::Ok();
}

Scheduler::Scheduler(const SchedulerOptions& options, BlockPool* pool, PrefixCachePolicy prefix)
    : options_(options), pool_(pool), prefix_(prefix) {
  if (prefix_.first_chunk_tokens < 1) prefix_.first_chunk_tokens = 1;
}

void Scheduler::AddWaiting(Request* r, bool front) {
  r->state = RequestState::kWaiting;
  if (front) waiting_.push_front(r);
  else waiting_.push_back(r);
}

void Scheduler::AddRunning(Request* r) {
  r->state = RequestState::kRunning;
  auto it = std::upper_bound(running_.begin(), running_.end(), r,
                             [](const Request* a, const Request* b) { return a->arrival < b->arrival; });
  running_.insert(it, r);
}

void Scheduler::Remove(Request* r, bool keep_blocks) {
  if (auto it = std::find(waiting_.begin(), waiting_.end(), r); it != waiting_.end()) waiting_.erase(it);
  if (auto it = std::find(running_.begin(), running_.end(), r); it != running_.end()) running_.erase(it);
  if (!keep_blocks) r->blocks.Release(pool_);
}

void Scheduler::Commit(const SchedulerOutput& out) {
  for (const ScheduledChunk& c : out.chunks) {
    c.request->num_computed += c.n;
    RegisterComputed(c.request);
  }
}

void Scheduler::ResetChain(Request* r) {
  r->chained_blocks = 0;
  r->chain_tail = {};
  r->chain_ended = false;
}

void Scheduler::RegisterComputed(Request* r) {
  if (!prefix_.enabled || !r->cache_kv || r->chain_ended || r->prompt_len < prefix_.first_chunk_tokens) return;
  const int64_t B = pool_->layout().tokens_per_block;
  const int64_t computed = prefix_.prompt_blocks_only ? std::min(r->num_computed, r->prompt_len) : r->num_computed;
  const int64_t full = std::min(computed / B, r->blocks.n_blocks());
  if (full <= r->chained_blocks) return;
  ExtendChain(prefix_.ns, r->tokens, B, full, &r->block_hashes);
  CachedBlockId parent = r->chained_blocks == 0 ? PrefixCache::Root(prefix_.ns) : r->chain_tail;
  for (int64_t j = r->chained_blocks; j < full; ++j) {
    const std::optional<CachedBlockId> id =
        pool_->Register(r->blocks.ids()[static_cast<size_t>(j)], r->block_hashes[static_cast<size_t>(j)], parent,
                        std::span<const int32_t>(r->tokens).subspan(static_cast<size_t>(j * B), static_cast<size_t>(B)));
    if (!id) {
      r->chain_ended = true;  // the name belongs to other content: nothing after it can chain
      return;
    }
    parent = *id;
    r->chain_tail = *id;
    r->chained_blocks = j + 1;
  }
}

int64_t Scheduler::MapCachedPrefix(Request* r) {
  if (!prefix_.enabled || r->num_computed != 0 || r->blocks.n_blocks() != 0) return 0;
  const int64_t B = pool_->layout().tokens_per_block;
  // Whole blocks only, and never the last token: its row gives the logits to sample from (nor,
  // with prompt_blocks_only, the prompt's last token: the prompt's rest is never empty).
  const int64_t max_blocks = ((prefix_.prompt_blocks_only ? std::min(r->n_tokens(), r->prompt_len) : r->n_tokens()) - 1) / B;
  if (max_blocks * B < prefix_.first_chunk_tokens) return 0;
  ExtendChain(prefix_.ns, r->tokens, B, max_blocks, &r->block_hashes);
  std::vector<CachedBlockId> hit;
  const int64_t min_blocks = (prefix_.first_chunk_tokens + B - 1) / B;
  int64_t m =
      pool_->MatchPrefix(PrefixCache::Root(prefix_.ns), r->block_hashes, r->tokens, max_blocks, &hit, min_blocks);
  if (m * B < prefix_.first_chunk_tokens) m = 0;  // the first chunk whole, or nothing
  std::vector<int32_t> ids;
  ids.reserve(hit.size());
  for (const CachedBlockId& h : hit) ids.push_back(h.block);
  if (m < static_cast<int64_t>(ids.size())) {
    pool_->Free(std::span<const int32_t>(ids).subspan(static_cast<size_t>(m)));
    ids.resize(static_cast<size_t>(m));
  }
  if (m == 0) return 0;
  r->blocks.Adopt(std::move(ids));
  r->num_computed = m * B;
  r->chained_blocks = m;
  r->chain_tail = hit[static_cast<size_t>(m - 1)];
  r->chain_ended = false;
  return m * B;
}

void Scheduler::UnmapCachedPrefix(Request* r) {
  r->blocks.Release(pool_);
  r->num_computed = 0;
  ResetChain(r);
}

ScheduledChunk Scheduler::NextChunk(Request* r, int64_t budget) const {
  ScheduledChunk c;
  c.request = r;
  c.start = r->num_computed;
  const int64_t total = r->n_tokens();
  if (c.start >= total || budget <= 0) return c;
  if (c.start < r->prompt_len) {
    if (options_.whole_prompts) {
      c.n = r->prompt_len - c.start;
      c.grouping = c.start == 0 ? model::RowGrouping::kChunk : model::RowGrouping::kPromptRest;
      c.sample = c.start + c.n == total;
      return c;
    }
    // Prompt: the next chunk of the fixed grid, whole or nothing.
    const int64_t C = options_.prefill_chunk;
    const int64_t end = std::min(r->prompt_len, (c.start / C + 1) * C);
    if (end - c.start > budget) return c;
    c.n = end - c.start;
    c.grouping = model::RowGrouping::kChunk;
  } else {
    // Output tokens (one per step while decoding; many when recomputing): each its own group.
    c.n = std::min(total - c.start, budget);
    c.grouping = model::RowGrouping::kPerRow;
  }
  c.sample = c.start + c.n == total;
  return c;
}

void Scheduler::Preempt(Request* r, SchedulerOutput* out) {
  running_.erase(std::find(running_.begin(), running_.end(), r));
  r->blocks.Release(pool_);
  r->num_computed = 0;
  ResetChain(r);
  ++r->preemptions;
  ++preemptions_;
  AddWaiting(r, /*front=*/true);
  out->preempted.push_back(r);
}

SchedulerOutput Scheduler::Schedule() {
  SchedulerOutput out;
  if (options_.whole_prompts && !waiting_.empty() && static_cast<int64_t>(running_.size()) < options_.max_num_seqs) {
    Request* r = waiting_.front();
    const int64_t mapped = MapCachedPrefix(r);
    ScheduledChunk c = NextChunk(r, r->prompt_len);
    if (c.n > 0 && r->blocks.EnsureCapacity(pool_, c.start + c.n).ok()) {
      waiting_.pop_front();
      CountLookup(r, mapped);
      AddRunning(r);
      out.chunks.push_back(c);
      out.n_tokens = c.n;
      return out;
    }
    if (mapped > 0) UnmapCachedPrefix(r);
  }
  int64_t budget = options_.max_step_tokens;
  for (size_t i = 0; i < running_.size();) {
    Request* r = running_[i];
    ScheduledChunk c = NextChunk(r, budget);
    if (c.n == 0) {
      ++i;
      continue;
    }
    bool self_preempted = false;
    while (!r->blocks.EnsureCapacity(pool_, c.start + c.n).ok()) {
      Request* victim = running_.back();  // the latest arrival; never one scheduled already
      Preempt(victim, &out);
      if (victim == r) {
        self_preempted = true;
        break;
      }
    }
    if (self_preempted) break;  // r was the last running request
    out.chunks.push_back(c);
    out.n_tokens += c.n;
    budget -= c.n;
    ++i;
  }
  // Memory is short: admit nobody this step. Whole prompts were admitted above.
  if (!out.preempted.empty() || options_.whole_prompts) return out;
  for (size_t i = 0; i < waiting_.size() && static_cast<int64_t>(running_.size()) < options_.max_num_seqs;) {
    Request* r = waiting_[i];
    if (WaitsForTwin(r) || WaitsForSharedPrefill(r)) {
      ++i;  // a twin's KV, or the first chunk they share once cached, will be there for it
      continue;
    }
    const int64_t mapped = MapCachedPrefix(r);
    ScheduledChunk c = NextChunk(r, budget);
    if (c.n == 0 || !r->blocks.EnsureCapacity(pool_, c.start + c.n).ok()) {
      if (mapped > 0) UnmapCachedPrefix(r);
      break;
    }
    CountLookup(r, mapped);
    waiting_.erase(waiting_.begin() + static_cast<std::ptrdiff_t>(i));
    AddRunning(r);
    out.chunks.push_back(c);
    out.n_tokens += c.n;
    budget -= c.n;
  }
  return out;
}

void Scheduler::CountLookup(Request* r, int64_t mapped) {
  if (!prefix_.enabled || r->prefix_counted) return;
  r->prefix_counted = true;
  r->cached_prompt_tokens = std::min(mapped, r->prompt_len);
  counters_.lookup_tokens += r->prompt_len;
  counters_.hit_tokens += r->cached_prompt_tokens;
  counters_.computed_tokens += r->prompt_len - r->cached_prompt_tokens;
}

bool Scheduler::WaitsForSharedPrefill(const Request* r) const {
  if (!prefix_.enabled || options_.whole_prompts || r->num_computed != 0 || r->blocks.n_blocks() != 0) return false;
  const int64_t C = prefix_.first_chunk_tokens;
  const int64_t B = pool_->layout().tokens_per_block;
  // r could take a hit of at least the first chunk (MapCachedPrefix's rule).
  if ((r->n_tokens() - 1) / B * B < C) return false;
  for (const Request* l : running_) {
    // A request still computing a prompt whose first chunk is r's, and whose blocks will be
    // cached: by the time it has passed the chunk, r maps it instead of computing it again.
    if (l->prefill_done() || !l->cache_kv || l->chain_ended || l->prompt_len < C) continue;
    if (!std::equal(r->tokens.begin(), r->tokens.begin() + C, l->tokens.begin())) continue;
    // The whole blocks of the prefix they share that r may map; r waits while l has not
    // computed them all.
    const int64_t limit = std::min(l->prompt_len, r->n_tokens() - 1);
    const auto diff = std::mismatch(r->tokens.begin() + C, r->tokens.begin() + limit, l->tokens.begin() + C);
    const int64_t shared_blocks = (diff.first - r->tokens.begin()) / B;
    if (l->num_computed < shared_blocks * B) return true;
  }
  return false;
}

bool Scheduler::Twinnable(const Request& r) {
  return r.n_output() == 0 && !r.matcher && !r.kv_export.enabled() && !r.hold_kv;
}

namespace {
bool SamePrompt(const Request& a, const Request& b) {
  return a.prompt_len == b.prompt_len &&
         std::equal(a.tokens.begin(), a.tokens.begin() + a.prompt_len, b.tokens.begin());
}
}  // namespace

bool Scheduler::WaitsForTwin(const Request* r) const {
  if (!options_.twin_prompts || options_.whole_prompts || r->num_computed != 0 || r->blocks.n_blocks() != 0 ||
      !Twinnable(*r))
    return false;
  for (const Request* l : running_)
    if (!l->prefill_done() && Twinnable(*l) && SamePrompt(*l, *r)) return true;
  return false;
}

std::vector<Request*> Scheduler::TakeTwins(const Request& r) {
  std::vector<Request*> twins;
  if (!options_.twin_prompts || options_.whole_prompts || !Twinnable(r)) return twins;
  // At most as many as there are free sequence slots; the rest are admitted as usual later
  // (and compute the prompt themselves).
  const int64_t room = options_.max_num_seqs - static_cast<int64_t>(running_.size());
  for (auto it = waiting_.begin(); it != waiting_.end() && static_cast<int64_t>(twins.size()) < room;) {
    Request* t = *it;
    if (t != &r && t->num_computed == 0 && t->blocks.n_blocks() == 0 && Twinnable(*t) && SamePrompt(r, *t)) {
      twins.push_back(t);
      it = waiting_.erase(it);
    } else {
      ++it;
    }
  }
  return twins;
}

void Scheduler::AdmitTwin(Request* t) {
  // Its blocks are copies, not computed here: they never join the cache's chains (the twin's
  // own blocks do, with the same content). Its lookup counts the whole prompt as found: none
  // of it is computed (TokenEvent::cached_prompt_tokens, the usage's cached tokens).
  t->chain_ended = true;
  CountLookup(t, t->prompt_len);
  AddRunning(t);
}

void Scheduler::RequeueTwin(Request* t) {
  // Back at its place in arrival order.
  t->state = RequestState::kWaiting;
  auto it = std::find_if(waiting_.begin(), waiting_.end(), [t](const Request* w) { return w->arrival > t->arrival; });
  waiting_.insert(it, t);
}

}  // namespace pdserve::engine
