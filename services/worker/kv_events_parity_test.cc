// The router's prediction against a real engine (docs/router.md "KV-aware routing"): an Engine
// (tiny model, blocks of 16, first chunk 32, a small pool) publishes its prefix-cache events as
// the worker sends them (TakeEngineKvEvents), the router's KvIndex applies them, and for every
// request the index's predicted hit equals the hit the engine then reports -- cold prompts,
// shared system prompts of every length around the block and first-chunk edges, multi-turn
// prompts that include the previous reply, eviction under pool pressure and ClearPrefixCache.
// That holds only if the router names a prompt's blocks exactly as the engine registers them
// (the same chain hash, namespace and block size), and applies the same hit rule. With the
// events withheld while the cache changes, the prediction may only be too high, and a resync
// (the whole set) makes it exact again.
// To add a case: build a prompt, Predict it, Generate it, compare.
#include <gtest/gtest.h>

#include <condition_variable>
#include <mutex>
#include <random>

#include "engine/engine.h"
#include "model/test_util.h"
#include "model/tools/make_model.h"
#include "services/router/kv_index.h"
#include "services/worker/engine_worker.h"

namespace pdserve::services::worker {
namespace {

constexpr int64_t kBlock = 16;
constexpr int64_t kChunk = 32;
constexpr uint64_t kWorker = 1;  // the index's key for the one worker

class KvEventsParityTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new model::testing::TempDir("kv_events_parity");
    model::MakeModelOptions o;
    o.preset = "tiny";
    o.seed = 3;
    o.out_dir = dir_->path();
    ASSERT_TRUE(model::MakeModel(o).ok());
  }
  static void TearDownTestSuite() {
    delete dir_;
    dir_ = nullptr;
  }

  void SetUp() override {
    engine::EngineOptions o;
    o.model_dir = dir_->path();
    o.threads = 1;
    o.block_tokens = kBlock;
    o.scheduler.prefill_chunk = kChunk;
    o.scheduler.max_step_tokens = 128;
    o.seed = 5;
    auto probe = engine::Engine::Create(o);
    ASSERT_TRUE(probe.ok()) << probe.status().ToString();
    // 40 blocks: a few prompts fill the pool, so the cache evicts.
    o.kv_cache_gib = static_cast<double>(40 * (*probe)->pool().block_bytes()) / (1ull << 30);
    probe->reset();
    auto e = engine::Engine::Create(o);
    ASSERT_TRUE(e.ok()) << e.status().ToString();
    engine_ = std::move(e).value();
    ASSERT_EQ(engine_->pool().n_blocks(), 40);
    Sync(true);  // as after a registration
  }

  // The worker's next KV events into the router's index.
  void Sync(bool full = false) {
    const Status s = index_.Apply(kWorker, engine_->prefix_cache_namespace(), engine_->pool().n_blocks(),
                                  TakeEngineKvEvents(engine_.get(), full));
    ASSERT_TRUE(s.ok()) << s.ToString();
  }
  int64_t Predict(const std::vector<int32_t>& prompt) {
    router::PromptChains chains(prompt);
    return index_.PredictHitTokens(kWorker, &chains);
  }
  struct Generated {
    std::vector<int32_t> output;
    int64_t cached = -1;
  };
  // Runs one greedy request to its end on this thread.
  Generated Generate(const std::vector<int32_t>& prompt, int32_t max_tokens) {
    Generated g;
    engine::RequestOptions ro;
    ro.sampling.temperature = 0.0f;
    ro.sampling.max_tokens = max_tokens;
    ro.on_event = [&g](const engine::TokenEvent& ev) {
      if (ev.token >= 0) g.output.push_back(ev.token);
      if (ev.finished) g.cached = ev.cached_prompt_tokens;
    };
    auto id = engine_->AddRequest(prompt, ro);
    EXPECT_TRUE(id.ok()) << id.status().ToString();
    for (int i = 0; i < 100000 && !engine_->Idle(); ++i) engine_->Step();
    EXPECT_TRUE(engine_->Idle());
    return g;
  }
  // Predicts, runs, compares; returns the run.
  Generated Check(const std::vector<int32_t>& prompt, int32_t max_tokens, const std::string& what) {
    const int64_t predicted = Predict(prompt);
    Generated g = Generate(prompt, max_tokens);
    EXPECT_EQ(predicted, g.cached) << what << " (" << prompt.size() << " prompt tokens)";
    Sync();
    return g;
  }

  static model::testing::TempDir* dir_;
  std::unique_ptr<engine::Engine> engine_;
  router::KvIndex index_;
};

model::testing::TempDir* KvEventsParityTest::dir_ = nullptr;

std::vector<int32_t> Random(std::mt19937* rng, size_t n) {
  std::vector<int32_t> v(n);
  for (auto& t : v) t = static_cast<int32_t>((*rng)() % 1000);
  return v;
}

std::vector<int32_t> Concat(std::vector<int32_t> a, const std::vector<int32_t>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

TEST_F(KvEventsParityTest, PredictedHitsEqualTheEnginesThroughSharingTurnsAndEviction) {
  std::mt19937 rng(7);
  const std::vector<int32_t> system = Random(&rng, 150);
  int hits = 0;
  // Cold, then prompts sharing the system prompt with suffixes around the edges: shorter than
  // a block, a block and one, enough to reach the last whole block.
  Check(Concat(system, Random(&rng, 10)), 4, "cold");
  for (size_t suffix : {1u, 2u, 15u, 16u, 17u, 33u}) {
    const Generated g = Check(Concat(system, Random(&rng, suffix)), 3, "suffix " + std::to_string(suffix));
    hits += g.cached > 0;
  }
  // Prefixes of the system prompt itself, around the first chunk and the block edges.
  for (size_t n : {31u, 32u, 33u, 48u, 49u, 64u, 65u, 150u}) {
    const Generated g = Check(std::vector<int32_t>(system.begin(), system.begin() + static_cast<std::ptrdiff_t>(n)),
                              2, "prefix " + std::to_string(n));
    hits += g.cached > 0;
  }
  // A conversation: each turn is the previous prompt, its reply and a new message.
  std::vector<int32_t> history = Concat(system, Random(&rng, 20));
  for (int turn = 0; turn < 4; ++turn) {
    const Generated g = Check(history, 12, "turn " + std::to_string(turn));
    hits += g.cached > 0;
    history = Concat(Concat(history, g.output), Random(&rng, 9));
  }
  // Pool pressure: unrelated prompts evict; the index follows (events applied each time).
  for (int k = 0; k < 6; ++k) Check(Random(&rng, 180), 3, "unrelated " + std::to_string(k));
  EXPECT_GT(engine_->Stats().prefix_evictions, 0);
  Check(Concat(system, Random(&rng, 40)), 3, "after eviction");
  // ClearPrefixCache: nothing predicted, nothing found.
  engine_->ClearPrefixCache();
  Sync();
  EXPECT_EQ(index_.Blocks(kWorker), 0);
  Check(Concat(system, Random(&rng, 40)), 3, "after clear");
  EXPECT_GT(hits, 10);
  EXPECT_EQ(index_.Blocks(kWorker), engine_->Stats().prefix_cached_blocks);
}

TEST_F(KvEventsParityTest, WithheldEventsOnlyOverpredictAndAResyncRestoresParity) {
  std::mt19937 rng(8);
  const std::vector<int32_t> system = Random(&rng, 160);
  Check(Concat(system, Random(&rng, 8)), 3, "donor");
  ASSERT_EQ(Predict(Concat(system, Random(&rng, 8))), 160);
  // The cache changes and the router hears nothing: evictions it does not know of.
  for (int k = 0; k < 6; ++k) Generate(Random(&rng, 180), 3);
  ASSERT_GT(engine_->Stats().prefix_evictions, 0);
  const std::vector<int32_t> q = Concat(system, Random(&rng, 8));
  const int64_t stale = Predict(q);
  const Generated g = Generate(q, 3);
  EXPECT_GE(stale, g.cached);
  EXPECT_GT(stale, g.cached);  // the system prompt's blocks were evicted
  // The whole set (what a worker sends after an overflow or a registration): exact again.
  Sync(true);
  Check(Concat(system, Random(&rng, 8)), 3, "after resync");
  EXPECT_EQ(index_.Blocks(kWorker), engine_->Stats().prefix_cached_blocks);
}

}  // namespace
}  // namespace pdserve::services::worker
