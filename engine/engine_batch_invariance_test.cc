// Batch invariance at the engine level, bit for bit: a request's tokens and log-probabilities
// (the sampled token's and the top 5, from the log-softmax of its full logits) do not depend on
// the batch it runs in. 64 requests with mixed contexts (prompts of 1 to 300 tokens: single
// rows, whole and chunked prefills, contexts shorter and longer than the indexer's top-k) run
// alone, then in batches of 3, 17 and 64, which mix prefill chunks and decode rows.
#include "engine/engine.h"

#include <gtest/gtest.h>

#include <cstring>
#include <random>

#include "engine/engine_test_util.h"

namespace pdserve::engine {
namespace {

using testing::EventCollector;
using testing::RunUntilIdle;
using testing::TinyModel;

struct Outcome {
  std::vector<int32_t> tokens;
  std::vector<uint32_t> logprob_bits;  // sampled token's, then (id, logprob bits) of the top 5
};

uint32_t Bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

Outcome OutcomeOf(const std::vector<TokenEvent>& events) {
  Outcome o;
  for (const TokenEvent& ev : events) {
    if (ev.token < 0) continue;
    o.tokens.push_back(ev.token);
    o.logprob_bits.push_back(Bits(ev.logprob));
    for (const auto& [id, lp] : ev.top_logprobs) {
      o.logprob_bits.push_back(static_cast<uint32_t>(id));
      o.logprob_bits.push_back(Bits(lp));
    }
  }
  return o;
}

// Runs requests [first, first + n) of the workload together in one engine.
std::vector<Outcome> RunBatch(const std::vector<std::vector<int32_t>>& prompts, const std::vector<int32_t>& max_tokens,
                              size_t first, size_t n) {
  EngineOptions o;
  o.block_tokens = 16;
  const KvLayout l = KvLayout::ForConfig(TinyModel().config(), o.block_tokens);
  o.kv_cache_gib = static_cast<double>(2048 * l.BlockBytes()) / (1ull << 30);
  o.scheduler.max_num_seqs = 64;
  o.scheduler.max_step_tokens = 256;
  o.scheduler.prefill_chunk = 64;
  auto engine = Engine::Create(o, &TinyModel());
  EXPECT_TRUE(engine.ok()) << engine.status().ToString();
  if (!engine.ok()) return {};
  EventCollector events;
  std::vector<RequestId> ids;
  for (size_t i = first; i < first + n; ++i) {
    RequestOptions ro;
    ro.sampling.temperature = 0.0f;
    ro.sampling.max_tokens = max_tokens[i];
    ro.sampling.logprobs = 5;
    ro.on_event = events.Callback();
    auto id = (*engine)->AddRequest(prompts[i], ro);
    EXPECT_TRUE(id.ok()) << id.status().ToString();
    if (id.ok()) ids.push_back(*id);
  }
  EXPECT_TRUE(RunUntilIdle(engine->get()));
  EXPECT_EQ((*engine)->Stats().preemptions, 0);
  std::vector<Outcome> out;
  const auto all = events.events();
  for (RequestId id : ids) out.push_back(OutcomeOf(all.at(id)));
  return out;
}

TEST(EngineBatchInvarianceTest, LogprobsBitwiseAtBatch1_3_17_64) {
  const int64_t V = TinyModel().config().vocab_size;
  ASSERT_LT(TinyModel().config().index_topk, 100);  // most contexts below are longer
  std::mt19937 rng(8);
  std::vector<std::vector<int32_t>> prompts;
  std::vector<int32_t> max_tokens;
  for (int i = 0; i < 64; ++i) {
    const int len = i % 8 == 0 ? 1 + i / 8 : 1 + static_cast<int>(rng() % 300);
    std::vector<int32_t> p;
    for (int j = 0; j < len; ++j) p.push_back(static_cast<int32_t>(rng() % V));
    prompts.push_back(p);
    max_tokens.push_back(1 + static_cast<int32_t>(rng() % 12));
  }
  std::vector<Outcome> alone;
  for (size_t i = 0; i < prompts.size(); ++i) alone.push_back(RunBatch(prompts, max_tokens, i, 1)[0]);
  for (size_t batch : {3, 17, 64}) {
    for (size_t first = 0; first < prompts.size(); first += batch) {
      const size_t n = std::min(batch, prompts.size() - first);
      const std::vector<Outcome> got = RunBatch(prompts, max_tokens, first, n);
      ASSERT_EQ(got.size(), n);
      for (size_t k = 0; k < n; ++k) {
        const size_t i = first + k;
        EXPECT_EQ(got[k].tokens, alone[i].tokens) << "request " << i << " in a batch of " << batch;
        EXPECT_EQ(got[k].logprob_bits, alone[i].logprob_bits)
            << "request " << i << " (prompt " << prompts[i].size() << ") in a batch of " << batch;
      }
    }
  }
}

}  // namespace
}  // namespace pdserve::engine
