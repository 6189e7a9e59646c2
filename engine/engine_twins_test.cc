// Twin prompts (engine/scheduler.h): requests whose prompts are token for token the same, added
// together, compute the prompt once; the others take a copy of its KV and sample their first
// token from its logits. Each must produce exactly what it produces alone (greedy and seeded,
// short and multi-chunk prompts), the prompt rows must be computed once, and the cases that
// do not share (a different prompt, no free blocks, an abort) must still work. (Constrained
// requests never share: Scheduler::Twinnable.)
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <vector>

#include "engine/engine.h"
#include "engine/engine_test_util.h"

namespace pdserve::engine {
namespace {

using testing::EventCollector;
using testing::RunUntilIdle;
using testing::TinyModel;

constexpr int64_t kChunk = testing::kPrefixTestChunk;

// The prefix-test engine with the prefix cache off, so that every prompt row a request does not
// take from a twin is computed (and counted in prompt_rows); up to 64 sequences (twins take
// free sequence slots).
EngineOptions Options(int64_t n_blocks, bool twins = true) {
  EngineOptions o = testing::PrefixTestOptions(n_blocks, /*cache=*/false);
  o.scheduler.max_num_seqs = 64;
  o.scheduler.twin_prompts = twins;
  o.seed = 77;
  return o;
}

RequestOptions Sampling(uint64_t seed, int32_t max_tokens, EventCollector* events) {
  RequestOptions ro;
  ro.sampling.temperature = seed == 0 ? 0.0f : 0.9f;
  ro.sampling.top_k = 40;
  ro.sampling.repetition_penalty = 1.1f;
  ro.sampling.max_tokens = max_tokens;
  ro.sampling.seed = seed;
  ro.on_event = events->Callback();
  return ro;
}

struct RunResult {
  std::vector<std::vector<int32_t>> tokens;
  EngineStats stats;
};

// Adds every (prompt, seed) at once, or each alone, and runs to the end.
RunResult RunAll(const std::vector<std::pair<std::vector<int32_t>, uint64_t>>& requests, bool together, int64_t n_blocks,
           bool twins) {
  auto engine = Engine::Create(Options(n_blocks, twins), &TinyModel());
  EXPECT_TRUE(engine.ok());
  EventCollector events;
  std::vector<RequestId> ids;
  for (const auto& [prompt, seed] : requests) {
    ids.push_back((*engine)->AddRequest(prompt, Sampling(seed, 10, &events)).value());
    if (!together) {
      EXPECT_TRUE(RunUntilIdle(engine->get()));
    }
  }
  EXPECT_TRUE(RunUntilIdle(engine->get()));
  RunResult run;
  for (RequestId id : ids) run.tokens.push_back(events.Tokens(id));
  run.stats = (*engine)->Stats();
  EXPECT_EQ(run.stats.blocks_free, run.stats.blocks_total);
  return run;
}

std::vector<int32_t> RandomPrompt(std::mt19937* rng, int64_t n) {
  std::vector<int32_t> p;
  for (int64_t i = 0; i < n; ++i) p.push_back(static_cast<int32_t>((*rng)() % 1000));
  return p;
}

// Eight copies of a short prompt and six of a three-chunk one, greedy and seeded, beside an
// unrelated request: every output equals its request's run alone, and each shared prompt's
// rows are computed once (the rest arrive as copies).
TEST(EngineTwinsTest, CopiesComputeThePromptOnceAndMatchEachAlone) {
  std::mt19937 rng(8);
  const std::vector<int32_t> short_prompt = RandomPrompt(&rng, 9), long_prompt = RandomPrompt(&rng, 3 * kChunk - 5);
  const std::vector<int32_t> other = RandomPrompt(&rng, 20);
  std::vector<std::pair<std::vector<int32_t>, uint64_t>> requests;
  for (uint64_t i = 0; i < 8; ++i) requests.push_back({short_prompt, i % 2 == 0 ? 0 : 100 + i});
  for (uint64_t i = 0; i < 6; ++i) requests.push_back({long_prompt, i % 3 == 0 ? 0 : 200 + i});
  requests.push_back({other, 7});
  const RunResult alone = RunAll(requests, false, 512, true);
  const RunResult together = RunAll(requests, true, 512, true);
  const RunResult without = RunAll(requests, true, 512, false);
  EXPECT_EQ(together.tokens, alone.tokens);
  EXPECT_EQ(without.tokens, alone.tokens);
  // Alone and without twins, every prompt row is computed; with twins, each shared prompt once.
  const int64_t all_rows = 8 * 9 + 6 * (3 * kChunk - 5) + 20;
  EXPECT_EQ(alone.stats.prompt_rows, all_rows);
  EXPECT_EQ(without.stats.prompt_rows, all_rows);
  EXPECT_EQ(together.stats.prompt_rows, 9 + (3 * kChunk - 5) + 20);
  // Every sampled token is counted, the twins' first tokens too.
  int64_t tokens = 0;
  for (const auto& t : together.tokens) tokens += static_cast<int64_t>(t.size());
  EXPECT_EQ(together.stats.generated_tokens, tokens);
  // Seeds still tell copies apart: the seeded copies of one prompt do not all agree.
  EXPECT_NE(together.tokens[1], together.tokens[3]);
}

// Too few blocks for every copy at once: twins that get no blocks compute their prompt
// themselves later, preemptions may happen, and every output is still each request's alone.
TEST(EngineTwinsTest, CopiesWithoutBlocksComputeThemselves) {
  std::mt19937 rng(9);
  const std::vector<int32_t> prompt = RandomPrompt(&rng, 40);
  std::vector<std::pair<std::vector<int32_t>, uint64_t>> requests;
  for (uint64_t i = 0; i < 10; ++i) requests.push_back({prompt, 300 + i});
  const RunResult alone = RunAll(requests, false, 512, true);
  const RunResult tight = RunAll(requests, true, 12, true);  // 12 blocks of 16 tokens: 3-4 sequences
  EXPECT_EQ(tight.tokens, alone.tokens);
  EXPECT_GT(tight.stats.prompt_rows, 40);  // some copies computed the prompt themselves
}

// More copies than sequence slots: the running set never exceeds max_num_seqs, and every copy
// still gets its run-alone output.
TEST(EngineTwinsTest, NoMoreTwinsRunThanSequenceSlots) {
  EngineOptions o = Options(512);
  o.scheduler.max_num_seqs = 4;
  auto engine = Engine::Create(o, &TinyModel());
  ASSERT_TRUE(engine.ok());
  Engine& e = **engine;
  EventCollector events;
  std::mt19937 rng(11);
  const std::vector<int32_t> prompt = RandomPrompt(&rng, 12);
  std::vector<RequestId> ids;
  for (uint64_t i = 0; i < 10; ++i) ids.push_back(e.AddRequest(prompt, Sampling(400 + i, 5, &events)).value());
  int64_t most_running = 0;
  for (int step = 0; step < 1000 && !e.Idle(); ++step) {
    e.Step();
    most_running = std::max(most_running, e.Stats().running);
  }
  ASSERT_TRUE(e.Idle());
  EXPECT_LE(most_running, 4);
  for (uint64_t i = 0; i < 10; ++i) {
    auto alone = Engine::Create(Options(512), &TinyModel());
    ASSERT_TRUE(alone.ok());
    EventCollector ev;
    const RequestId id = (*alone)->AddRequest(prompt, Sampling(400 + i, 5, &ev)).value();
    ASSERT_TRUE(RunUntilIdle(alone->get()));
    EXPECT_EQ(events.Tokens(ids[i]), ev.Tokens(id)) << i;
  }
}

// Aborting a waiting twin leaves the others whole, and the prompt is still computed once.
TEST(EngineTwinsTest, AbortedTwinLeavesTheOthersWhole) {
  auto engine = Engine::Create(Options(256), &TinyModel());
  ASSERT_TRUE(engine.ok());
  Engine& e = **engine;
  EventCollector events;
  std::mt19937 rng(10);
  const std::vector<int32_t> prompt = RandomPrompt(&rng, 12);
  const RequestId first = e.AddRequest(prompt, Sampling(0, 6, &events)).value();
  const RequestId aborted = e.AddRequest(prompt, Sampling(0, 6, &events)).value();
  const RequestId kept = e.AddRequest(prompt, Sampling(0, 6, &events)).value();
  ASSERT_TRUE(e.Abort(aborted).ok());
  ASSERT_TRUE(RunUntilIdle(&e));
  EXPECT_EQ(events.Last(aborted)->reason, FinishReason::kAbort);
  EXPECT_TRUE(events.Tokens(aborted).empty());
  EXPECT_EQ(events.Tokens(kept), events.Tokens(first));
  EXPECT_EQ(events.Tokens(first).size(), 6u);
  EXPECT_EQ(e.Stats().prompt_rows, 12);
  EXPECT_EQ(e.Stats().blocks_free, e.Stats().blocks_total);
}

}  // namespace
}  // namespace pdserve::engine
