// OpProfile: where the wall time of forward steps goes, op by op (`bench_engine --profile`,
// `pdserve generate --profile` / PDSERVE_PROFILE=1).
//
// Attribution is exclusive and per thread: the thread that drives a step (the engine loop, the
// greedy loop) opens an OpProfileStep, and from then on every instant of its wall time belongs
// to exactly one op, the innermost OpScope open on that thread (op kOther outside any scope).
// Nested scopes take their time away from the enclosing one, so the ops of a step sum to the
// step's wall time. The thread pool marks the time its calling thread spends waiting for
// chunks other threads still run (kPoolWait) and counts parallel regions; worker threads
// themselves record nothing (their work shows up as the caller's op time, their lag as pool
// wait). Each pool wait is also charged to the op it interrupted (wait_seconds), so the table
// says which op's parallel regions leave the caller waiting (imbalance, a worker descheduled).
//
// Op ids are small integers: kOther and kPoolWait are fixed here, the rest are the caller's
// (model/op_profile_ops.h names the forward's ops), up to kMaxOps; names are given to the
// profile at construction. Phases (prefill / decode) are chosen per step by the driver.
//
// Cost when off: one thread-local load and a branch per scope (no clock read); a forward step
// opens a few dozen scopes per layer. When on: two clock reads per scope (~50 ns).
// Thread-safety: an OpProfile is written only by the threads that have it open in an
// OpProfileStep, one at a time (the step driver); read it between steps.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

namespace pdserve {

class OpProfile {
 public:
  static constexpr int kMaxOps = 24;
  static constexpr int kMaxPhases = 2;
  static constexpr int kOther = 0;     // the step's time outside every named op
  static constexpr int kPoolWait = 1;  // the caller waiting for pool workers to finish chunks

  // op_names[i] names op i (op_names[0] and [1] are kOther and kPoolWait's labels);
  // phase_names[p] names phase p. REQUIRES: sizes <= kMaxOps / kMaxPhases.
  OpProfile(std::vector<std::string> op_names, std::vector<std::string> phase_names);

  void Reset();
  int n_ops() const { return static_cast<int>(op_names_.size()); }
  int n_phases() const { return static_cast<int>(phase_names_.size()); }
  const std::string& op_name(int op) const { return op_names_[static_cast<size_t>(op)]; }
  const std::string& phase_name(int phase) const { return phase_names_[static_cast<size_t>(phase)]; }

  double seconds(int phase, int op) const { return static_cast<double>(ns_[phase][op]) * 1e-9; }
  // The part of kPoolWait's time spent inside `op`'s parallel regions (the waits sum to
  // seconds(phase, kPoolWait)).
  double wait_seconds(int phase, int op) const { return static_cast<double>(wait_ns_[phase][op]) * 1e-9; }
  double total_seconds(int phase) const;  // sum over ops = wall time of the phase's steps
  int64_t steps(int phase) const { return steps_[phase]; }
  int64_t parallel_regions(int phase) const { return regions_[phase]; }

  // A table (markdown) of each phase's op shares, ms per step (and the pool wait inside the
  // op's regions, ms per step) and parallel regions per step.
  std::string Table() const;

 private:
  friend class OpProfileStep;

  std::vector<std::string> op_names_, phase_names_;
  std::array<std::array<int64_t, kMaxOps>, kMaxPhases> ns_{}, wait_ns_{};
  std::array<int64_t, kMaxPhases> steps_{}, regions_{};
};

// The calling thread's attribution state (internal; read inline by OpScope).
struct OpProfileThread {
  OpProfile* profile = nullptr;  // null: profiling off on this thread
  int op = OpProfile::kOther;
  int64_t mark_ns = 0;           // when the current op's running interval began
  int64_t ns[OpProfile::kMaxOps] = {};  // the open step's time per op
  int64_t wait_ns[OpProfile::kMaxOps] = {};  // the open step's pool waits, by the op they interrupted
  int64_t regions = 0;                  // the open step's parallel regions
};
extern constinit thread_local OpProfileThread op_profile_thread;

int64_t OpProfileNowNs();

// Opens one step of `phase` on the calling thread (profile may be null: no-op). Steps do not
// nest (an inner one is ignored). The step's times are added to its phase when it closes, so
// the phase may be set once the driver knows it (set_phase).
class OpProfileStep {
 public:
  OpProfileStep(OpProfile* profile, int phase);
  ~OpProfileStep();
  void set_phase(int phase) { phase_ = phase; }
  // The step is not counted (e.g. it turned out to have no work).
  void discard() { discard_ = true; }
  OpProfileStep(const OpProfileStep&) = delete;
  OpProfileStep& operator=(const OpProfileStep&) = delete;

 private:
  OpProfile* profile_ = nullptr;  // set when this step is the thread's open one
  int phase_ = 0;
  bool discard_ = false;
};

// Attributes the calling thread's time to `op` until the scope ends (then back to the
// enclosing op).
class OpScope {
 public:
  explicit OpScope(int op) {
    if (op_profile_thread.profile != nullptr) [[unlikely]] Enter(op);
  }
  ~OpScope() {
    if (prev_ >= 0) [[unlikely]] Leave();
  }
  // From now on the scope's time goes to `op` (one scope over consecutive ops).
  void Switch(int op) {
    if (prev_ >= 0) [[unlikely]] SwitchTo(op);
  }
  OpScope(const OpScope&) = delete;
  OpScope& operator=(const OpScope&) = delete;

 private:
  void Enter(int op);
  void Leave();
  void SwitchTo(int op);
  int prev_ = -1;
};

// Counts one parallel region in the current step (the thread pool calls it).
inline void OpProfileCountParallelRegion() {
  if (op_profile_thread.profile != nullptr) [[unlikely]] ++op_profile_thread.regions;
}

}  // namespace pdserve
