// ChargeLedger: the router's accounting of the work it placed on each worker, which the routing
// policies read (routing_policy.h): per worker, outstanding requests, outstanding tokens and an
// estimate of its free KV blocks.
//
// Every job of an attempt (attempt.h: the output job, and the prefill job of a disaggregated
// attempt) is one open charge, opened when the attempt is placed and closed exactly once,
// whichever way the job ends:
//
//   Charge(job, side, worker, tokens, blocks)   worker: +1 request, +tokens, -blocks free
//   Consume(job, side, n)                       worker: -n tokens (output arrived), at most
//                                               what the charge still holds
//   Release(job, side) / ReleaseAttempt(job)    worker: -1 request, -the tokens still held;
//                                               the charge is closed, a second Release finds
//                                               nothing and changes nothing
//   Served(job, side)                           Release, for a job whose work on the worker
//                                               is done (a prefill's first token came back)
//   ForgetWorker(worker)                        the worker left the registry: its charges are
//                                               closed without crediting anything (there is
//                                               no entry left to credit)
//
// A migration closes the old attempt's charges and opens the new attempt's (a new job id), so
// the charge moves with the request. The WorkerEntry counters are written by nothing else, so
// each worker's counters always equal the sum of its open charges (Audit() checks it).
//
// Charges are tied to one registration (WorkerEntry::registration), not to a peer: a worker
// that registers again at the same peer or with the same id starts from zero, and a release of
// a charge taken on its previous registration never touches the new one.
//
// KV blocks: Charge takes the request's blocks off the worker's free estimate at once, so the
// next placement sees them gone before the worker's next heartbeat; Release does not give them
// back, because the heartbeat that follows reports the worker's real free count (it resets the
// estimate, worker_registry.h) and a credit on top of it would count the freed blocks twice.
//
// Prefill pace: prefill charges also open and close on the worker's PrefillPace
// (prefill_pace.h), and a Served one teaches it the worker's speed, so kv_aware can tell how much
// of a placed prompt is probably computed already.
//
// Thread-safety: none; RouterCore owns it (and the registry it borrows) under its mutex.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>

#include "common/status.h"
#include "services/router/attempt.h"
#include "services/router/worker_registry.h"

namespace pdserve::router {

struct OpenCharge {
  std::string peer;
  std::string worker_id;
  uint64_t registration = 0;
  int64_t tokens = 0;  // outstanding tokens still charged
  int64_t blocks = 0;  // taken off the free-KV estimate at placement
};

class ChargeLedger {
 public:
  // `registry` is borrowed and must outlive the ledger.
  explicit ChargeLedger(WorkerRegistry* registry) : registry_(registry) {}

  // Opens the charge of job `job_id`'s `side` on `worker`. REQUIRES: `worker` is registered in
  // the registry and no charge of (job_id, side) is open.
  void Charge(uint64_t job_id, AttemptSide side, WorkerEntry& worker, int64_t tokens, int64_t blocks,
              Clock::time_point now = Clock::now());
  // `n_tokens` tokens of the charge were produced: returns how many were taken off (at most
  // what it still holds; 0 when no charge is open). REQUIRES: `side` is kOutput (a prefill
  // charge is owed whole until its first token).
  int64_t Consume(uint64_t job_id, AttemptSide side, int64_t n_tokens);
  // Closes the charge and credits its worker (one request, the tokens still held). False when
  // no charge is open: never charged, already released, or its worker left.
  bool Release(uint64_t job_id, AttemptSide side, Clock::time_point now = Clock::now());
  // Release of a charge whose work the worker finished: a prefill charge's tokens and the time
  // they took teach the worker's pace.
  bool Served(uint64_t job_id, AttemptSide side, Clock::time_point now = Clock::now());
  // Release of both sides of an attempt; returns how many charges were closed (0, 1 or 2).
  int ReleaseAttempt(uint64_t job_id);
  // The worker `gone` left the registry: closes its charges without crediting. Returns how many.
  int ForgetWorker(const WorkerEntry& gone);

  // The open charge of (job_id, side), or nullptr.
  const OpenCharge* Find(uint64_t job_id, AttemptSide side) const;
  size_t open() const { return charges_.size(); }
  // Internal (naming the first mismatch) unless every registered worker's outstanding
  // requests and tokens equal the sum of its open charges, its prefill pace holds exactly its
  // open prefill charges, and every open charge belongs to a registered worker.
  Status Audit() const;

 private:
  using Key = std::pair<uint64_t, AttemptSide>;
  // The registry entry the charge was taken on, if it is still registered.
  WorkerEntry* EntryOf(const OpenCharge& charge) const;
  bool Close(uint64_t job_id, AttemptSide side, bool served, Clock::time_point now);

  WorkerRegistry* const registry_;
  std::map<Key, OpenCharge> charges_;
};

}  // namespace pdserve::router
