#include "services/router/charge_ledger.h"

#include <algorithm>

#include <fmt/format.h>

#include "common/check.h"

namespace pdserve::router {

WorkerEntry* ChargeLedger::EntryOf(const OpenCharge& charge) const {
  WorkerEntry* w = registry_->FindByPeer(charge.peer);
  return w && w->registration == charge.registration ? w : nullptr;
}

void ChargeLedger::Charge(uint64_t job_id, AttemptSide side, WorkerEntry& worker, int64_t tokens, int64_t blocks,
                          Clock::time_point now) {
  PDSERVE_CHECK(registry_->FindByPeer(worker.peer) == &worker, "charging a worker that is not registered");
  const auto [it, inserted] =
      charges_.try_emplace(Key{job_id, side}, OpenCharge{worker.peer, worker.id, worker.registration, tokens, blocks});
  PDSERVE_CHECK(inserted, "a charge of this job is already open");
  worker.outstanding_requests += 1;
  worker.outstanding_tokens += tokens;
  worker.kv_free_estimate -= blocks;
  if (side == AttemptSide::kPrefill) worker.prefill_pace.Opened(tokens, now);
}

int64_t ChargeLedger::Consume(uint64_t job_id, AttemptSide side, int64_t n_tokens) {
  PDSERVE_CHECK(side == AttemptSide::kOutput, "consuming a prefill charge");
  auto it = charges_.find(Key{job_id, side});
  if (it == charges_.end() || n_tokens <= 0) return 0;
  OpenCharge& c = it->second;
  const int64_t n = std::min(n_tokens, c.tokens);
  c.tokens -= n;
  if (WorkerEntry* w = EntryOf(c)) w->outstanding_tokens -= n;
  return n;
}

bool ChargeLedger::Release(uint64_t job_id, AttemptSide side, Clock::time_point now) {
  return Close(job_id, side, false, now);
}

bool ChargeLedger::Served(uint64_t job_id, AttemptSide side, Clock::time_point now) {
  return Close(job_id, side, true, now);
}

bool ChargeLedger::Close(uint64_t job_id, AttemptSide side, bool served, Clock::time_point now) {
  auto it = charges_.find(Key{job_id, side});
  if (it == charges_.end()) return false;
  if (WorkerEntry* w = EntryOf(it->second)) {
    w->outstanding_requests -= 1;
    w->outstanding_tokens -= it->second.tokens;  // freed KV shows in the worker's next heartbeat
    // Prefill charges are never consumed: the tokens held are the tokens opened.
    if (side == AttemptSide::kPrefill) w->prefill_pace.Closed(it->second.tokens, served, now);
  }
  charges_.erase(it);
  return true;
}

int ChargeLedger::ReleaseAttempt(uint64_t job_id) {
  return int{Release(job_id, AttemptSide::kOutput)} + int{Release(job_id, AttemptSide::kPrefill)};
}

int ChargeLedger::ForgetWorker(const WorkerEntry& gone) {
  int n = 0;
  for (auto it = charges_.begin(); it != charges_.end();) {
    if (it->second.registration == gone.registration) {
      it = charges_.erase(it);
      ++n;
    } else {
      ++it;
    }
  }
  return n;
}

const OpenCharge* ChargeLedger::Find(uint64_t job_id, AttemptSide side) const {
  auto it = charges_.find(Key{job_id, side});
  return it == charges_.end() ? nullptr : &it->second;
}

Status ChargeLedger::Audit() const {
  struct Sum {
    int64_t requests = 0, tokens = 0, prefill_jobs = 0, prefill_tokens = 0;
  };
  std::map<uint64_t, Sum> by_registration;
  for (const auto& [key, c] : charges_) {
    if (!EntryOf(c))
      return Status::Internal(fmt::format("job {:x}: an open charge on worker {} (registration {}), which is gone",
                                          key.first, c.worker_id, c.registration));
    by_registration[c.registration].requests += 1;
    by_registration[c.registration].tokens += c.tokens;
    if (key.second == AttemptSide::kPrefill) {
      by_registration[c.registration].prefill_jobs += 1;
      by_registration[c.registration].prefill_tokens += c.tokens;
    }
  }
  for (const WorkerEntry* w : registry_->All()) {
    const Sum s = by_registration.count(w->registration) ? by_registration.at(w->registration) : Sum{};
    if (w->outstanding_requests != s.requests || w->outstanding_tokens != s.tokens)
      return Status::Internal(fmt::format(
          "worker {}: {} outstanding requests and {} tokens, its open charges hold {} and {}", w->id,
          w->outstanding_requests, w->outstanding_tokens, s.requests, s.tokens));
    if (w->prefill_pace.open_jobs() != s.prefill_jobs || w->prefill_pace.open_tokens() != s.prefill_tokens)
      return Status::Internal(fmt::format(
          "worker {}: its prefill pace holds {} jobs and {} tokens, its open prefill charges {} and {}", w->id,
          w->prefill_pace.open_jobs(), w->prefill_pace.open_tokens(), s.prefill_jobs, s.prefill_tokens));
  }
  return Status::Ok();
}

}  // namespace pdserve::router
