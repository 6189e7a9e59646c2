// The ops a forward step is profiled by (common/op_profile.h): ids and names shared by the
// model, the engine and the drivers that print a profile (bench_engine --profile,
// pdserve generate --profile).
#pragma once

#include <string>
#include <vector>

#include "common/op_profile.h"

namespace pdserve::model {

enum ProfileOp : int {
  kOpOther = OpProfile::kOther,        // norms, residual adds, embedding, batch glue
  kOpPoolWait = OpProfile::kPoolWait,  // the step thread waiting for pool workers
  kOpMpi,            // every collective / exchange (TP, EP, CP, unit gathers)
  kOpMlaProlog,      // q_a, q_norm, q_b, rope, kv_a, kv_norm, latent + rope key written
  kOpIndexer,        // indexer projections, keys written, scores
  kOpIndexerTopk,    // top-k selection over the scores
  kOpAttention,      // sparse attention: q absorption, gather, scores, softmax, W_uv (or the prefill form)
  kOpOProj,          // attention output projection
  kOpGate,           // router GEMM + group-limited top-k
  kOpRoutedExperts,  // routed experts, incl. gathering rows and the weighted sums; single-process
                     // MoE layers run the shared expert in the same pass (counted here)
  kOpSharedExpert,   // the shared expert where it runs on its own (EP: during the exchanges)
  kOpDenseFfn,
  kOpLmHead,         // final norm + lm_head
  kOpSampling,       // sampling / argmax of the step's logits
  kOpEngine,         // scheduling, batch building, events (engine steps only)
  kOpCount
};

enum ProfilePhase : int { kPhasePrefill = 0, kPhaseDecode = 1 };

inline OpProfile MakeForwardProfile() {
  return OpProfile({"other (norms, residual, glue)", "thread-pool wait", "MPI", "MLA prolog", "indexer", "indexer top-k",
                    "sparse attention", "o_proj", "gate", "routed (+ shared) experts", "shared expert (EP)", "dense FFN", "lm_head",
                    "sampling", "engine (schedule, events)"},
                   {"prefill", "decode"});
}

}  // namespace pdserve::model
