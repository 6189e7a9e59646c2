// The Engine as one rank of a multi-rank instance (engine/rank_group.h), under mpirun at 2 and
// 4 ranks, against the single-process engine's greedy output for the same prompts:
//   * DP units with EP (each rank its own requests, continuous batching; a rank with less work
//     takes dummy steps while the others decode);
//   * a TP unit (a leader and followers replaying its steps);
//   * CP prefill (whole prompts split over the CP ranks, then decode replicated on the unit);
//   * KV imported into a TP unit's leader (the followers receive the blocks with the step) and
//     decoded from there, as a decode service does after a KV transfer;
//   * prefix-cache hits on a TP unit (the leader maps cached blocks; the followers read their
//     own copies of the same block ids, written when those blocks were computed), and on a CP
//     unit (a prompt's rest after the hit split over the CP ranks, or run replicated when short);
//   * pulled blocks adopted by a TP unit's leader reach its followers before a step reads them,
//     and so do blocks its disk tier restores.
// Every rank makes the same tiny checkpoint; ranks stop together (the engines' stop votes).
#include <chrono>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <vector>

#include <gtest/gtest.h>

#include "comm/testing/mpi_test_util.h"
#include "engine/engine.h"
#include "engine/engine_test_util.h"
#include "engine/rank_group.h"
#include "model/tools/make_model.h"
#include "model/parallel_instance.h"
#include "model/test_util.h"

namespace pdserve::engine {
namespace {

using comm::ParallelPlan;
using comm::testing::AllRanks;
using comm::testing::WorldSize;
using testing::EventCollector;

constexpr int64_t kMaxTokens = 12;

std::vector<int32_t> Prompt(int64_t len, int seed) {
  std::vector<int32_t> p;
  for (int64_t i = 0; i < len; ++i) p.push_back(static_cast<int32_t>((i * 37 + seed * 101 + 11) % 1000));
  return p;
}

// Greedy sampling of `max_tokens` tokens, events into `events`.
RequestOptions Greedy(int64_t max_tokens, EventCollector* events) {
  RequestOptions ro;
  ro.sampling.temperature = 0;
  ro.sampling.max_tokens = max_tokens;
  ro.on_event = events->Callback();
  return ro;
}

class EngineGroupTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new model::testing::TempDir("engine_group");
    model::MakeModelOptions o;
    o.preset = "tiny";
    o.seed = 7;
    o.out_dir = dir_->path();
    ASSERT_TRUE(model::MakeModel(o).ok());
    EngineOptions eo;
    eo.model_dir = dir_->path();
    eo.threads = 1;
    eo.kv_cache_gib = 0.0625;
    auto ref = Engine::Create(eo);
    ASSERT_TRUE(ref.ok()) << ref.status().ToString();
    reference_ = ref->release();
  }
  static void TearDownTestSuite() {
    delete reference_;
    delete dir_;
  }

  // The single-process engine's greedy tokens for `prompt` run alone.
  static std::vector<int32_t> Reference(const std::vector<int32_t>& prompt, int64_t max_tokens = kMaxTokens) {
    EventCollector events;
    RequestOptions ro = Greedy(max_tokens, &events);
    auto id = reference_->AddRequest(prompt, ro);
    EXPECT_TRUE(id.ok());
    EXPECT_TRUE(testing::RunUntilIdle(reference_));
    return events.Tokens(*id);
  }

  // Greedy tokens of each prompt run alone on a fresh single-process engine without a prefix
  // cache, with blocks of `block_tokens` and prompt chunks of `prefill_chunk` (0: whole prompts,
  // as a CP unit schedules them). Empty on failure (the caller's comparison then fails).
  static std::vector<std::vector<int32_t>> Cold(const std::vector<std::vector<int32_t>>& prompts,
                                                int64_t block_tokens, int64_t prefill_chunk) {
    EngineOptions eo;
    eo.model_dir = dir_->path();
    eo.threads = 1;
    eo.kv_cache_gib = 0.0625;
    eo.block_tokens = block_tokens;
    if (prefill_chunk > 0) eo.scheduler.prefill_chunk = prefill_chunk;
    eo.scheduler.whole_prompts = prefill_chunk == 0;
    eo.prefix_cache = false;
    auto cold = Engine::Create(eo);
    EXPECT_TRUE(cold.ok()) << cold.status().ToString();
    if (!cold.ok()) return {};
    std::vector<std::vector<int32_t>> out;
    for (const auto& p : prompts) {
      EventCollector events;
      auto id = (*cold)->AddRequest(p, Greedy(kMaxTokens, &events));
      EXPECT_TRUE(id.ok());
      EXPECT_TRUE(testing::RunUntilIdle(cold->get()));
      out.push_back(id.ok() ? events.Tokens(*id) : std::vector<int32_t>{});
    }
    return out;
  }

  struct Rank {
    model::ParallelInstance instance;
    std::unique_ptr<RankGroup> group;
    std::unique_ptr<Engine> engine;  // unit leaders only
  };
  static Rank Join(const ParallelPlan& plan, int64_t block_tokens = 64, int64_t prefill_chunk = 256,
                   const std::function<void(const model::ModelConfig&, EngineOptions*)>& adjust = {}) {
    Rank r;
    auto in = model::LoadParallelInstance(dir_->path(), plan, 1);
    EXPECT_TRUE(in.ok()) << in.status().ToString();
    if (!in.ok()) return r;
    r.instance = std::move(*in);
    EngineOptions eo;
    eo.kv_cache_gib = 0.0625;
    eo.block_tokens = block_tokens;
    eo.scheduler.prefill_chunk = prefill_chunk;
    if (adjust) adjust(r.instance.model->config(), &eo);
    const KvLayout layout = model::KvLayoutFor(r.instance.model->config(), eo.block_tokens, eo.latent_format,
                                                eo.index_format);
    auto g = RankGroup::Create(*r.instance.model, layout);
    EXPECT_TRUE(g.ok()) << g.status().ToString();
    if (!g.ok()) return r;
    r.group = std::move(*g);
    if (r.group->leader()) {
      eo.group = r.group.get();
      auto e = Engine::Create(eo, r.instance.model.get());
      EXPECT_TRUE(e.ok()) << e.status().ToString();
      if (e.ok()) r.engine = std::move(*e);
    }
    return r;
  }

  // Each DP unit's leader serves prompts[i] for i % dp == its DP rank; followers replay. Every
  // output must equal the reference. Returns every rank's dummy steps (collective).
  // max_tokens[i] (default kMaxTokens) for prompts[i].
  static std::vector<int64_t> ServeAndCheck(const ParallelPlan& plan, const std::vector<std::vector<int32_t>>& prompts,
                                            std::vector<int64_t> max_tokens = {}) {
    max_tokens.resize(prompts.size(), kMaxTokens);
    std::map<size_t, std::vector<int32_t>> expected;
    for (size_t i = 0; i < prompts.size(); ++i) expected[i] = Reference(prompts[i], max_tokens[i]);
    Rank r = Join(plan);
    if (!AllRanks(r.group != nullptr)) {
      ADD_FAILURE() << "no group";
      return {};
    }
    if (r.group->leader()) Lead(plan, prompts, max_tokens, expected, &r);
    else EXPECT_TRUE(r.group->FollowerLoop().ok());
    return comm::testing::AllGather(r.group->dummy_steps());
  }
  static void Lead(const ParallelPlan& plan, const std::vector<std::vector<int32_t>>& prompts,
                   const std::vector<int64_t>& max_tokens, std::map<size_t, std::vector<int32_t>>& expected,
                   Rank* rank) {
    Rank& r = *rank;
    ASSERT_TRUE(r.engine);
    EventCollector events;
    std::map<size_t, RequestId> ids;
    r.engine->Start();
    for (size_t i = 0; i < prompts.size(); ++i) {
      if (static_cast<int>(i % static_cast<size_t>(plan.dp)) != r.group->dp_rank()) continue;
      RequestOptions ro = Greedy(max_tokens[i], &events);
      auto id = r.engine->AddRequest(prompts[i], ro);
      ASSERT_TRUE(id.ok()) << id.status().ToString();
      ids[i] = *id;
    }
    EXPECT_TRUE(events.WaitFinished(ids.size(), std::chrono::seconds(120)));
    for (const auto& [i, id] : ids) EXPECT_EQ(events.Tokens(id), expected[i]) << "prompt " << i;
    EXPECT_TRUE(r.engine->failure().ok());
    EXPECT_EQ(r.engine->pool().n_used(), 0);
    r.engine.reset();  // votes stop; returns once every rank stopped
  }

  static model::testing::TempDir* dir_;
  static Engine* reference_;
};

model::testing::TempDir* EngineGroupTest::dir_ = nullptr;
Engine* EngineGroupTest::reference_ = nullptr;

TEST_F(EngineGroupTest, DataParallelUnitsWithExpertParallelMoe) {
  ParallelPlan plan;
  plan.dp = WorldSize();
  plan.ep = WorldSize();
  // Mixed lengths; unit 0's last request generates twice as long, so the other units take
  // dummy steps while it still decodes.
  std::vector<std::vector<int32_t>> prompts;
  std::vector<int64_t> max_tokens;
  for (int i = 0; i < 2 * plan.dp; ++i) {
    prompts.push_back(Prompt(5 + 7 * i, i));
    max_tokens.push_back(kMaxTokens);
  }
  prompts.push_back(Prompt(40, 9));
  max_tokens.push_back(2 * kMaxTokens);
  const std::vector<int64_t> dummies = ServeAndCheck(plan, prompts, max_tokens);
  int64_t total = 0;
  for (int64_t d : dummies) total += d;
  EXPECT_GT(total, 0) << "no rank ever stepped idle while another decoded";
}

TEST_F(EngineGroupTest, TensorParallelUnitLeaderAndFollowers) {
  ParallelPlan plan;
  plan.tp = 2;
  plan.dp = WorldSize() / 2;
  plan.ep = WorldSize();
  ServeAndCheck(plan, {Prompt(9, 1), Prompt(30, 2), Prompt(17, 3)});
}

TEST_F(EngineGroupTest, ContextParallelPrefillThenReplicatedDecode) {
  ParallelPlan plan;
  plan.cp = 2;
  plan.dp = WorldSize() / 2;
  plan.ep = WorldSize();
  // Long enough that every CP rank gets more than 8 rows (the CP path proper), and one short
  // prompt that falls back to an ordinary forward on every rank.
  ServeAndCheck(plan, {Prompt(48, 4), Prompt(6, 5), Prompt(70, 6)});
}

// Engines stepped by hand (no Start): each finishes its own request at a different step, and
// the one that is destroyed first keeps voting (stop, dummy steps) until every rank stopped.
TEST_F(EngineGroupTest, HandSteppedEnginesStopTogether) {
  ParallelPlan plan;
  plan.dp = WorldSize();
  plan.ep = WorldSize();
  const std::vector<int32_t> prompt = Prompt(12, 3);
  Rank r = Join(plan);
  ASSERT_TRUE(AllRanks(r.engine != nullptr));
  const int64_t max_tokens = 4 + 6 * r.group->dp_rank();
  const std::vector<int32_t> expected = Reference(prompt, max_tokens);
  EventCollector events;
  RequestOptions ro = Greedy(max_tokens, &events);
  auto id = r.engine->AddRequest(prompt, ro);
  ASSERT_TRUE(id.ok());
  while (events.finished() < 1) r.engine->Step();
  EXPECT_EQ(events.Tokens(*id), expected);
  r.engine.reset();  // Stop(): votes stop until every rank did
  EXPECT_FALSE(r.group->broken());
}

TEST_F(EngineGroupTest, ImportedKvReachesTheFollowers) {
  ParallelPlan plan;
  plan.tp = 2;
  plan.dp = WorldSize() / 2;
  plan.ep = WorldSize();
  const std::vector<int32_t> prompt = Prompt(33, 8);
  const std::vector<int32_t> expected = Reference(prompt);
  // The prefill side: the reference engine computes the prompt and holds its KV.
  std::vector<std::vector<uint8_t>> blocks;
  int32_t first_token = -1;
  {
    EventCollector events;
    RequestOptions ro = Greedy(1, &events);
    ro.hold_kv = true;
    auto id = reference_->AddRequest(prompt, ro);
    ASSERT_TRUE(id.ok());
    ASSERT_TRUE(testing::RunUntilIdle(reference_));
    first_token = events.Tokens(*id).at(0);
    auto held = reference_->HeldBlocks(*id);
    ASSERT_TRUE(held.ok());
    const BlockPool& p = reference_->pool();
    for (int32_t b : *held) blocks.emplace_back(p.base() + int64_t{b} * p.block_bytes(), p.base() + (int64_t{b} + 1) * p.block_bytes());
    ASSERT_TRUE(reference_->ReleaseKv(*id).ok());
  }
  Rank r = Join(plan);
  ASSERT_TRUE(AllRanks(r.group != nullptr));
  if (!r.group->leader()) {
    EXPECT_TRUE(r.group->FollowerLoop().ok());
    return;
  }
  EventCollector events;
  RequestOptions ro = Greedy(kMaxTokens, &events);
  auto import = r.engine->ReserveImport(prompt, ro);
  ASSERT_TRUE(import.ok()) << import.status().ToString();
  ASSERT_EQ(import->block_ids.size(), blocks.size());
  const BlockPool& pool = r.engine->pool();
  for (size_t k = 0; k < blocks.size(); ++k)
    std::memcpy(pool.base() + int64_t{import->block_ids[k]} * pool.block_bytes(), blocks[k].data(), blocks[k].size());
  r.engine->Start();
  ASSERT_TRUE(r.engine->CommitImport(import->id, first_token).ok());
  EXPECT_TRUE(events.WaitFinished(1, std::chrono::seconds(120)));
  EXPECT_EQ(events.Tokens(import->id), expected);
  r.engine.reset();
}

TEST_F(EngineGroupTest, PrefixCacheHitsOnATensorParallelUnit) {
  ParallelPlan plan;
  plan.tp = 2;
  plan.dp = WorldSize() / 2;
  plan.ep = WorldSize();
  constexpr int64_t kBlock = 16, kChunk = 32;
  // Prompts sharing a 70-token prefix, and a cold single-process engine on the same grid.
  const std::vector<int32_t> shared = Prompt(70, 10);
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < 4; ++i) {
    std::vector<int32_t> p = shared;
    for (int32_t t : Prompt(5 + 4 * i, 20 + i)) p.push_back(t);
    prompts.push_back(p);
  }
  const std::vector<std::vector<int32_t>> expected = Cold(prompts, kBlock, kChunk);
  ASSERT_EQ(expected.size(), prompts.size());
  Rank r = Join(plan, kBlock, kChunk);
  ASSERT_TRUE(AllRanks(r.group != nullptr));
  if (!r.group->leader()) {
    EXPECT_TRUE(r.group->FollowerLoop().ok());
    return;
  }
  ASSERT_TRUE(r.engine->prefix_cache_enabled());
  r.engine->Start();
  // The first request computes the prefix; the others, together, map its blocks.
  EventCollector events;
  std::vector<RequestId> ids;
  ids.push_back(r.engine->AddRequest(prompts[0], Greedy(kMaxTokens, &events)).value());
  ASSERT_TRUE(events.WaitFinished(1, std::chrono::seconds(120)));
  for (size_t i = 1; i < prompts.size(); ++i) ids.push_back(r.engine->AddRequest(prompts[i], Greedy(kMaxTokens, &events)).value());
  ASSERT_TRUE(events.WaitFinished(prompts.size(), std::chrono::seconds(120)));
  for (size_t i = 0; i < prompts.size(); ++i) {
    EXPECT_EQ(events.Tokens(ids[i]), expected[i]) << "prompt " << i;
    EXPECT_EQ(events.Last(ids[i])->cached_prompt_tokens, i == 0 ? 0 : 64) << "prompt " << i;
  }
  EXPECT_TRUE(r.engine->failure().ok());
  EXPECT_EQ(r.engine->pool().n_used(), 0);
  r.engine.reset();
}

// A CP unit's prefix cache: whole-prompt scheduling caches prompts' blocks only, and a later
// prompt that shares them computes its rest in the whole prompt's form (RowGrouping::
// kPromptRest): split over the CP ranks when each gets more than 8 rows (rests of 36 and 46
// tokens here), replicated on every rank when shorter (11 and 15). The tokens equal a cold
// single-process whole-prompt engine's, and the hits are the first prompt's whole blocks.
TEST_F(EngineGroupTest, PrefixCacheHitsOnAContextParallelUnit) {
  ParallelPlan plan;
  plan.cp = 2;
  plan.dp = WorldSize() / 2;
  plan.ep = WorldSize();
  constexpr int64_t kBlock = 16;
  const std::vector<int32_t> shared = Prompt(70, 30);
  std::vector<std::vector<int32_t>> prompts;
  for (int tail : {5, 30, 9, 40}) {
    std::vector<int32_t> p = shared;
    for (int32_t t : Prompt(tail, 40 + tail)) p.push_back(t);
    prompts.push_back(p);
  }
  const std::vector<std::vector<int32_t>> expected = Cold(prompts, kBlock, 0);
  ASSERT_EQ(expected.size(), prompts.size());
  Rank r = Join(plan, kBlock);
  ASSERT_TRUE(AllRanks(r.group != nullptr));
  if (!r.group->leader()) {
    EXPECT_TRUE(r.group->FollowerLoop().ok());
    return;
  }
  ASSERT_TRUE(r.group->whole_prompts());
  ASSERT_TRUE(r.engine->prefix_cache_enabled());
  EXPECT_TRUE(r.engine->accepts_pulls());  // pulled blocks go to the followers with the next step
  r.engine->Start();
  EventCollector events;
  std::vector<RequestId> ids;
  ids.push_back(r.engine->AddRequest(prompts[0], Greedy(kMaxTokens, &events)).value());
  ASSERT_TRUE(events.WaitFinished(1, std::chrono::seconds(120)));
  for (size_t i = 1; i < prompts.size(); ++i) ids.push_back(r.engine->AddRequest(prompts[i], Greedy(kMaxTokens, &events)).value());
  ASSERT_TRUE(events.WaitFinished(prompts.size(), std::chrono::seconds(120)));
  for (size_t i = 0; i < prompts.size(); ++i) {
    EXPECT_EQ(events.Tokens(ids[i]), expected[i]) << "prompt " << i;
    EXPECT_EQ(events.Last(ids[i])->cached_prompt_tokens, i == 0 ? 0 : 64) << "prompt " << i;
  }
  EXPECT_TRUE(r.engine->failure().ok());
  EXPECT_EQ(r.engine->pool().n_used(), 0);
  r.engine.reset();
}

// A multi-rank puller: the leader of a TP unit adopts pulled blocks (here copied in its own pool
// from blocks it computed, as a pull's one-sided write would fill them), then forgets the
// originals. The followers never computed the pulled block ids: the blocks' bytes go out with
// the next step, before the forward that maps them, and the replies equal a cold engine's.
TEST_F(EngineGroupTest, PulledBlocksReachTheFollowers) {
  ParallelPlan plan;
  plan.tp = 2;
  plan.dp = WorldSize() / 2;
  plan.ep = WorldSize();
  constexpr int64_t kBlock = 16, kChunk = 32;
  const std::vector<int32_t> shared = Prompt(70, 50);
  std::vector<int32_t> donor = shared, asker = shared;
  for (int32_t t : Prompt(9, 51)) donor.push_back(t);
  for (int32_t t : Prompt(13, 52)) asker.push_back(t);
  const std::vector<std::vector<int32_t>> cold = Cold({asker}, kBlock, kChunk);
  ASSERT_EQ(cold.size(), 1u);
  const std::vector<int32_t>& expected = cold[0];
  Rank r = Join(plan, kBlock, kChunk);
  ASSERT_TRUE(AllRanks(r.group != nullptr));
  if (!r.group->leader()) {
    EXPECT_TRUE(r.group->FollowerLoop().ok());
    return;
  }
  Engine& e = *r.engine;
  ASSERT_TRUE(e.accepts_pulls());
  e.Start();
  EventCollector events;
  e.AddRequest(donor, Greedy(kMaxTokens, &events)).value();
  ASSERT_TRUE(events.WaitFinished(1, std::chrono::seconds(120)));
  // The 4 whole blocks of the shared prefix, copied into 4 fresh blocks; then the cache forgets
  // the originals and adopts the copies.
  const std::vector<int32_t> source = e.PinCachedPrefix(asker, 4);
  ASSERT_EQ(source.size(), 4u);
  auto pulled = e.AllocatePullBlocks(4);
  ASSERT_TRUE(pulled.ok()) << pulled.status().ToString();
  const BlockPool& pool = e.pool();
  for (size_t i = 0; i < source.size(); ++i)
    std::memcpy(pool.base() + int64_t{(*pulled)[i]} * pool.block_bytes(), pool.base() + int64_t{source[i]} * pool.block_bytes(),
                static_cast<size_t>(pool.block_bytes()));
  e.UnpinBlocks(source);
  EXPECT_EQ(e.ClearPrefixCache(), 5);  // the donor computed 79 + 11 tokens: 5 whole blocks
  EXPECT_EQ(e.AdoptPulledBlocks(asker, 0, *pulled), 64);
  const RequestId id = e.AddRequest(asker, Greedy(kMaxTokens, &events)).value();
  ASSERT_TRUE(events.WaitFinished(2, std::chrono::seconds(120)));
  EXPECT_EQ(events.Last(id)->cached_prompt_tokens, 64);
  EXPECT_EQ(events.Tokens(id), expected);
  EXPECT_TRUE(e.failure().ok());
  EXPECT_EQ(e.pool().n_used(), 0);
  r.engine.reset();
}

// The disk tier on a TP unit: only the leader has the tier. A donor's blocks are pushed out of
// a 24-block pool by filler prompts (spilled to the tier); a query with the donor's prefix
// restores them into block ids the followers last used for other KV, and the restored bytes
// go out with the step before the forward that reads them.
TEST_F(EngineGroupTest, DiskTierRestoresReachTheFollowers) {
  ParallelPlan plan;
  plan.tp = 2;
  plan.dp = WorldSize() / 2;
  plan.ep = WorldSize();
  constexpr int64_t kBlock = 16, kChunk = 32, kPoolBlocks = 24;
  const std::vector<int32_t> shared = Prompt(100, 60);
  std::vector<int32_t> donor = shared, query = shared;
  for (int32_t t : Prompt(30, 61)) donor.push_back(t);
  for (int32_t t : Prompt(21, 62)) query.push_back(t);
  const std::vector<std::vector<int32_t>> cold = Cold({query}, kBlock, kChunk);
  ASSERT_EQ(cold.size(), 1u);
  const std::vector<int32_t>& expected = cold[0];
  model::testing::TempDir tier("engine_group_tier");
  const std::string tier_dir = tier.path() + "/tier";
  Rank r = Join(plan, kBlock, kChunk, [&](const model::ModelConfig& config, EngineOptions* eo) {
    const KvLayout l = model::KvLayoutFor(config, kBlock, eo->latent_format, eo->index_format);
    eo->kv_cache_gib = static_cast<double>(kPoolBlocks * l.BlockBytes()) / (1ull << 30);
    eo->scheduler.max_step_tokens = 128;
    eo->prefix_cache_disk_dir = tier_dir;
  });
  ASSERT_TRUE(AllRanks(r.group != nullptr));
  if (!r.group->leader()) {
    EXPECT_TRUE(r.group->FollowerLoop().ok());
    return;
  }
  Engine& e = *r.engine;
  ASSERT_TRUE(e.prefix_cache_disk_tier());
  e.Start();
  EventCollector events;
  size_t finished = 0;
  auto run = [&](const std::vector<int32_t>& prompt, int64_t max_tokens) {
    const RequestId id = e.AddRequest(prompt, Greedy(max_tokens, &events)).value();
    EXPECT_TRUE(events.WaitFinished(++finished, std::chrono::seconds(120)));
    return id;
  };
  run(donor, 4);
  for (int k = 0; k < 3; ++k) run(Prompt(150, 70 + k), 2);  // 10 blocks each: the donor's spill
  EXPECT_GT(e.Stats().prefix_tier_stored_blocks, 0);
  const RequestId id = run(query, kMaxTokens);
  EXPECT_EQ(events.Last(id)->cached_prompt_tokens, 96);
  EXPECT_GT(e.Stats().prefix_tier_restored_tokens, 0) << "the hit did not come from the tier";
  EXPECT_EQ(events.Tokens(id), expected);
  EXPECT_TRUE(e.failure().ok());
  EXPECT_EQ(e.pool().n_used(), 0);
  r.engine.reset();
}

}  // namespace
}  // namespace pdserve::engine
