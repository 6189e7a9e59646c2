// Engine tests on the tiny preset: batched greedy == each request alone (with and without
// preemption), seeded sampling repeats, bad input, aborts, stop strings, logprobs, and the KV
// hand-over of the disaggregated prefill / decode path.
#include "engine/engine.h"

#include <gtest/gtest.h>

#include <cstring>
#include <random>

#include "engine/engine_test_util.h"

namespace pdserve::engine {
namespace {

using testing::EventCollector;
using testing::ReferenceGreedy;
using testing::RunUntilIdle;
using testing::TinyModel;

constexpr int64_t kChunk = 32;

EngineOptions Options(int64_t n_blocks, int64_t block_tokens = 16) {
  EngineOptions o;
  o.block_tokens = block_tokens;
  const KvLayout l = model::KvLayoutFor(TinyModel().config(), block_tokens);
  o.kv_cache_gib = static_cast<double>(n_blocks * l.BlockBytes()) / (1ull << 30);
  o.scheduler.max_num_seqs = 64;
  o.scheduler.max_step_tokens = 128;
  o.scheduler.prefill_chunk = kChunk;
  o.seed = 77;
  return o;
}

struct Workload {
  std::vector<std::vector<int32_t>> prompts;
  std::vector<int32_t> max_tokens;
  std::vector<std::vector<int32_t>> expected;
};

// 64 requests of mixed lengths (1..100 prompt tokens, 1..20 outputs) and their alone outputs.
const Workload& Mixed64() {
  static const Workload w = [] {
    Workload w;
    std::mt19937 rng(21);
    const int32_t V = static_cast<int32_t>(TinyModel().config().vocab_size);
    for (int i = 0; i < 64; ++i) {
      const int len = i < 4 ? 1 + i : 1 + static_cast<int>(rng() % 100);
      std::vector<int32_t> p;
      for (int j = 0; j < len; ++j) p.push_back(static_cast<int32_t>(rng() % V));
      w.prompts.push_back(p);
      w.max_tokens.push_back(1 + static_cast<int32_t>(rng() % 20));
      w.expected.push_back(ReferenceGreedy(TinyModel(), p, w.max_tokens.back(), kChunk));
    }
    return w;
  }();
  return w;
}

void RunMixed(int64_t n_blocks, int64_t block_tokens, bool expect_preemption) {
  const Workload& w = Mixed64();
  auto engine = Engine::Create(Options(n_blocks, block_tokens), &TinyModel());
  ASSERT_TRUE(engine.ok()) << engine.status().ToString();
  EventCollector events;
  std::vector<RequestId> ids;
  for (size_t i = 0; i < w.prompts.size(); ++i) {
    RequestOptions ro;
    ro.sampling.temperature = 0.0f;
    ro.sampling.max_tokens = w.max_tokens[i];
    ro.on_event = events.Callback();
    auto id = (*engine)->AddRequest(w.prompts[i], ro);
    ASSERT_TRUE(id.ok()) << id.status().ToString();
    ids.push_back(*id);
  }
  ASSERT_TRUE(RunUntilIdle(engine->get()));
  for (size_t i = 0; i < ids.size(); ++i) {
    EXPECT_EQ(events.Tokens(ids[i]), w.expected[i]) << "request " << i << " prompt " << w.prompts[i].size();
    ASSERT_NE(events.Last(ids[i]), nullptr);
    EXPECT_EQ(events.Last(ids[i])->reason, FinishReason::kLength);
  }
  const EngineStats s = (*engine)->Stats();
  EXPECT_EQ(s.blocks_free, s.blocks_total);
  EXPECT_EQ(s.finished, 64);
  if (expect_preemption) {
    EXPECT_GT(s.preemptions, 0);
  }
  std::printf("blocks %lld: steps %lld, preemptions %lld, prompt rows %lld, output rows %lld\n",
              static_cast<long long>(s.blocks_total), static_cast<long long>(s.steps),
              static_cast<long long>(s.preemptions), static_cast<long long>(s.prompt_rows),
              static_cast<long long>(s.output_rows));
}

TEST(EngineTest, Greedy64ConcurrentEqualsEachAlone) { RunMixed(1024, 16, false); }

TEST(EngineTest, Greedy64ConcurrentEqualsEachAloneUnderPreemption) { RunMixed(20, 16, true); }

TEST(EngineTest, SeededSamplingRepeatsAcrossBatchesAndPreemption) {
  std::mt19937 rng(4);
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < 12; ++i) {
    std::vector<int32_t> p;
    for (int j = 0, n = 5 + static_cast<int>(rng() % 60); j < n; ++j) p.push_back(static_cast<int32_t>(rng() % 1000));
    prompts.push_back(p);
  }
  auto run = [&](int64_t n_blocks, bool together, uint64_t seed_base) {
    auto engine = Engine::Create(Options(n_blocks), &TinyModel());
    EXPECT_TRUE(engine.ok());
    EventCollector events;
    std::vector<std::vector<int32_t>> out;
    std::vector<RequestId> ids;
    for (size_t i = 0; i < prompts.size(); ++i) {
      RequestOptions ro;
      ro.sampling.temperature = 0.9f;
      ro.sampling.top_k = 40;
      ro.sampling.top_p = 0.95f;
      ro.sampling.repetition_penalty = 1.1f;
      ro.sampling.max_tokens = 12;
      ro.sampling.seed = seed_base + i;
      ro.on_event = events.Callback();
      ids.push_back((*engine)->AddRequest(prompts[i], ro).value());
      if (!together) {
        EXPECT_TRUE(RunUntilIdle(engine->get()));
      }
    }
    EXPECT_TRUE(RunUntilIdle(engine->get()));
    for (RequestId id : ids) out.push_back(events.Tokens(id));
    return std::make_pair(out, (*engine)->Stats().preemptions);
  };
  const auto [alone, p0] = run(1024, false, 100);
  const auto [batched, p1] = run(1024, true, 100);
  const auto [preempted, p2] = run(12, true, 100);
  const auto [other_seed, p3] = run(1024, true, 200);
  EXPECT_EQ(alone, batched);
  EXPECT_EQ(alone, preempted);
  EXPECT_GT(p2, 0);
  EXPECT_NE(alone, other_seed);
}

// A migrated request (resumed_output): the prompt plus k tokens of earlier output, resumed on
// another engine, continues exactly as the uninterrupted run, greedy and seeded with every
// penalty (the earlier output counts as output and the sampling index continues at k).
TEST(EngineTest, ResumedRequestContinuesTheUninterruptedRun) {
  std::mt19937 rng(9);
  std::vector<int32_t> prompt;
  for (int j = 0; j < 45; ++j) prompt.push_back(static_cast<int32_t>(rng() % 1000));
  auto generate = [&](const std::vector<int32_t>& p, int32_t resumed, bool seeded) {
    auto engine = Engine::Create(Options(1024), &TinyModel());
    EXPECT_TRUE(engine.ok());
    EventCollector events;
    RequestOptions ro;
    ro.sampling.temperature = seeded ? 0.9f : 0.0f;
    ro.sampling.seed = 5;
    ro.sampling.presence_penalty = seeded ? 0.5f : 0.0f;
    ro.sampling.frequency_penalty = seeded ? 0.3f : 0.0f;
    ro.sampling.repetition_penalty = seeded ? 1.2f : 1.0f;
    ro.sampling.max_tokens = 40 - resumed;
    ro.sampling.resumed_output = resumed;
    ro.on_event = events.Callback();
    const RequestId id = (*engine)->AddRequest(p, ro).value();
    EXPECT_TRUE(RunUntilIdle(engine->get()));
    return events.Tokens(id);
  };
  for (bool seeded : {false, true}) {
    SCOPED_TRACE(seeded ? "seeded" : "greedy");
    const std::vector<int32_t> whole = generate(prompt, 0, seeded);
    ASSERT_EQ(whole.size(), 40u);
    for (int32_t k : {1, 7, 33}) {  // 33: the recomputed output spans a prefill-chunk boundary
      std::vector<int32_t> resumed_prompt = prompt;
      resumed_prompt.insert(resumed_prompt.end(), whole.begin(), whole.begin() + k);
      const std::vector<int32_t> rest = generate(resumed_prompt, k, seeded);
      EXPECT_EQ(rest, std::vector<int32_t>(whole.begin() + k, whole.end())) << "resumed after " << k;
    }
  }
  auto engine = Engine::Create(Options(64), &TinyModel());
  RequestOptions ro;
  ro.sampling.resumed_output = 3;
  EXPECT_EQ((*engine)->AddRequest({1, 2, 3}, ro).status().code(), StatusCode::kInvalidArgument);
  ro.sampling.resumed_output = -1;
  EXPECT_EQ((*engine)->AddRequest({1, 2, 3}, ro).status().code(), StatusCode::kInvalidArgument);
}

TEST(EngineTest, BadInputGetsClearErrorsOthersUnaffected) {
  auto engine = Engine::Create(Options(24), &TinyModel());  // 384 tokens of KV
  ASSERT_TRUE(engine.ok());
  Engine& e = **engine;
  EventCollector events;
  const std::vector<int32_t> good = {5, 9, 13, 200, 7, 7, 1};
  RequestOptions ok_opts;
  ok_opts.sampling.temperature = 0.0f;
  ok_opts.sampling.max_tokens = 10;
  ok_opts.on_event = events.Callback();
  const RequestId id = e.AddRequest(good, ok_opts).value();
  auto expect_error = [&](std::vector<int32_t> prompt, const RequestOptions& ro, const std::string& text) {
    auto r = e.AddRequest(std::move(prompt), ro);
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(r.status().message().find(text), std::string::npos) << r.status().ToString();
  };
  expect_error(std::vector<int32_t>(400, 3), ok_opts, "does not fit the KV cache (384 tokens)");
  expect_error(std::vector<int32_t>(9000, 3), ok_opts, "model context of 8192");
  expect_error({}, ok_opts, "empty prompt");
  expect_error({1, 5000}, ok_opts, "outside the vocabulary");
  auto with = [&](auto edit) {
    RequestOptions ro = ok_opts;
    edit(ro.sampling);
    return ro;
  };
  expect_error(good, with([](SamplingParams& p) { p.temperature = -1.0f; }), "temperature");
  expect_error(good, with([](SamplingParams& p) { p.top_p = 0.0f; }), "top_p");
  expect_error(good, with([](SamplingParams& p) { p.top_p = 1.5f; }), "top_p");
  expect_error(good, with([](SamplingParams& p) { p.top_k = -5; }), "top_k");
  expect_error(good, with([](SamplingParams& p) { p.max_tokens = 0; }), "max_tokens");
  expect_error(good, with([](SamplingParams& p) { p.stop = {"x"}; }), "stop strings need a tokenizer");
  EXPECT_EQ(e.Abort(999999).code(), StatusCode::kNotFound);
  ASSERT_TRUE(RunUntilIdle(&e));
  EXPECT_EQ(events.Tokens(id), ReferenceGreedy(TinyModel(), good, 10, kChunk));
  EXPECT_EQ(e.Stats().finished, 1);
}

TEST(EngineTest, LengthCapAtCacheCapacity) {
  auto engine = Engine::Create(Options(4), &TinyModel());  // 64 tokens
  ASSERT_TRUE(engine.ok());
  EXPECT_EQ((*engine)->max_sequence_length(), 64);
  EventCollector events;
  RequestOptions ro;
  ro.sampling.temperature = 0.0f;
  ro.sampling.max_tokens = 1 << 30;  // the cache capacity ends it first
  ro.on_event = events.Callback();
  std::vector<int32_t> prompt(60, 11);
  const RequestId id = (*engine)->AddRequest(prompt, ro).value();
  ASSERT_TRUE(RunUntilIdle(engine->get()));
  EXPECT_EQ(events.Tokens(id), ReferenceGreedy(TinyModel(), prompt, 1 << 30, kChunk, 64));
  EXPECT_EQ(events.Tokens(id).size(), 4u);
  EXPECT_EQ(events.Last(id)->reason, FinishReason::kLength);
}

TEST(EngineTest, AbortWaitingRunningAndFinished) {
  auto engine = Engine::Create(Options(256), &TinyModel());
  ASSERT_TRUE(engine.ok());
  Engine& e = **engine;
  EventCollector events;
  RequestOptions ro;
  ro.sampling.temperature = 0.0f;
  ro.sampling.max_tokens = 50;
  ro.on_event = events.Callback();
  const RequestId waiting = e.AddRequest({1, 2, 3}, ro).value();
  const RequestId running = e.AddRequest({4, 5, 6}, ro).value();
  ASSERT_TRUE(e.Abort(waiting).ok());  // before any step
  e.Step();
  e.Step();
  ASSERT_EQ(events.Tokens(running).size(), 2u);
  ASSERT_TRUE(e.Abort(running).ok());
  ASSERT_TRUE(RunUntilIdle(&e));
  EXPECT_TRUE(events.Tokens(waiting).empty());
  EXPECT_EQ(events.Last(waiting)->reason, FinishReason::kAbort);
  EXPECT_EQ(events.Last(running)->reason, FinishReason::kAbort);
  EXPECT_EQ(events.Last(running)->output_tokens, 2);
  EXPECT_EQ(e.Abort(running).code(), StatusCode::kNotFound);
  EXPECT_EQ(e.Stats().blocks_free, e.Stats().blocks_total);
  EXPECT_EQ(e.Stats().aborted, 2);
}

TEST(EngineTest, StopTokensStopStringsAndLogprobs) {
  EngineOptions o = Options(256);
  // A toy detokenizer: token t is the letter 'a' + t % 26.
  o.detokenize = [](const std::vector<int32_t>& ids) {
    std::string s;
    for (int32_t t : ids) s.push_back(static_cast<char>('a' + t % 26));
    return s;
  };
  auto engine = Engine::Create(o, &TinyModel());
  ASSERT_TRUE(engine.ok());
  const std::vector<int32_t> prompt = {3, 14, 15, 92, 65, 35};
  const std::vector<int32_t> ref = ReferenceGreedy(TinyModel(), prompt, 12, kChunk);
  std::string text = o.detokenize(ref);
  EventCollector events;
  RequestOptions ro;
  ro.sampling.temperature = 0.0f;
  ro.sampling.max_tokens = 12;
  ro.sampling.logprobs = 3;
  ro.on_event = events.Callback();
  RequestOptions by_token = ro, by_string = ro;
  by_token.sampling.stop_token_ids = {ref[5]};
  by_string.sampling.stop = {"zzzzz", text.substr(3, 3)};  // completes with output token 5
  const RequestId a = (*engine)->AddRequest(prompt, by_token).value();
  const RequestId b = (*engine)->AddRequest(prompt, by_string).value();
  const RequestId c = (*engine)->AddRequest(prompt, ro).value();
  ASSERT_TRUE(RunUntilIdle(engine->get()));
  const size_t first5 = static_cast<size_t>(std::find(ref.begin(), ref.end(), ref[5]) - ref.begin());
  EXPECT_EQ(events.Tokens(a), std::vector<int32_t>(ref.begin(), ref.begin() + static_cast<std::ptrdiff_t>(first5) + 1));
  EXPECT_EQ(events.Last(a)->reason, FinishReason::kStop);
  const size_t hit = text.find(text.substr(3, 3)) + 3;  // tokens up to the first match's end
  EXPECT_EQ(events.Tokens(b), std::vector<int32_t>(ref.begin(), ref.begin() + static_cast<std::ptrdiff_t>(hit)));
  EXPECT_EQ(events.Last(b)->reason, FinishReason::kStop);
  EXPECT_EQ(events.Last(b)->stop_string, text.substr(3, 3));
  EXPECT_EQ(events.Tokens(c), ref);
  const auto all_events = events.events();
  for (const TokenEvent& ev : all_events.at(c)) {
    ASSERT_EQ(ev.top_logprobs.size(), 3u);
    EXPECT_EQ(ev.top_logprobs[0].first, ev.token);  // greedy: the sampled token is the best
    EXPECT_FLOAT_EQ(ev.top_logprobs[0].second, ev.logprob);
    EXPECT_LE(ev.logprob, 0.0f);
    EXPECT_GE(ev.top_logprobs[0].second, ev.top_logprobs[1].second);
  }
}

// Prefill on engine A (KV held), copy the blocks into engine B's reserved blocks, decode on B:
// the output equals the colocated run.
TEST(EngineTest, DisaggregatedHandOverEqualsColocated) {
  auto prefill = Engine::Create(Options(64), &TinyModel());
  auto decode = Engine::Create(Options(64), &TinyModel());
  ASSERT_TRUE(prefill.ok() && decode.ok());
  std::vector<int32_t> prompt;
  for (int i = 0; i < 77; ++i) prompt.push_back((i * 29 + 3) % 1000);
  const std::vector<int32_t> ref = ReferenceGreedy(TinyModel(), prompt, 9, kChunk);
  EventCollector pe, de;
  RequestOptions pro;
  pro.sampling.temperature = 0.0f;
  pro.sampling.max_tokens = 1;
  pro.hold_kv = true;
  pro.on_event = pe.Callback();
  const RequestId pid = (*prefill)->AddRequest(prompt, pro).value();
  ASSERT_TRUE(RunUntilIdle(prefill->get()));
  ASSERT_EQ(pe.Tokens(pid).size(), 1u);
  auto held = (*prefill)->HeldBlocks(pid);
  ASSERT_TRUE(held.ok());
  EXPECT_EQ(held->size(), (*prefill)->pool().layout().BlocksForTokens(77));

  RequestOptions dro;
  dro.sampling.temperature = 0.0f;
  dro.sampling.max_tokens = 9;
  dro.on_event = de.Callback();
  auto import = (*decode)->ReserveImport(prompt, dro);
  ASSERT_TRUE(import.ok()) << import.status().ToString();
  const BlockPool& src = (*prefill)->pool();
  const BlockPool& dst = (*decode)->pool();
  for (size_t b = 0; b < held->size(); ++b)
    std::memcpy(dst.base() + import->block_ids[b] * dst.block_bytes(), src.base() + (*held)[b] * src.block_bytes(),
                static_cast<size_t>(src.block_bytes()));
  ASSERT_TRUE((*prefill)->ReleaseKv(pid).ok());
  EXPECT_EQ((*prefill)->Stats().blocks_free, (*prefill)->Stats().blocks_total);
  ASSERT_TRUE((*decode)->CommitImport(import->id, pe.Tokens(pid)[0]).ok());
  ASSERT_TRUE(RunUntilIdle(decode->get()));
  EXPECT_EQ(de.Tokens(import->id), ref);
  EXPECT_EQ((*decode)->Stats().blocks_free, (*decode)->Stats().blocks_total);
}

}  // namespace
}  // namespace pdserve::engine
