// Greedy decoding drivers for a model running under a parallel plan (model/parallel.h): the
// model-level form of what a serving engine does per DP rank, used by `pdserve generate
// --plan`, the multi-rank tests and bench/parallel.
//
//   RunGreedyCp  one prompt per unit: CP prefill (Model::ForwardCp) across the unit's CP ranks,
//                then greedy decode replicated on every rank of the unit (each has the full KV).
//   RunGreedyDp  each unit decodes its own set of prompts as one continuous batch (prefill
//                of every prompt, then one decode row per live sequence per step), and a
//                comm::DpCoordinator keeps all units in lock-step: a unit with nothing left runs
//                dummy steps (ForwardBatch with no rows, entering every EP exchange) while
//                others still decode, so the EP collectives never deadlock.
//
// Every rank of the instance must call the same driver; the ranks of one unit pass the same
// prompts. RunGreedyDp checks every request before the first step and, for a bad one, votes
// "failed" so that every rank stops (kAborted elsewhere) instead of waiting in an exchange. Greedy = argmax, lowest id on ties; no stop on EOS (like RunGreedy).
// Errors: those of the model calls; kAborted from RunGreedyDp when another rank failed.
// Threading: the caller's thread (MPI_THREAD_FUNNELED).
#pragma once

#include <cstdint>
#include <vector>

#include "comm/dp_coordinator.h"
#include "model/greedy_run.h"

namespace pdserve::model {

// Fills prompt, output, prefill_logits, step_logits and the timings (no traces).
Result<GreedyRun> RunGreedyCp(const Model& model, const std::vector<int32_t>& prompt, int64_t max_new);

struct DpRunStats {
  int64_t steps = 0;          // coordinator steps taken
  int64_t forward_steps = 0;  // steps with rows of this unit
  int64_t dummy_steps = 0;    // steps this unit ran with no rows while others worked
  double seconds = 0;         // wall time of the whole run
  double decode_seconds = 0;  // wall time of the steps after every prefill
  int64_t decode_steps = 0;
};

struct DpRunOptions {
  // Record what a dump needs (GreedyRun::prefill and topk_decode, model/greedy_run.h) on every
  // rank of the unit. Must be the same on every rank of the instance (the CP prefill gathers
  // its trace collectively).
  bool trace = false;
  KvCacheFormats kv;  // the caches' storage formats
  // When set: every step's op profile (model/profile_ops.h; dummy steps count as decode, the
  // coordinator's vote as MPI).
  OpProfile* profile = nullptr;
};

// runs[i] for prompts[i] (max_new[i] tokens each; 0 is allowed). With cp > 1 each prompt's
// prefill is a CP prefill taking one step of its own.
Result<std::vector<GreedyRun>> RunGreedyDp(const Model& model, comm::DpCoordinator* coordinator,
                                           const std::vector<std::vector<int32_t>>& prompts,
                                           const std::vector<int64_t>& max_new, DpRunStats* stats = nullptr,
                                           const DpRunOptions& options = {});

}  // namespace pdserve::model
