// BlockPool / BlockTable and Scheduler tests (no model needed).
#include "engine/block_pool.h"

#include <gtest/gtest.h>

#include <cstdlib>

#include "engine/scheduler.h"

namespace pdserve::engine {
namespace {

KvLayout TestLayout(int64_t block_tokens) {
  KvLayout l;
  l.num_layers = 2;
  l.kv_lora_rank = 128;
  l.qk_rope_head_dim = 64;
  l.index_head_dim = 128;
  l.tokens_per_block = static_cast<uint32_t>(block_tokens);
  return l;
}

TEST(BlockPoolTest, SizedFromBudgetAllOrNothingLowestFirst) {
  const KvLayout l = TestLayout(16);
  // fp8: 128 codes + 4 scale bytes + 128 rope + 128 index + 4 = 392 bytes/token/layer.
  EXPECT_EQ(l.TokenBytesPerLayer(), 392u);
  EXPECT_EQ(l.SlabBytes() % KvLayout::kComponentAlign, 0u);
  auto pool = BlockPool::Create(l, 10 * static_cast<int64_t>(l.BlockBytes()) + 5);
  ASSERT_TRUE(pool.ok()) << pool.status().ToString();
  BlockPool& p = **pool;
  EXPECT_EQ(p.n_blocks(), 10);
  EXPECT_EQ(p.capacity_tokens(), 160);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(p.base()) % BlockPool::kAlignment, 0u);
  std::vector<int32_t> a;
  ASSERT_TRUE(p.Allocate(3, &a).ok());
  EXPECT_EQ(a, (std::vector<int32_t>{0, 1, 2}));
  std::vector<int32_t> b;
  EXPECT_EQ(p.Allocate(8, &b).code(), StatusCode::kResourceExhausted);
  EXPECT_TRUE(b.empty());
  EXPECT_EQ(p.n_free(), 7);
  p.Free(a);
  EXPECT_EQ(p.n_free(), 10);
  EXPECT_EQ(BlockPool::Create(l, static_cast<int64_t>(l.BlockBytes()) - 1).status().code(), StatusCode::kInvalidArgument);
}

TEST(BlockPoolTest, CallerMemoryAndBlockTable) {
  const KvLayout l = TestLayout(4);
  const int64_t bytes = 6 * static_cast<int64_t>(l.BlockBytes());
  void* mem = std::aligned_alloc(BlockPool::kAlignment, static_cast<size_t>((bytes + 4095) / 4096 * 4096));
  auto pool = BlockPool::CreateOver(l, static_cast<uint8_t*>(mem), bytes);
  ASSERT_TRUE(pool.ok());
  EXPECT_EQ((*pool)->base(), mem);
  EXPECT_EQ((*pool)->size_bytes(), bytes);
  EXPECT_EQ(BlockPool::CreateOver(l, static_cast<uint8_t*>(mem) + 8, bytes - 8).status().code(),
            StatusCode::kInvalidArgument);
  BlockTable t;
  ASSERT_TRUE(t.EnsureCapacity(pool->get(), 9).ok());  // 3 blocks
  EXPECT_EQ(t.n_blocks(), 3);
  ASSERT_TRUE(t.EnsureCapacity(pool->get(), 12).ok());  // still 3
  EXPECT_EQ(t.n_blocks(), 3);
  EXPECT_EQ(t.EnsureCapacity(pool->get(), 40).code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(t.n_blocks(), 3);
  const model::KvSequenceRef ref = t.Ref(**pool);
  EXPECT_EQ(ref.capacity_tokens, 12);
  // Token 5 of layer 1's rope lives in block ids[1], slot 1.
  EXPECT_EQ(ref.Field(1, KvComponent::kRope, 5),
            (*pool)->base() + t.ids()[1] * l.BlockBytes() + l.SlabBytes() + l.ComponentOffset(KvComponent::kRope) + 1 * 128);
  t.Release(pool->get());
  EXPECT_EQ((*pool)->n_free(), 6);
  pool->reset();
  std::free(mem);
}

// A request with `prompt` tokens and `out` generated tokens, KV computed up to `computed`.
Request MakeRequest(int64_t arrival, int64_t prompt, int64_t out = 0) {
  Request r;
  r.id = static_cast<RequestId>(arrival + 1);
  r.arrival = arrival;
  r.prompt_len = prompt;
  r.tokens.assign(static_cast<size_t>(prompt + out), 1);
  return r;
}

TEST(SchedulerTest, GridChunksBudgetAndSeqLimit) {
  auto pool = BlockPool::Create(TestLayout(4), 100 * static_cast<int64_t>(TestLayout(4).BlockBytes()));
  ASSERT_TRUE(pool.ok());
  SchedulerOptions o;
  o.max_num_seqs = 3;
  o.max_step_tokens = 20;
  o.prefill_chunk = 8;
  Scheduler s(o, pool->get());
  std::vector<Request> rs = {MakeRequest(0, 19), MakeRequest(1, 5), MakeRequest(2, 7), MakeRequest(3, 2)};
  for (auto& r : rs) s.AddWaiting(&r);
  SchedulerOutput a = s.Schedule();
  // r0 gets [0, 8); r1 all 5 (13 used); r2's 7 do not fit the 7 left? 13 + 7 = 20: fits.
  ASSERT_EQ(a.chunks.size(), 3u);
  EXPECT_EQ(a.chunks[0].n, 8);
  EXPECT_FALSE(a.chunks[0].sample);
  EXPECT_EQ(a.chunks[1].n, 5);
  EXPECT_TRUE(a.chunks[1].sample);
  EXPECT_EQ(a.chunks[2].n, 7);
  EXPECT_EQ(s.n_running(), 3);  // max_num_seqs: r3 waits
  s.Commit(a);
  rs[1].tokens.push_back(1);  // r1, r2 sampled a token
  rs[2].tokens.push_back(1);
  SchedulerOutput b = s.Schedule();
  ASSERT_EQ(b.chunks.size(), 3u);
  EXPECT_EQ(b.chunks[0].start, 8);  // the grid: [8, 16)
  EXPECT_EQ(b.chunks[0].n, 8);
  EXPECT_EQ(b.chunks[1].n, 1);
  EXPECT_EQ(b.chunks[1].grouping, model::RowGrouping::kPerRow);
  s.Commit(b);
  // r0's last chunk [16, 19) is 3 tokens: the grid never cuts elsewhere.
  SchedulerOutput c = s.Schedule();
  EXPECT_EQ(c.chunks[0].start, 16);
  EXPECT_EQ(c.chunks[0].n, 3);
  EXPECT_TRUE(c.chunks[0].sample);
}

TEST(SchedulerTest, PreemptsLatestWhenBlocksRunOutAndRecomputesOutputs) {
  const KvLayout l = TestLayout(4);
  auto pool = BlockPool::Create(l, 4 * static_cast<int64_t>(l.BlockBytes()));  // 16 tokens
  ASSERT_TRUE(pool.ok());
  SchedulerOptions o;
  o.max_step_tokens = 64;
  o.prefill_chunk = 64;
  o.twin_prompts = false;  // the two prompts are equal: both must compute it here
  Scheduler s(o, pool->get());
  std::vector<Request> rs = {MakeRequest(0, 8), MakeRequest(1, 8)};
  for (auto& r : rs) s.AddWaiting(&r);
  SchedulerOutput a = s.Schedule();
  ASSERT_EQ(a.chunks.size(), 2u);  // 2 + 2 blocks: the pool is full
  s.Commit(a);
  rs[0].tokens.push_back(1);
  rs[1].tokens.push_back(1);
  // Both need a 3rd block for position 8: r1 (latest) is preempted, r0 decodes.
  SchedulerOutput b = s.Schedule();
  ASSERT_EQ(b.chunks.size(), 1u);
  EXPECT_EQ(b.chunks[0].request, &rs[0]);
  ASSERT_EQ(b.preempted.size(), 1u);
  EXPECT_EQ(b.preempted[0], &rs[1]);
  EXPECT_EQ(rs[1].num_computed, 0);
  EXPECT_EQ(rs[1].blocks.n_blocks(), 0);
  EXPECT_EQ(s.total_preemptions(), 1);
  s.Commit(b);
  s.Remove(&rs[0]);  // r0 finishes
  // r1 comes back: prompt chunk first, then its output token as a per-row run.
  SchedulerOutput c = s.Schedule();
  ASSERT_EQ(c.chunks.size(), 1u);
  EXPECT_EQ(c.chunks[0].n, 8);
  EXPECT_FALSE(c.chunks[0].sample);
  s.Commit(c);
  SchedulerOutput d = s.Schedule();
  EXPECT_EQ(d.chunks[0].start, 8);
  EXPECT_EQ(d.chunks[0].n, 1);
  EXPECT_EQ(d.chunks[0].grouping, model::RowGrouping::kPerRow);
  EXPECT_TRUE(d.chunks[0].sample);
  s.Commit(d);
  s.Remove(&rs[1]);
  EXPECT_EQ((*pool)->n_free(), 4);
}

TEST(SchedulerTest, WholePromptsRunAloneAndFirst) {
  auto pool = BlockPool::Create(TestLayout(4), 100 * static_cast<int64_t>(TestLayout(4).BlockBytes()));
  ASSERT_TRUE(pool.ok());
  SchedulerOptions o;
  o.max_step_tokens = 16;
  o.prefill_chunk = 8;
  o.whole_prompts = true;
  Scheduler s(o, pool->get());
  std::vector<Request> rs = {MakeRequest(0, 30), MakeRequest(1, 5)};
  for (auto& r : rs) s.AddWaiting(&r);
  // r0's 30 tokens in one chunk (past the chunk grid and the budget), alone.
  SchedulerOutput a = s.Schedule();
  ASSERT_EQ(a.chunks.size(), 1u);
  EXPECT_EQ(a.chunks[0].request, &rs[0]);
  EXPECT_EQ(a.chunks[0].start, 0);
  EXPECT_EQ(a.chunks[0].n, 30);
  EXPECT_EQ(a.chunks[0].grouping, model::RowGrouping::kChunk);
  EXPECT_TRUE(a.chunks[0].sample);
  s.Commit(a);
  rs[0].tokens.push_back(1);
  // A waiting prompt goes before the running request's decode row, again alone.
  SchedulerOutput b = s.Schedule();
  ASSERT_EQ(b.chunks.size(), 1u);
  EXPECT_EQ(b.chunks[0].request, &rs[1]);
  EXPECT_EQ(b.chunks[0].n, 5);
  s.Commit(b);
  rs[1].tokens.push_back(1);
  // Nothing waits: both decode together.
  SchedulerOutput c = s.Schedule();
  ASSERT_EQ(c.chunks.size(), 2u);
  EXPECT_EQ(c.chunks[0].n, 1);
  EXPECT_EQ(c.chunks[1].n, 1);
}

}  // namespace
}  // namespace pdserve::engine
