#include "engine/scheduler.h"

#include <algorithm>

namespace pdserve::engine {

Status SchedulerOptions::Validate() const {
  if (max_num_seqs < 1) return Status::InvalidArgument("max_num_seqs must be >= 1");
  if (max_step_tokens < 1) return Status::InvalidArgument("max_step_tokens must be >= 1");
  if (prefill_chunk < 1 || prefill_chunk > max_step_tokens)
    return Status::InvalidArgument("prefill_chunk must be in [1, max_step_tokens]");
  return Status::Ok();
}

Scheduler::Scheduler(const SchedulerOptions& options, BlockPool* pool) : options_(options), pool_(pool) {}

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
  for (const ScheduledChunk& c : out.chunks) c.request->num_computed += c.n;
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
      c.grouping = model::RowGrouping::kChunk;
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
  ++r->preemptions;
  ++preemptions_;
  AddWaiting(r, /*front=*/true);
  out->preempted.push_back(r);
}

SchedulerOutput Scheduler::Schedule() {
  SchedulerOutput out;
  if (options_.whole_prompts && !waiting_.empty() && static_cast<int64_t>(running_.size()) < options_.max_num_seqs) {
    Request* r = waiting_.front();
    ScheduledChunk c = NextChunk(r, r->prompt_len);
    if (c.n > 0 && r->blocks.EnsureCapacity(pool_, c.start + c.n).ok()) {
      waiting_.pop_front();
      AddRunning(r);
      out.chunks.push_back(c);
      out.n_tokens = c.n;
      return out;
    }
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
  while (!waiting_.empty() && static_cast<int64_t>(running_.size()) < options_.max_num_seqs) {
    Request* r = waiting_.front();
    ScheduledChunk c = NextChunk(r, budget);
    if (c.n == 0 || !r->blocks.EnsureCapacity(pool_, c.start + c.n).ok()) break;
    waiting_.pop_front();
    AddRunning(r);
    out.chunks.push_back(c);
    out.n_tokens += c.n;
    budget -= c.n;
  }
  return out;
}

}  // namespace pdserve::engine
