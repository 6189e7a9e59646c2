// Attempt: one try of a request on one set of workers (a colocated worker, or a decode worker
// plus a prefill worker), as an explicit state machine. A request that migrates
// (docs/router.md, "Migration") runs several attempts in a row, each with its own job id.
//
// States and transitions (each transition is one method; nothing else changes the state):
//
//   colocated:      kPrefilling --Output(n>0)--> kDecoding
//   disaggregated:  kReservingKv --KvReserved--> kPrefilling --FirstTokenRelayed--> kDecoding
//   any live state  --End(kFinished)--> kFinished     the request ended (finish, error, cancel)
//                   --End(kMigrating)--> kMigrating   a worker failed; a new attempt follows
//
//   kReservingKv  the decode worker has its job (Job decode) and reserves KV for the prompt;
//                 the prefill worker is chosen but has no job yet.
//   kPrefilling   the prompt is being computed: by the colocated worker (before its first
//                 token), or by the prefill worker (Job prefill, with the decode worker's KV
//                 descriptor) while the decode worker holds the reservation.
//   kDecoding     the first token arrived; the output worker (colocated / decode) streams the
//                 rest. The prefill worker is done with the request.
//   kMigrating, kFinished: terminal. The attempt holds no worker.
//
// There is no "dispatching" state: RouterCore creates an attempt in the same critical section
// that sends its first job, so nobody observes an attempt without a job in flight.
//
// Which workers hold a job of the attempt (and get Abort when it ends) follows from the state:
// the output worker in every live state, the prefill worker in kPrefilling of a disaggregated
// attempt. End() returns exactly those, minus the worker that already let go of the job (it
// ended the job itself, or it is gone).
//
// Pure: no sockets, no registry, no clock of its own (callers pass `now`). Thread-safety: none;
// RouterCore keeps its attempts under its mutex.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "services/control/control_messages.h"

namespace pdserve::router {

enum class AttemptState : uint8_t { kReservingKv, kPrefilling, kDecoding, kMigrating, kFinished };
const char* AttemptStateName(AttemptState state);

// The two jobs an attempt can have: the output job (colocated or decode worker: produces the
// tokens) and the prefill job (disaggregated only).
enum class AttemptSide : uint8_t { kOutput, kPrefill };

class Attempt {
 public:
  using Clock = std::chrono::steady_clock;

  // An ended attempt with no job and no workers (a placeholder until the first dispatch).
  Attempt() = default;
  // REQUIRES: peers non-empty; decode_peer != prefill_peer.
  static Attempt Colocated(uint64_t job_id, std::string worker_peer);
  static Attempt Disaggregated(uint64_t job_id, std::string decode_peer, std::string prefill_peer);

  uint64_t job_id() const { return job_id_; }
  AttemptState state() const { return state_; }
  bool disaggregated() const { return disaggregated_; }
  bool live() const { return state_ != AttemptState::kMigrating && state_ != AttemptState::kFinished; }
  // The colocated / decode worker.
  const std::string& output_peer() const { return output_peer_; }
  // The prefill worker ("" when colocated).
  const std::string& prefill_peer() const { return prefill_peer_; }
  // The role of the worker on `side` (kOutput: decode or colocated).
  services::WorkerRole RoleOf(AttemptSide side) const;
  // When the attempt last produced a token (its first token, or a later one); unset before.
  Clock::time_point last_output() const { return last_output_; }

  // Which of this attempt's jobs a message from `peer` belongs to: kOutput from the output
  // worker while live, kPrefill from the prefill worker while it holds its job (kPrefilling).
  // nullopt: the peer holds no job of this attempt now (a stale or stray message).
  std::optional<AttemptSide> SideOf(std::string_view peer) const;
  // Whether the attempt fails if the worker at `peer` goes away: the output worker while live,
  // the prefill worker until it has sent the first token (kReservingKv, kPrefilling).
  bool DependsOn(std::string_view peer) const;
  // The peers holding a job of this attempt now (both, one or none).
  std::vector<std::string> Holders() const;

  // The decode worker reserved KV: kReservingKv -> kPrefilling (the caller sends the prefill
  // job). False, and nothing changes, for a message that does not fit (another peer, another
  // state: a duplicate or stale reservation).
  bool KvReserved(std::string_view peer);
  // The prefill worker sent the first token and the caller relays it to the decode worker:
  // kPrefilling -> kDecoding. False when the attempt is not a disaggregated one in kPrefilling.
  bool FirstTokenRelayed(Clock::time_point now);
  // The output worker sent `n_tokens` tokens. Colocated kPrefilling -> kDecoding when
  // n_tokens > 0; kDecoding stays. False when the output worker may not produce tokens now
  // (a disaggregated attempt before its first token: a protocol error) or the attempt ended.
  bool Output(size_t n_tokens, Clock::time_point now);
  // Whether a decoding attempt produced nothing for longer than `timeout`.
  bool Stalled(Clock::time_point now, Clock::duration timeout) const;

  // Ends the attempt: -> `terminal` (kFinished or kMigrating). Returns the peers that still hold
  // a job of it and must get Abort: Holders() without `released` (a worker that already let go
  // of its job: it ended the job itself, or it is gone). An ended attempt returns nothing.
  std::vector<std::string> End(AttemptState terminal, std::string_view released = {});

 private:
  Attempt(uint64_t job_id, bool disaggregated, std::string output_peer, std::string prefill_peer, AttemptState state)
      : job_id_(job_id),
        disaggregated_(disaggregated),
        state_(state),
        output_peer_(std::move(output_peer)),
        prefill_peer_(std::move(prefill_peer)) {}

  uint64_t job_id_ = 0;
  bool disaggregated_ = false;
  AttemptState state_ = AttemptState::kFinished;
  std::string output_peer_;
  std::string prefill_peer_;
  Clock::time_point last_output_{};
};

}  // namespace pdserve::router
