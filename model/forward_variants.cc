#include "model/forward_variants.h"

#include <atomic>

namespace pdserve::model {

namespace {
std::atomic<RopeFn> g_indexer_rope{nullptr};  // relaxed: set before a forward pass
std::atomic<bool> g_per_expert_moe{false};
}  // namespace

void SetIndexerRopeVariant(RopeFn rope) { g_indexer_rope.store(rope, std::memory_order_relaxed); }
RopeFn indexer_rope_variant() { return g_indexer_rope.load(std::memory_order_relaxed); }
void SetPerExpertMoeVariant(bool per_expert) { g_per_expert_moe.store(per_expert, std::memory_order_relaxed); }
bool per_expert_moe_variant() { return g_per_expert_moe.load(std::memory_order_relaxed); }

}  // namespace pdserve::model
