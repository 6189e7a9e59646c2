// W8A8 accuracy against the BF16 engine: the same prompt through a BF16 (or FP8) checkpoint and
// its W8A8 conversion, compared layer by layer and over greedy decoding. Used by
// model/w8a8_accuracy_test.cc (tiny presets) and bench/w8a8 (the `small` preset).
// Thread-safety: one call at a time per pool.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"
#include "common/thread_pool.h"

namespace pdserve::model {

struct AccuracyReport {
  std::vector<double> layer_cos;  // per layer: cos-sim of the residual stream over the prompt
  double min_layer_cos = 1.0;
  // Per layer alone: each W8A8 layer fed the reference's input to that layer
  // (ForwardOptions::forced_layer_inputs), routing free. The error a layer adds, without the
  // drift of the layers before it.
  std::vector<double> isolated_layer_cos;
  double isolated_min_layer_cos = 1.0;
  double logits_cos = 0.0;        // last prompt position
  int64_t steps = 0;              // greedy steps compared
  // Teacher-forced: both engines decode the BF16 engine's greedy tokens; a step agrees when
  // their argmax is the same.
  int64_t top1_agree = 0;
  double min_step_logits_cos = 1.0;
  double mean_step_logits_cos = 0.0;
  // Free-running: the W8A8 engine's own greedy tokens equal the BF16 ones for this many steps.
  int64_t free_run_prefix = 0;
  // Discrete choices over the prompt: routed-expert slots (row, layer, slot) where the W8A8
  // engine picked an expert the reference did not, out of all slots.
  int64_t expert_flips = 0;
  int64_t expert_slots = 0;
  // The prompt once more with the W8A8 engine's discrete choices pinned to the reference's
  // (its experts and indexer selections: ForwardOptions::forced_experts / forced_topk), so only
  // the continuous error of the quantized arithmetic remains.
  std::vector<double> pinned_layer_cos;
  double pinned_min_layer_cos = 1.0;
  double pinned_logits_cos = 0.0;
};

// Runs `prompt` then `steps` greedy steps on both checkpoints. Errors: load or forward errors.
Result<AccuracyReport> CompareW8A8(const std::string& reference_dir, const std::string& w8a8_dir,
                                   const std::vector<int32_t>& prompt, int64_t steps, ThreadPool* pool);

}  // namespace pdserve::model
