// KvIndex (kv_index.h): the per-worker sets follow the KV events (reset, stored, removed), a
// worker's entries go with it, and the predicted hit follows the engine's rule over the prompt's
// chained block names: whole blocks held in a row from the first, never the prompt's last
// token, at least the first chunk or nothing, only under the worker's own namespace. The names
// are common/block_hash.h's, the engine's (services/worker/kv_events_parity_test.cc checks the
// two against a real engine). To add a case: store some block names of a prompt with Apply and
// compare PredictHitTokens with what the rule gives by hand.
#include "services/router/kv_index.h"

#include <gtest/gtest.h>

#include "common/block_hash.h"

namespace pdserve::router {
namespace {

using services::KvEventsMsg;

constexpr uint64_t kNs = 77;
constexpr uint32_t kB = 16;
constexpr uint32_t kC = 32;

std::vector<int32_t> Prompt(size_t n, int32_t salt = 0) {
  std::vector<int32_t> p(n);
  for (size_t i = 0; i < n; ++i) p[i] = static_cast<int32_t>((i * 7919 + static_cast<size_t>(salt) * 104729) % 5000);
  return p;
}

// The names of blocks [from, to) of `prompt`, as the engine gives them.
std::vector<uint64_t> Names(const std::vector<int32_t>& prompt, int64_t from, int64_t to, uint64_t ns = kNs) {
  std::vector<uint64_t> chain;
  ExtendChain(ns, prompt, kB, to, &chain);
  return {chain.begin() + from, chain.end()};
}

int64_t Predict(const KvIndex& index, uint64_t worker, const std::vector<int32_t>& prompt) {
  PromptChains chains(prompt);
  return index.PredictHitTokens(worker, &chains);
}

TEST(KvIndexTest, PredictsTheEnginesHitRule) {
  const std::vector<int32_t> p = Prompt(220);  // 13 full blocks below the last token
  KvIndex index;
  EXPECT_EQ(Predict(index, 1, p), 0);  // nothing published
  ASSERT_TRUE(index.Apply(1, kNs, 100, KvEventsMsg{true, kB, kC, Names(p, 0, 6), {}}).ok());
  EXPECT_EQ(index.Blocks(1), 6);
  EXPECT_EQ(Predict(index, 1, p), 96);
  // A hole at block 3: the walk stops there.
  ASSERT_TRUE(index.Apply(1, kNs, 100, KvEventsMsg{false, kB, kC, {}, Names(p, 3, 4)}).ok());
  EXPECT_EQ(Predict(index, 1, p), 48);
  // One block (16 tokens) is below the first chunk (32): nothing.
  ASSERT_TRUE(index.Apply(1, kNs, 100, KvEventsMsg{false, kB, kC, {}, Names(p, 1, 2)}).ok());
  EXPECT_EQ(Predict(index, 1, p), 0);
  // Everything held: never the last token, so a prompt of exactly 13 blocks hits 12.
  const std::vector<int32_t> whole(p.begin(), p.begin() + 13 * kB);
  ASSERT_TRUE(index.Apply(1, kNs, 100, KvEventsMsg{true, kB, kC, Names(whole, 0, 13), {}}).ok());
  EXPECT_EQ(Predict(index, 1, whole), 12 * 16);
  // A prompt that diverges inside block 5 hits the 5 blocks before it.
  std::vector<int32_t> other = whole;
  other[5 * kB + 3] += 1;
  EXPECT_EQ(Predict(index, 1, other), 5 * 16);
  // Short prompts: at most (n - 1) / B blocks, and at least C of them.
  EXPECT_EQ(Predict(index, 1, std::vector<int32_t>(whole.begin(), whole.begin() + 33)), 32);
  EXPECT_EQ(Predict(index, 1, std::vector<int32_t>(whole.begin(), whole.begin() + 32)), 0);
  EXPECT_EQ(Predict(index, 1, std::vector<int32_t>(whole.begin(), whole.begin() + 1)), 0);
  // The names hold only under the worker's namespace: another worker, other namespace, no hit.
  ASSERT_TRUE(index.Apply(2, kNs + 1, 100, KvEventsMsg{true, kB, kC, Names(whole, 0, 13), {}}).ok());
  EXPECT_EQ(Predict(index, 2, whole), 0);
  ASSERT_TRUE(index.Apply(2, kNs + 1, 100, KvEventsMsg{true, kB, kC, Names(whole, 0, 13, kNs + 1), {}}).ok());
  EXPECT_EQ(Predict(index, 2, whole), 12 * 16);
  // A larger first chunk raises the bar.
  ASSERT_TRUE(index.Apply(1, kNs, 100, KvEventsMsg{true, kB, 256, Names(whole, 0, 13), {}}).ok());
  EXPECT_EQ(Predict(index, 1, whole), 0);
}

TEST(KvIndexTest, EventsResetsAndForgettingKeepEachWorkersSet) {
  const std::vector<int32_t> a = Prompt(100, 1), b = Prompt(100, 2);
  KvIndex index;
  ASSERT_TRUE(index.Apply(1, kNs, 100, KvEventsMsg{true, kB, kC, Names(a, 0, 6), {}}).ok());
  ASSERT_TRUE(index.Apply(2, kNs, 100, KvEventsMsg{true, kB, kC, Names(b, 0, 6), {}}).ok());
  EXPECT_EQ(index.workers(), 2u);
  // Each worker's hit is its own.
  PromptChains chains(a);  // shared by both workers of the namespace
  EXPECT_EQ(index.PredictHitTokens(1, &chains), 96);
  EXPECT_EQ(index.PredictHitTokens(2, &chains), 0);
  // Increments: stored and removed in one batch.
  ASSERT_TRUE(index.Apply(1, kNs, 100, KvEventsMsg{false, kB, kC, Names(b, 0, 2), Names(a, 4, 6)}).ok());
  EXPECT_EQ(index.Blocks(1), 6);
  EXPECT_EQ(Predict(index, 1, a), 64);
  EXPECT_EQ(Predict(index, 1, b), 32);
  // A reset replaces the whole set.
  ASSERT_TRUE(index.Apply(1, kNs, 100, KvEventsMsg{true, kB, kC, Names(b, 0, 1), {}}).ok());
  EXPECT_EQ(index.Blocks(1), 1);
  EXPECT_EQ(Predict(index, 1, a), 0);
  // A worker that goes away takes its entries along.
  index.Forget(2);
  EXPECT_EQ(index.Blocks(2), 0);
  EXPECT_EQ(Predict(index, 2, b), 0);
  EXPECT_EQ(index.workers(), 1u);
}

TEST(KvIndexTest, RefusesEventsItCannotUse) {
  const std::vector<int32_t> a = Prompt(200, 3);
  KvIndex index;
  // A worker that registered without a cache.
  EXPECT_EQ(index.Apply(1, 0, 100, KvEventsMsg{true, kB, kC, Names(a, 0, 2), {}}).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(index.workers(), 0u);
  // More blocks than its pool: the set is dropped, the next reset restores it.
  ASSERT_TRUE(index.Apply(1, kNs, 8, KvEventsMsg{true, kB, kC, Names(a, 0, 8), {}}).ok());
  EXPECT_EQ(index.Apply(1, kNs, 8, KvEventsMsg{false, kB, kC, Names(a, 8, 9), {}}).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(index.Blocks(1), 0);
  EXPECT_EQ(Predict(index, 1, a), 0);
  ASSERT_TRUE(index.Apply(1, kNs, 8, KvEventsMsg{true, kB, kC, Names(a, 0, 4), {}}).ok());
  EXPECT_EQ(Predict(index, 1, a), 64);
  // A change of block size starts the set over (old names mean nothing under the new size).
  ASSERT_TRUE(index.Apply(1, kNs, 8, KvEventsMsg{false, 32, kC, {}, {}}).ok());
  EXPECT_EQ(index.Blocks(1), 0);
}

// NoteDispatched: a prompt sent to a worker makes its full blocks pending there; they count
// for predictions until the worker reports them (then they are plain entries) or the TTL ends.
TEST(KvIndexTest, DispatchedPromptsArePendingUntilReportedOrExpired) {
  const std::vector<int32_t> p = Prompt(100, 4), q = Prompt(100, 5);
  KvIndex index(std::chrono::seconds(10));
  const auto t0 = KvIndex::Clock::time_point{} + std::chrono::hours(1);
  PromptChains chains(p);
  index.NoteDispatched(1, &chains, t0);  // a worker that published nothing: nothing to go on
  EXPECT_EQ(index.PendingBlocks(1, t0), 0);
  ASSERT_TRUE(index.Apply(1, kNs, 100, KvEventsMsg{true, kB, kC, Names(p, 0, 2), {}}).ok());
  index.NoteDispatched(1, &chains, t0);
  EXPECT_EQ(index.PendingBlocks(1, t0), 4);  // blocks 2..5 (6 full blocks of 100 tokens)
  EXPECT_EQ(index.PredictHitTokens(1, &chains, t0), 96);  // (100 - 1) / 16 = 6 blocks
  // What the worker could hand to another now: the stored blocks only (pending ones may still
  // be computing).
  EXPECT_EQ(index.PredictStoredTokens(1, &chains), 32);
  // Reported stored: no longer pending, and they outlive the TTL.
  ASSERT_TRUE(index.Apply(1, kNs, 100, KvEventsMsg{false, kB, kC, Names(p, 2, 4), {}}).ok());
  EXPECT_EQ(index.PendingBlocks(1, t0), 2);
  EXPECT_EQ(index.Blocks(1), 4);
  const auto later = t0 + std::chrono::seconds(11);
  EXPECT_EQ(index.PendingBlocks(1, later), 0);
  EXPECT_EQ(index.PredictHitTokens(1, &chains, later), 64);
  // A prompt shorter than the first chunk registers nothing in the engine: nothing pending.
  const std::vector<int32_t> short_prompt(q.begin(), q.begin() + kC - 1);
  PromptChains short_chains(short_prompt);
  index.NoteDispatched(1, &short_chains, later);
  EXPECT_EQ(index.PendingBlocks(1, later), 0);
  // A removal reported after the dispatch ends a pending name too.
  PromptChains p_chains(p);
  index.NoteDispatched(1, &p_chains, later);
  EXPECT_EQ(index.PendingBlocks(1, later), 2);  // blocks 4 and 5 (0..3 are held)
  ASSERT_TRUE(index.Apply(1, kNs, 100, KvEventsMsg{false, kB, kC, {}, Names(p, 5, 6)}).ok());
  EXPECT_EQ(index.PendingBlocks(1, later), 1);
  EXPECT_EQ(index.PredictHitTokens(1, &p_chains, later), 80);
  ASSERT_TRUE(index.Apply(1, kNs, 100, KvEventsMsg{false, kB, kC, {}, Names(p, 4, 5)}).ok());
  // A reset keeps pending names (the reported set was replaced, the dispatch still happened);
  // forgetting the worker drops them.
  PromptChains q_chains(q);
  index.NoteDispatched(1, &q_chains, later);
  EXPECT_EQ(index.PendingBlocks(1, later), 6);
  ASSERT_TRUE(index.Apply(1, kNs, 100, KvEventsMsg{true, kB, kC, {}, {}}).ok());
  EXPECT_EQ(index.PredictHitTokens(1, &q_chains, later), 96);
  index.Forget(1);
  EXPECT_EQ(index.PendingBlocks(1, later), 0);
  EXPECT_EQ(index.PredictHitTokens(1, &q_chains, later), 0);
}

}  // namespace
}  // namespace pdserve::router
