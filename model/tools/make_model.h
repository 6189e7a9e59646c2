// Random DeepSeek-V3.2-architecture checkpoints in the real Hugging Face format, so the loader
// that reads them is the one that reads a published checkpoint.
//
// Weights are drawn from a fixed, portable PRNG (same seed -> same bytes on any machine) and
// scaled so activations stay in a sane range through every layer: each linear has std
// gain/sqrt(n_in), residual-branch outputs (o_proj, down_proj) are damped, and the router gets
// wide score gaps so expert choices have clear margins (see docs/model-numerics.md).
// Presets: "tiny" (tests: YaRN on, index_topk 16 so prompts of a few dozen tokens are sparse),
// "tiny2" (tests: odd sizes with partial 128-blocks, no YaRN), "small" (benchmarks: 6 layers,
// 64 experts top-8, index_topk 512, ~750 MB in BF16).
#pragma once

#include <cstdint>
#include <string>

#include "common/status.h"
#include "model/config.h"

namespace pdserve::model {

struct MakeModelOptions {
  std::string preset = "tiny";
  std::string out_dir;
  uint64_t seed = 1;
  int64_t vocab = 0;             // 0: the preset's default
  std::string dtype = "bf16";    // "bf16" or "fp8" (F8_E4M3 + 128x128 weight_scale_inv)
  int64_t max_shard_bytes = 0;   // 0: the preset's default (tiny presets use several shards)
};

// The config of a preset. Errors: InvalidArgument for an unknown preset name.
Result<ModelConfig> PresetConfig(const std::string& preset, int64_t vocab_override);

// Writes config.json, model-0000X-of-0000N.safetensors and model.safetensors.index.json.
// Errors: InvalidArgument (bad options), Internal (I/O).
Status MakeModel(const MakeModelOptions& options);

}  // namespace pdserve::model
