// Test-only numerics faults: deliberately broken variants of the forward pass, used to prove
// that the accuracy tooling (pdserve compare, the golden tests) catches a real numerics bug and
// names the first layer it breaks. Never set outside tests; the default is no fault.
// Thread-safety: the fault is a process-wide atomic; set it before running a forward pass.
#pragma once

namespace pdserve::model {

enum class NumericsFault {
  kNone,
  // The indexer rotates interleaved pairs (MLA's layout) instead of half-split pairs: the
  // classic bug of pre-fix DeepSeek-V3.2 code.
  kIndexerRopeInterleaved,
};

void TEST_SetNumericsFault(NumericsFault fault);
NumericsFault TEST_numerics_fault();

// When set, W8A8 routed experts run one Mlp per expert (the BF16 path's structure) instead of
// the grouped INT8 GEMMs: the reference the grouped path is compared against bit for bit.
void TEST_SetPerExpertMoe(bool per_expert);
bool TEST_per_expert_moe();

}  // namespace pdserve::model
