#include "services/router/attempt.h"

#include "common/check.h"

namespace pdserve::router {

using services::WorkerRole;

const char* AttemptStateName(AttemptState state) {
  switch (state) {
    case AttemptState::kReservingKv: return "reserving_kv";
    case AttemptState::kPrefilling: return "prefilling";
    case AttemptState::kDecoding: return "decoding";
    case AttemptState::kMigrating: return "migrating";
    case AttemptState::kFinished: return "finished";
  }
  return "?";
}

Attempt Attempt::Colocated(uint64_t job_id, std::string worker_peer) {
  PDSERVE_CHECK(!worker_peer.empty());
  return Attempt(job_id, false, std::move(worker_peer), {}, AttemptState::kPrefilling);
}

Attempt Attempt::Disaggregated(uint64_t job_id, std::string decode_peer, std::string prefill_peer) {
  PDSERVE_CHECK(!decode_peer.empty() && !prefill_peer.empty() && decode_peer != prefill_peer);
  return Attempt(job_id, true, std::move(decode_peer), std::move(prefill_peer), AttemptState::kReservingKv);
}

WorkerRole Attempt::RoleOf(AttemptSide side) const {
  if (side == AttemptSide::kPrefill) return WorkerRole::kPrefill;
  return disaggregated_ ? WorkerRole::kDecode : WorkerRole::kColocated;
}

std::optional<AttemptSide> Attempt::SideOf(std::string_view peer) const {
  if (!live()) return std::nullopt;
  if (peer == output_peer_) return AttemptSide::kOutput;
  if (disaggregated_ && peer == prefill_peer_ && state_ == AttemptState::kPrefilling) return AttemptSide::kPrefill;
  return std::nullopt;
}

bool Attempt::DependsOn(std::string_view peer) const {
  if (!live()) return false;
  if (peer == output_peer_) return true;
  return disaggregated_ && peer == prefill_peer_ &&
         (state_ == AttemptState::kReservingKv || state_ == AttemptState::kPrefilling);
}

std::vector<std::string> Attempt::Holders() const {
  std::vector<std::string> out;
  if (!live()) return out;
  out.push_back(output_peer_);
  if (disaggregated_ && state_ == AttemptState::kPrefilling) out.push_back(prefill_peer_);
  return out;
}

bool Attempt::KvReserved(std::string_view peer) {
  if (state_ != AttemptState::kReservingKv || peer != output_peer_) return false;
  state_ = AttemptState::kPrefilling;
  return true;
}

bool Attempt::FirstTokenRelayed(Clock::time_point now) {
  if (!disaggregated_ || state_ != AttemptState::kPrefilling) return false;
  state_ = AttemptState::kDecoding;
  last_output_ = now;
  return true;
}

bool Attempt::Output(size_t n_tokens, Clock::time_point now) {
  if (!live()) return false;
  if (n_tokens == 0) return true;
  if (state_ != AttemptState::kDecoding) {
    // A decode worker produces tokens only after the router relayed the first token to it.
    if (disaggregated_) return false;
    state_ = AttemptState::kDecoding;
  }
  last_output_ = now;
  return true;
}

bool Attempt::Stalled(Clock::time_point now, Clock::duration timeout) const {
  return state_ == AttemptState::kDecoding && now - last_output_ > timeout;
}

std::vector<std::string> Attempt::End(AttemptState terminal, std::string_view released) {
  PDSERVE_CHECK(terminal == AttemptState::kFinished || terminal == AttemptState::kMigrating);
  std::vector<std::string> abort;
  for (auto& peer : Holders())
    if (peer != released) abort.push_back(std::move(peer));
  if (live()) state_ = terminal;
  return abort;
}

}  // namespace pdserve::router
