// Variants of two steps of the forward pass that test binaries and benchmarks install; a shipped
// binary never does, and the defaults are the model:
//
//   indexer RoPE    the rotation of the Lightning Indexer's rope part of one row; default
//                   kernels::ApplyRopeHalfSplit. The accuracy tests install a deliberately wrong
//                   one (MLA's interleaved layout, the classic pre-fix DeepSeek-V3.2 bug) to
//                   prove that `pdserve compare` and the golden tests catch a real numerics bug
//                   and name the first layer it breaks (model/golden_test.cc,
//                   services/testing/numerics_fault/).
//   per-expert MoE  W8A8 routed experts run one Mlp per expert (the BF16 path's structure)
//                   instead of the grouped INT8 GEMMs: the reference the grouped path is
//                   compared against bit for bit (model/w8a8_test.cc, bench/w8a8).
//
// Thread-safety: process-wide atomics; set them before running a forward pass, not during one.
#pragma once

#include <cstdint>

namespace pdserve::model {

// Rotates x[0, dr) for position `pos` (kernels/rope.h's signature).
using RopeFn = void (*)(float* x, int64_t dr, int64_t pos, const float* freqs);

// nullptr restores the model's own (half-split) RoPE.
void SetIndexerRopeVariant(RopeFn rope);
RopeFn indexer_rope_variant();  // nullptr when none is installed

void SetPerExpertMoeVariant(bool per_expert);
bool per_expert_moe_variant();

}  // namespace pdserve::model
