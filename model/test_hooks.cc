#include "model/test_hooks.h"

#include <atomic>

namespace pdserve::model {

namespace {
std::atomic<NumericsFault> g_fault{NumericsFault::kNone};  // relaxed: set before a forward pass
}  // namespace

void TEST_SetNumericsFault(NumericsFault fault) { g_fault.store(fault, std::memory_order_relaxed); }
NumericsFault TEST_numerics_fault() { return g_fault.load(std::memory_order_relaxed); }

}  // namespace pdserve::model
