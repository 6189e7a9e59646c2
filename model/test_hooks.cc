#include "model/test_hooks.h"

#include <atomic>

namespace pdserve::model {

namespace {
std::atomic<NumericsFault> g_fault{NumericsFault::kNone};  // relaxed: set before a forward pass
std::atomic<bool> g_per_expert_moe{false};
}  // namespace

void TEST_SetNumericsFault(NumericsFault fault) { g_fault.store(fault, std::memory_order_relaxed); }
NumericsFault TEST_numerics_fault() { return g_fault.load(std::memory_order_relaxed); }
void TEST_SetPerExpertMoe(bool per_expert) { g_per_expert_moe.store(per_expert, std::memory_order_relaxed); }
bool TEST_per_expert_moe() { return g_per_expert_moe.load(std::memory_order_relaxed); }

}  // namespace pdserve::model
