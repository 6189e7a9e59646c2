// CompareDumps: layer-by-layer comparison of two dump directories (model/tools/greedy_run.h layout;
// the Python reference writes the same), for `pdserve compare` and the golden tests.
//
// Reports, per layer, the cos-sim and max |a-b| of the hidden states, the cos-sim of the
// finite index scores, the top-k set overlap and (when both dumps have experts.npy) the routed
// expert overlap; per greedy step the logits cos-sim; the top-k overlap of the decode steps;
// and the first step whose greedy token differs. Passes when every figure meets its threshold.
// Thread-safety: pure functions.
#pragma once

#include <string>
#include <vector>

#include "common/status.h"

namespace pdserve::model {

struct CompareThresholds {
  double hidden_cos = 0.999;
  double logits_cos = 0.999;
  double topk_overlap = 0.99;
  double index_cos = 0.9999;  // rounding-level differences stay above 0.99999
  // Decode-step selections (topk_decode.npy, when both dumps have it), over the steps before
  // the first diverging greedy token.
  double decode_topk_overlap = 0.99;
  // Greedy tokens must agree over the first `min_agreeing_steps` steps (-1: every compared
  // step). Past a divergence the two dumps decode different sequences: logits and decode
  // selections are compared only up to it.
  int64_t min_agreeing_steps = -1;
};

struct LayerComparison {
  double hidden_cos = 1, hidden_max_abs = 0;
  double index_cos = 1;      // layers only (row 0 = embedding has none)
  double topk_overlap = 1;
  // Fraction of routed-expert choices both dumps made for this layer's prompt rows (from
  // experts.npy); -1 for a dense layer or when a dump has no experts.npy. Informational: a
  // near-tie in the router flips legitimately, so it has no threshold.
  double expert_overlap = -1;
};

struct CompareReport {
  std::vector<LayerComparison> rows;  // [n_layers + 1]: row 0 embedding, row l layer l-1
  std::vector<double> step_logits_cos;
  int64_t first_token_mismatch = -1;  // -1: greedy tokens agree over the common steps
  int64_t steps_compared = 0;
  double decode_topk_overlap = 1;     // over decode_steps_compared steps x layers
  int64_t decode_steps_compared = 0;  // 0 when a dump has no topk_decode.npy
  bool passed = true;
  std::string first_failure;          // e.g. "layer 2 hidden cos 0.93 < 0.999"
  // A human-readable table.
  std::string ToString() const;
};

// Errors: NotFound / InvalidArgument when a dump is missing files or the shapes differ.
Result<CompareReport> CompareDumps(const std::string& dir_a, const std::string& dir_b,
                                   const CompareThresholds& thresholds);

}  // namespace pdserve::model
