// The prefix cache in the Engine (tiny preset, blocks of 16 tokens, prefill chunk 32): outputs
// with cache hits are bitwise those of a cold engine (tokens and logprobs; greedy and seeded
// sampling), multi-turn prompts hit the previous turn's prompt and reply, eviction under a
// tiny pool, sharing with a live request that finishes or aborts, preemption, resumed
// requests, imported KV (registered only for an equal namespace), and no leaked block.
// To add a case: run the prompts through a cold engine (Options(n, false)) and a warm one and
// compare Generate's results.
#include <gtest/gtest.h>

#include <cstring>
#include <random>

#include "engine/engine.h"
#include "engine/engine_test_util.h"

namespace pdserve::engine {
namespace {

using testing::Collect;
using testing::Concat;
using testing::EventCollector;
using testing::Generate;
using testing::Greedy;
using testing::Output;
using testing::Random;
using testing::ReferenceGreedy;
using testing::RunUntilIdle;
using testing::Seeded;
using testing::TinyModel;

constexpr int64_t kBlock = testing::kPrefixTestBlock;
constexpr int64_t kChunk = testing::kPrefixTestChunk;

EngineOptions Options(int64_t n_blocks, bool cache = true, KvLatentFormat latent = KvLatentFormat::kFp8Blockwise) {
  return testing::PrefixTestOptions(n_blocks, cache, latent);
}
std::unique_ptr<Engine> Make(const EngineOptions& o) { return testing::MakeEngine(o); }

// The same request on a fresh engine without the cache.
Output Cold(const std::vector<int32_t>& prompt, const SamplingParams& p) {
  auto e = Make(Options(256, false));
  return Generate(e.get(), prompt, p);
}

void ExpectNoLeak(Engine* e) {
  EngineStats s = e->Stats();
  EXPECT_EQ(s.blocks_free, s.blocks_total);  // idle cached blocks count as free
  e->ClearPrefixCache();
  s = e->Stats();
  EXPECT_EQ(s.prefix_cached_blocks, 0);
  EXPECT_EQ(s.prefix_idle_blocks, 0);
  EXPECT_EQ(s.blocks_free, s.blocks_total);
  EXPECT_EQ(e->pool().n_free(), e->pool().n_blocks());
}

TEST(EnginePrefixTest, HitsAreBitwiseColdGreedyAndSeeded) {
  std::mt19937 rng(11);
  const std::vector<int32_t> shared = Random(&rng, 100);
  const std::vector<int32_t> donor = Concat(shared, Random(&rng, 30));
  const std::vector<int32_t> q = Concat(shared, Random(&rng, 21));
  for (const SamplingParams& p : {Greedy(12), Seeded(12, 99)}) {
    auto e = Make(Options(256));
    const Output d = Generate(e.get(), donor, p);
    EXPECT_EQ(d.cached, 0);
    const Output warm = Generate(e.get(), q, p);
    // 100 shared tokens: 6 whole blocks of 16 (96 >= the first chunk of 32).
    EXPECT_EQ(warm.cached, 96);
    const Output cold = Cold(q, p);
    EXPECT_EQ(cold.cached, 0);
    EXPECT_TRUE(warm == cold) << "temperature " << p.temperature;
    if (p.greedy()) {
      EXPECT_EQ(warm.tokens, ReferenceGreedy(TinyModel(), q, 12, kChunk));
    }
    // The donor again: its whole prompt but the last block is cached (never the last token).
    const Output again = Generate(e.get(), donor, p);
    EXPECT_EQ(again.cached, 128);
    EXPECT_TRUE(again == d);
    const EngineStats s = e->Stats();
    EXPECT_EQ(s.prefix_lookup_tokens, 130 + 121 + 130);
    EXPECT_EQ(s.prefix_hit_tokens, 96 + 128);
    EXPECT_EQ(s.prefix_computed_tokens, s.prefix_lookup_tokens - s.prefix_hit_tokens);
    EXPECT_GT(s.prefix_cached_blocks, 0);
    ExpectNoLeak(e.get());
  }
}

TEST(EnginePrefixTest, ShortPrefixesAndTheOffSwitchDoNotHit) {
  std::mt19937 rng(12);
  const std::vector<int32_t> shared = Random(&rng, 40);
  auto e = Make(Options(128));
  // A shared prefix shorter than one block plus the first chunk: nothing to take.
  Generate(e.get(), Concat(std::vector<int32_t>(shared.begin(), shared.begin() + 20), Random(&rng, 30)), Greedy(3));
  EXPECT_EQ(Generate(e.get(), Concat(std::vector<int32_t>(shared.begin(), shared.begin() + 20), Random(&rng, 30)),
                     Greedy(3)).cached, 0);
  // A prompt shorter than the first chunk registers nothing (its KV before position 32 is
  // partly decoded, another form than a prefill's).
  const std::vector<int32_t> small = Random(&rng, 20);
  const Output s1 = Generate(e.get(), small, Greedy(30));
  EXPECT_EQ(Generate(e.get(), Concat(small, s1.tokens), Greedy(3)).cached, 0);
  auto off = Make(Options(128, false));
  EXPECT_FALSE(off->prefix_cache_enabled());
  Generate(off.get(), Concat(shared, Random(&rng, 10)), Greedy(3));
  EXPECT_EQ(Generate(off.get(), Concat(shared, Random(&rng, 10)), Greedy(3)).cached, 0);
  EXPECT_EQ(off->Stats().prefix_cached_blocks, 0);
  EXPECT_EQ(off->Stats().prefix_lookup_tokens, 0);
}

// Whole-prompt engines (a CP prefill's scheduling; here in one process, where the model's
// non-absorbed form is the same per row): a cold prompt is one non-absorbed call, its reply
// absorbed decode rows. Only prompt blocks are cached, a hit maps whole blocks of an earlier
// prompt (no first-chunk minimum), and the rest runs as a kPromptRest chunk: every turn is
// bitwise a cold whole-prompt engine's, greedy and seeded.
EngineOptions WholePrompts(int64_t n_blocks, bool cache = true) {
  EngineOptions o = Options(n_blocks, cache);
  o.scheduler.whole_prompts = true;
  return o;
}

TEST(EnginePrefixTest, WholePromptEnginesReuseEarlierPromptsExactly) {
  std::mt19937 rng(17);
  auto e = Make(WholePrompts(256));
  ASSERT_TRUE(e->prefix_cache_enabled());
  EXPECT_EQ(e->prefix_cache_first_chunk_tokens(), 1);
  std::vector<int32_t> history = Random(&rng, 40);
  int64_t previous_prompt = 0;
  for (int turn = 0; turn < 4; ++turn) {
    const SamplingParams p = turn % 2 ? Seeded(12, 3 + turn) : Greedy(12);
    const Output warm = Generate(e.get(), history, p);
    auto cold_engine = Make(WholePrompts(256, false));
    const Output cold = Generate(cold_engine.get(), history, p);
    EXPECT_TRUE(warm == cold) << "turn " << turn;
    // The previous prompt's whole blocks, not its reply (decoded: another form than a prompt's).
    EXPECT_EQ(warm.cached, previous_prompt / kBlock * kBlock) << "turn " << turn;
    previous_prompt = static_cast<int64_t>(history.size());
    history = Concat(Concat(history, warm.tokens), Random(&rng, 9));
  }
  // A prompt of the same blocks as a cached one plus one token computes that token alone; a
  // one-block hit is taken (16 tokens, under the chunked engines' 32-token first chunk).
  const std::vector<int32_t> again = Concat(std::vector<int32_t>(history.begin(), history.begin() + 48), {history[48]});
  EXPECT_EQ(Generate(e.get(), again, Greedy(4)).cached, 48);
  const std::vector<int32_t> one_block = Concat(std::vector<int32_t>(history.begin(), history.begin() + 16), Random(&rng, 7));
  const Output warm = Generate(e.get(), one_block, Greedy(4));
  EXPECT_EQ(warm.cached, 16);
  auto cold_engine = Make(WholePrompts(256, false));
  EXPECT_TRUE(warm == Generate(cold_engine.get(), one_block, Greedy(4)));
  ExpectNoLeak(e.get());
}

TEST(EnginePrefixTest, MultiTurnHitsThePreviousPromptAndReply) {
  std::mt19937 rng(13);
  auto e = Make(Options(256));
  std::vector<int32_t> history = Random(&rng, 70);  // system prompt + first user turn
  for (int turn = 0; turn < 4; ++turn) {
    const SamplingParams p = turn % 2 ? Seeded(25, 7 + turn) : Greedy(25);
    const Output warm = Generate(e.get(), history, p);
    const Output cold = Cold(history, p);
    EXPECT_TRUE(warm == cold) << "turn " << turn;
    if (turn > 0) {
      // The previous turn computed its prompt and all but its last reply token: every whole
      // block of that is cached, and this prompt starts with it.
      const int64_t computed_before = static_cast<int64_t>(history.size()) - 20 - 1;
      EXPECT_EQ(warm.cached, computed_before / kBlock * kBlock) << "turn " << turn;
    } else {
      EXPECT_EQ(warm.cached, 0);
    }
    history = Concat(Concat(history, warm.tokens), Random(&rng, 20));  // reply + the next user turn
  }
  ExpectNoLeak(e.get());
}

TEST(EnginePrefixTest, EvictionUnderATinyPoolKeepsOutputsExact) {
  // 24 blocks of 16 tokens: a few prompts fill the pool; every new request evicts cached blocks.
  std::mt19937 rng(14);
  std::vector<std::vector<int32_t>> prefixes;
  for (int i = 0; i < 3; ++i) prefixes.push_back(Random(&rng, 80));
  auto e = Make(Options(24));
  for (int round = 0; round < 12; ++round) {
    const std::vector<int32_t> prompt = Concat(prefixes[static_cast<size_t>(round % 3)], Random(&rng, 5 + round));
    const Output out = Generate(e.get(), prompt, Greedy(10));
    EXPECT_EQ(out.tokens, ReferenceGreedy(TinyModel(), prompt, 10, kChunk)) << "round " << round;
  }
  const EngineStats s = e->Stats();
  EXPECT_GT(s.prefix_evictions, 0);
  EXPECT_GT(s.prefix_hit_tokens, 0);
  // Many requests at once in the same tiny pool: preemption and eviction together.
  EventCollector ev;
  std::vector<std::pair<RequestId, std::vector<int32_t>>> ids;
  for (int i = 0; i < 8; ++i) {
    RequestOptions ro;
    ro.sampling = Greedy(12);
    ro.on_event = ev.Callback();
    std::vector<int32_t> prompt = Concat(prefixes[static_cast<size_t>(i % 3)], Random(&rng, 3 + i));
    ids.emplace_back((*e).AddRequest(prompt, ro).value(), prompt);
  }
  ASSERT_TRUE(RunUntilIdle(e.get()));
  for (const auto& [id, prompt] : ids) EXPECT_EQ(ev.Tokens(id), ReferenceGreedy(TinyModel(), prompt, 12, kChunk));
  EXPECT_GT(e->Stats().preemptions, 0);
  ExpectNoLeak(e.get());
}

TEST(EnginePrefixTest, SharersOfALiveRequestSurviveItsFinishAndAbort) {
  std::mt19937 rng(15);
  const std::vector<int32_t> shared = Random(&rng, 90);
  auto e = Make(Options(256));
  EventCollector ev;
  // A long-running donor: once its prompt is computed, its blocks are cached while it decodes.
  RequestOptions dro;
  dro.sampling = Greedy(200);
  dro.on_event = ev.Callback();
  const std::vector<int32_t> donor = Concat(shared, Random(&rng, 7));
  const RequestId did = e->AddRequest(donor, dro).value();
  for (int i = 0; i < 6; ++i) e->Step();
  EXPECT_GT(e->Stats().prefix_cached_blocks, 0);
  std::vector<std::pair<RequestId, std::vector<int32_t>>> sharers;
  for (int i = 0; i < 6; ++i) {
    RequestOptions ro;
    ro.sampling = i % 2 ? Seeded(15, 100 + i) : Greedy(15);
    ro.on_event = ev.Callback();
    std::vector<int32_t> prompt = Concat(shared, Random(&rng, 4 + 3 * i));
    sharers.emplace_back(e->AddRequest(prompt, ro).value(), prompt);
  }
  for (int i = 0; i < 3; ++i) e->Step();
  // The donor goes away (abort) while the sharers still read its blocks; one sharer too.
  ASSERT_TRUE(e->Abort(did).ok());
  ASSERT_TRUE(e->Abort(sharers[1].first).ok());
  ASSERT_TRUE(RunUntilIdle(e.get()));
  EXPECT_EQ(ev.Last(did)->reason, FinishReason::kAbort);
  EXPECT_EQ(ev.Last(sharers[1].first)->reason, FinishReason::kAbort);
  for (size_t i = 0; i < sharers.size(); ++i) {
    if (i == 1) continue;
    const Output warm = Collect(ev, sharers[i].first);
    EXPECT_EQ(warm.cached, 80) << i;  // 5 whole blocks of the 90 shared tokens
    const SamplingParams p = i % 2 ? Seeded(15, 100 + i) : Greedy(15);
    EXPECT_TRUE(warm == Cold(sharers[i].second, p)) << "sharer " << i;
  }
  ExpectNoLeak(e.get());
}

// Requests that arrive together with one prompt prefix (OpenAI `n` > 1, a burst behind one
// system prompt): the later ones wait for the first one's prefill and map its blocks instead of
// computing the same chunks beside it; outputs stay those of a cold engine.
TEST(EnginePrefixTest, ConcurrentRequestsWithOnePrefixComputeItOnce) {
  std::mt19937 rng(21);
  const std::vector<int32_t> shared = Random(&rng, 100);
  auto e = Make(Options(256));
  EventCollector ev;
  std::vector<std::pair<RequestId, std::vector<int32_t>>> reqs;
  for (int i = 0; i < 4; ++i) {
    RequestOptions ro;
    ro.sampling = i % 2 ? Seeded(10, 300 + i) : Greedy(10);
    ro.on_event = ev.Callback();
    // Request 0 and 1 have the same prompt (two choices of one request); 2 and 3 add a turn.
    std::vector<int32_t> prompt = i < 2 ? shared : Concat(shared, Random(&rng, 5 + i));
    reqs.emplace_back(e->AddRequest(prompt, ro).value(), prompt);
  }
  ASSERT_TRUE(RunUntilIdle(e.get()));
  for (size_t i = 0; i < reqs.size(); ++i) {
    const Output warm = Collect(ev, reqs[i].first);
    // The first computes all; request 1, its twin (the same prompt), copies the whole
    // prompt's KV (scheduler.h: twin prompts); the others map the 6 whole blocks (96 tokens)
    // of the shared 100.
    EXPECT_EQ(warm.cached, i == 0 ? 0 : i == 1 ? 100 : 96) << i;
    const SamplingParams p = i % 2 ? Seeded(10, 300 + static_cast<int>(i)) : Greedy(10);
    EXPECT_TRUE(warm == Cold(reqs[i].second, p)) << "request " << i;
  }
  EXPECT_EQ(e->Stats().prefix_hit_tokens, 100 + 2 * 96);
  ExpectNoLeak(e.get());
}

TEST(EnginePrefixTest, ResumedRequestHitsAndContinuesExactly) {
  // A migrated request (resumed_output) re-sends prompt + output so far; a cached prefix of
  // the prompt part is used, and its continuation equals the cold engine's.
  std::mt19937 rng(16);
  const std::vector<int32_t> prompt = Random(&rng, 75);
  auto e = Make(Options(256));
  const Output first = Generate(e.get(), prompt, Greedy(20));
  std::vector<int32_t> resumed = Concat(prompt, std::vector<int32_t>(first.tokens.begin(), first.tokens.begin() + 8));
  SamplingParams p = Greedy(12);
  p.resumed_output = 8;
  const Output warm = Generate(e.get(), resumed, p);
  // The first run cached 5 whole blocks (80 positions: its prompt and 5 output tokens); all
  // of them are mapped, and the report counts the prompt part (prompt_tokens is 75 here).
  EXPECT_EQ(warm.cached, 75);
  EXPECT_EQ(e->Stats().prefix_hit_tokens, 75);
  EXPECT_TRUE(warm == Cold(resumed, p));
  EXPECT_EQ(warm.tokens, std::vector<int32_t>(first.tokens.begin() + 8, first.tokens.end()));
  ExpectNoLeak(e.get());
}

// Prefill on `prefill` with hold_kv, the blocks copied into `decode`'s reservation as the KV
// transfer would, the import committed with `origin` as imported_kv_namespace; returns the
// decode output.
Output HandOver(Engine* prefill, Engine* decode, const std::vector<int32_t>& prompt, int32_t max_tokens,
                uint64_t origin) {
  EventCollector pe, de;
  RequestOptions pro;
  pro.sampling = Greedy(1);
  pro.hold_kv = true;
  pro.on_event = pe.Callback();
  const RequestId pid = prefill->AddRequest(prompt, pro).value();
  PDSERVE_CHECK(RunUntilIdle(prefill));
  const std::vector<int32_t> held = prefill->HeldBlocks(pid).value();
  RequestOptions dro;
  dro.sampling = Greedy(max_tokens);
  dro.on_event = de.Callback();
  dro.imported_kv_namespace = origin;
  const KvImport imp = decode->ReserveImport(prompt, dro).value();
  const BlockPool& src = prefill->pool();
  const BlockPool& dst = decode->pool();
  for (size_t b = 0; b < held.size(); ++b)
    std::memcpy(dst.base() + imp.block_ids[b] * dst.block_bytes(), src.base() + held[b] * src.block_bytes(),
                static_cast<size_t>(src.block_bytes()));
  PDSERVE_CHECK(prefill->ReleaseKv(pid).ok());
  PDSERVE_CHECK(decode->CommitImport(imp.id, pe.Tokens(pid)[0]).ok());
  PDSERVE_CHECK(RunUntilIdle(decode));
  return Collect(de, imp.id);  // (its first token is the prefill's, emitted at the commit)
}

TEST(EnginePrefixTest, ImportedKvIsCachedOnlyFromAnEqualNamespace) {
  std::mt19937 rng(17);
  const std::vector<int32_t> prompt = Random(&rng, 90);
  auto prefill = Make(Options(128));
  auto decode = Make(Options(128));
  auto bf16 = Make(Options(128, true, KvLatentFormat::kBf16));
  ASSERT_EQ(prefill->prefix_cache_namespace(), decode->prefix_cache_namespace());
  ASSERT_NE(prefill->prefix_cache_namespace(), bf16->prefix_cache_namespace());
  // Unknown origin: the decode side caches nothing of it (nor of what it decodes after).
  const Output a = HandOver(prefill.get(), decode.get(), prompt, 30, 0);
  EXPECT_EQ(decode->Stats().prefix_cached_blocks, 0);
  // Another KV format's namespace: not cached either.
  HandOver(prefill.get(), decode.get(), prompt, 30, bf16->prefix_cache_namespace());
  EXPECT_EQ(decode->Stats().prefix_cached_blocks, 0);
  // The prefill engine's own namespace: the imported prompt and the reply join the cache, and
  // the next turn on the decode engine (as a colocated worker would run it) hits them.
  const Output b = HandOver(prefill.get(), decode.get(), prompt, 30, prefill->prefix_cache_namespace());
  EXPECT_TRUE(a == b);
  EXPECT_GT(decode->Stats().prefix_cached_blocks, 0);
  std::vector<int32_t> next = Concat(prompt, b.tokens);
  next = Concat(next, Random(&rng, 9));
  const Output warm = Generate(decode.get(), next, Greedy(10));
  // prompt 90 + 30 imported/decoded positions... all but the last reply token: 119 -> 112.
  EXPECT_EQ(warm.cached, 112);
  EXPECT_TRUE(warm == Cold(next, Greedy(10)));
  // A cached prefix on the prefill side too: the second and third hand-overs hit the first's
  // prompt blocks there, and exported them from shared blocks.
  EXPECT_GT(prefill->Stats().prefix_hit_tokens, 0);
  ExpectNoLeak(prefill.get());
  ExpectNoLeak(decode.get());
  ExpectNoLeak(bf16.get());
}

TEST(EnginePrefixTest, DifferentKvFormatsNeverShare) {
  // Two engines over one model with other latent formats: equal tokens, other names, so a
  // warm fp8 engine gives nothing to a bf16 one, and each format's warm output equals its cold.
  std::mt19937 rng(18);
  const std::vector<int32_t> prompt = Random(&rng, 100);
  for (KvLatentFormat f : {KvLatentFormat::kBf16, KvLatentFormat::kInt8PerToken}) {
    auto e = Make(Options(128, true, f));
    Generate(e.get(), prompt, Greedy(4));
    const Output warm = Generate(e.get(), Concat(prompt, {1, 2, 3}), Greedy(6));
    EXPECT_EQ(warm.cached, 96);
    auto cold = Make(Options(128, false, f));
    EXPECT_TRUE(warm == Generate(cold.get(), Concat(prompt, {1, 2, 3}), Greedy(6))) << LatentFormatName(f);
  }
}

// What a pull does between two engines (services/worker KvPusher and PrefillWorker do it over the
// transfer layer): pin the holder's prefix, copy the blocks' bytes into blocks the puller
// allocated, adopt them there, unpin.
int64_t CopyPrefix(Engine* holder, Engine* puller, const std::vector<int32_t>& tokens, int64_t first_block,
                   int64_t end_block) {
  const std::vector<int32_t> pinned = holder->PinCachedPrefix(tokens, end_block);
  EXPECT_EQ(static_cast<int64_t>(pinned.size()), end_block);
  if (static_cast<int64_t>(pinned.size()) < end_block) {
    holder->UnpinBlocks(pinned);
    return 0;
  }
  auto blocks = puller->AllocatePullBlocks(end_block - first_block);
  EXPECT_TRUE(blocks.ok());
  const int64_t bytes = holder->pool().block_bytes();
  for (int64_t j = first_block; j < end_block; ++j)
    std::memcpy(puller->pool().base() + (*blocks)[static_cast<size_t>(j - first_block)] * bytes,
                holder->pool().base() + pinned[static_cast<size_t>(j)] * bytes, static_cast<size_t>(bytes));
  holder->UnpinBlocks(pinned);
  return puller->AdoptPulledBlocks(tokens, first_block, *blocks);
}

TEST(EnginePrefixTest, PulledBlocksAreBitwiseHitsOnAnotherEngine) {
  std::mt19937 rng(19);
  const std::vector<int32_t> shared = Random(&rng, 100);
  const std::vector<int32_t> donor = Concat(shared, Random(&rng, 30));
  const std::vector<int32_t> q = Concat(shared, Random(&rng, 21));
  for (const SamplingParams& p : {Greedy(12), Seeded(12, 99)}) {
    auto holder = Make(Options(256));
    auto puller = Make(Options(256));
    ASSERT_EQ(holder->prefix_cache_namespace(), puller->prefix_cache_namespace());
    Generate(holder.get(), donor, p);
    EXPECT_EQ(holder->CachedPrefixBlocks(q, 100), 6);
    EXPECT_EQ(puller->CachedPrefixBlocks(q, 100), 0);
    // The whole prefix: 6 blocks of 16 (96 >= the first chunk).
    EXPECT_EQ(CopyPrefix(holder.get(), puller.get(), q, 0, 6), 96);
    EXPECT_EQ(puller->CachedPrefixBlocks(q, 100), 6);
    const Output pulled = Generate(puller.get(), q, p);
    EXPECT_EQ(pulled.cached, 96);
    EXPECT_TRUE(pulled == Cold(q, p)) << "temperature " << p.temperature;
    EXPECT_EQ(puller->Stats().prefix_pulled_tokens, 96);
    EXPECT_EQ(holder->Stats().prefix_pushed_tokens, 96);
    ExpectNoLeak(holder.get());
    ExpectNoLeak(puller.get());
  }
}

TEST(EnginePrefixTest, APullContinuesTheLocalPrefixOrAdoptsNothing) {
  std::mt19937 rng(20);
  const std::vector<int32_t> system = Random(&rng, 40);
  const std::vector<int32_t> turn1 = Concat(system, Random(&rng, 90));
  const std::vector<int32_t> turn2 = Concat(turn1, Random(&rng, 15));
  auto holder = Make(Options(256));
  auto puller = Make(Options(256));
  Generate(holder.get(), turn1, Greedy(5));
  // The puller holds only the system prompt's 2 blocks (40 tokens, first chunk 32).
  Generate(puller.get(), Concat(system, Random(&rng, 8)), Greedy(2));
  ASSERT_EQ(puller->CachedPrefixBlocks(turn2, 100), 2);
  // Blocks 2..8 come from the holder and chain onto the puller's own two.
  EXPECT_EQ(CopyPrefix(holder.get(), puller.get(), turn2, 2, 8), 96);
  const Output warm = Generate(puller.get(), turn2, Greedy(10));
  EXPECT_EQ(warm.cached, 128);
  EXPECT_TRUE(warm == Cold(turn2, Greedy(10)));
  // The local prefix was evicted before the pull landed: nothing is adopted (the blocks would
  // chain onto nothing), the blocks go back, and the request computes everything.
  auto late = Make(Options(256));
  Generate(late.get(), Concat(system, Random(&rng, 8)), Greedy(2));
  const std::vector<int32_t> pinned = holder->PinCachedPrefix(turn2, 8);
  ASSERT_EQ(pinned.size(), 8u);
  auto blocks = late->AllocatePullBlocks(6);
  ASSERT_TRUE(blocks.ok());
  late->ClearPrefixCache();
  EXPECT_EQ(late->AdoptPulledBlocks(turn2, 2, *blocks), 0);
  holder->UnpinBlocks(pinned);
  EXPECT_EQ(Generate(late.get(), turn2, Greedy(3)).cached, 0);
  EXPECT_EQ(late->Stats().prefix_pulled_tokens, 0);
  for (Engine* e : {holder.get(), puller.get(), late.get()}) ExpectNoLeak(e);
}

}  // namespace
}  // namespace pdserve::engine
