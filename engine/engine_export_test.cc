// Engine tests of the layer-wise KV export (KvExportHooks: a prefill worker streams each layer
// of a prompt's KV while the next computes) and of the queue figures (queue time per request,
// queued tokens) the worker services report.
#include <gtest/gtest.h>

#include <cstring>

#include "engine/engine.h"
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
  const KvLayout l = KvLayout::ForConfig(TinyModel().config(), block_tokens);
  o.kv_cache_gib = static_cast<double>(n_blocks * l.BlockBytes()) / (1ull << 30);
  o.scheduler.max_step_tokens = 128;
  o.scheduler.prefill_chunk = kChunk;
  o.seed = 77;
  return o;
}

std::vector<int32_t> MakePrompt(int n, int salt) {
  std::vector<int32_t> p;
  for (int i = 0; i < n; ++i) p.push_back((i * 29 + salt * 7 + 3) % 1000);
  return p;
}

// What the export hooks saw, in order.
struct ExportLog {
  std::vector<std::string> calls;  // "begin", "layer 0", ..., "event"
  std::vector<int32_t> blocks;
  // Layer l's slab of every block, copied when layer_done(l) was called: what a layer-wise
  // sender would have written then.
  std::vector<std::vector<uint8_t>> slabs;
};

RequestOptions ExportOptions(const Engine* engine, ExportLog* log, EventCollector* events) {
  RequestOptions ro;
  ro.sampling.temperature = 0.0f;
  ro.sampling.max_tokens = 1;
  ro.hold_kv = true;
  ro.kv_export.begin = [log](const std::vector<int32_t>& ids) {
    log->calls.push_back("begin");
    log->blocks = ids;
  };
  ro.kv_export.layer_done = [engine, log](int64_t layer) {
    log->calls.push_back("layer " + std::to_string(layer));
    const BlockPool& pool = engine->pool();
    const int64_t slab = pool.layout().SlabBytes();
    std::vector<uint8_t> copy;
    for (int32_t b : log->blocks) {
      const uint8_t* p = pool.base() + b * pool.block_bytes() + layer * slab;
      copy.insert(copy.end(), p, p + slab);
    }
    log->slabs.push_back(std::move(copy));
  };
  EventCallback inner = events->Callback();
  ro.on_event = [log, inner](const TokenEvent& ev) {
    log->calls.push_back("event");
    inner(ev);
  };
  return ro;
}

// A 77-token prompt in 3 chunks: the export begins once (before the last chunk's forward),
// every layer is reported once, in order, before the first-token event; the slabs copied at
// each report are final (a decode engine fed only those copies continues exactly like the
// colocated run); a colocated request batched alongside is unaffected.
TEST(EngineExportTest, LayersReportedInOrderAreFinalAndDecodeEqualsColocated) {
  auto prefill = Engine::Create(Options(64), &TinyModel());
  auto decode = Engine::Create(Options(64), &TinyModel());
  ASSERT_TRUE(prefill.ok() && decode.ok());
  const int64_t L = TinyModel().config().num_hidden_layers;
  const std::vector<int32_t> prompt = MakePrompt(77, 1), other = MakePrompt(50, 2);
  const std::vector<int32_t> ref = ReferenceGreedy(TinyModel(), prompt, 9, kChunk);
  const std::vector<int32_t> other_ref = ReferenceGreedy(TinyModel(), other, 12, kChunk);
  ExportLog log;
  EventCollector pe, de;
  const RequestId pid = (*prefill)->AddRequest(prompt, ExportOptions(prefill->get(), &log, &pe)).value();
  RequestOptions co;
  co.sampling.temperature = 0.0f;
  co.sampling.max_tokens = 12;
  co.on_event = pe.Callback();
  const RequestId cid = (*prefill)->AddRequest(other, co).value();
  ASSERT_TRUE(RunUntilIdle(prefill->get()));

  std::vector<std::string> want = {"begin"};
  for (int64_t l = 0; l < L; ++l) want.push_back("layer " + std::to_string(l));
  want.push_back("event");
  EXPECT_EQ(log.calls, want);
  EXPECT_EQ((*prefill)->Stats().kv_exports, 1);
  EXPECT_EQ(pe.Tokens(cid), other_ref);
  ASSERT_EQ(pe.Tokens(pid).size(), 1u);
  EXPECT_EQ(pe.Tokens(pid)[0], ref[0]);
  auto held = (*prefill)->HeldBlocks(pid);
  ASSERT_TRUE(held.ok());
  EXPECT_EQ(*held, log.blocks);
  EXPECT_EQ(static_cast<int64_t>(log.blocks.size()), (*prefill)->pool().layout().BlocksForTokens(77));

  // Nothing changed a layer after it was reported.
  const BlockPool& src = (*prefill)->pool();
  const int64_t slab = src.layout().SlabBytes();
  for (int64_t l = 0; l < L; ++l)
    for (size_t b = 0; b < held->size(); ++b)
      EXPECT_EQ(std::memcmp(log.slabs[l].data() + b * slab, src.base() + (*held)[b] * src.block_bytes() + l * slab,
                            static_cast<size_t>(slab)),
                0)
          << "layer " << l << " block " << b;

  // Decode from the reported copies only.
  RequestOptions dro;
  dro.sampling.temperature = 0.0f;
  dro.sampling.max_tokens = 9;
  dro.on_event = de.Callback();
  auto import = (*decode)->ReserveImport(prompt, dro);
  ASSERT_TRUE(import.ok()) << import.status().ToString();
  const BlockPool& dst = (*decode)->pool();
  for (int64_t l = 0; l < L; ++l)
    for (size_t b = 0; b < held->size(); ++b)
      std::memcpy(dst.base() + import->block_ids[b] * dst.block_bytes() + l * slab, log.slabs[l].data() + b * slab,
                  static_cast<size_t>(slab));
  ASSERT_TRUE((*prefill)->ReleaseKv(pid).ok());
  EXPECT_EQ((*prefill)->Stats().blocks_free, (*prefill)->Stats().blocks_total);
  ASSERT_TRUE((*decode)->CommitImport(import->id, pe.Tokens(pid)[0]).ok());
  ASSERT_TRUE(RunUntilIdle(decode->get()));
  EXPECT_EQ(de.Tokens(import->id), ref);
}

// A forward failing after layer 1 (injected): the exporting request ends with an error event
// after layers 0 and 1 were reported, keeps its blocks (the exporter may still be reading them)
// until ReleaseKv, and the engine keeps serving.
TEST(EngineExportTest, FailureMidLayersKeepsBlocksUntilRelease) {
  EngineOptions o = Options(64);
  o.layer_fault_hook = [](int64_t layer) {
    return layer == 1 ? Status::Internal("injected test fault: forward failed after layer 1") : Status::Ok();
  };
  auto engine = Engine::Create(o, &TinyModel());
  ASSERT_TRUE(engine.ok());
  ExportLog log;
  EventCollector events;
  const RequestId id = (*engine)->AddRequest(MakePrompt(40, 3), ExportOptions(engine->get(), &log, &events)).value();
  ASSERT_TRUE(RunUntilIdle(engine->get()));
  EXPECT_EQ(log.calls, (std::vector<std::string>{"begin", "layer 0", "layer 1", "event"}));
  const TokenEvent* last = events.Last(id);
  ASSERT_NE(last, nullptr);
  EXPECT_TRUE(last->finished);
  EXPECT_EQ(last->reason, FinishReason::kError);
  EXPECT_NE(last->error.message().find("injected"), std::string::npos) << last->error.ToString();
  auto held = (*engine)->HeldBlocks(id);
  ASSERT_TRUE(held.ok()) << held.status().ToString();
  EXPECT_EQ(*held, log.blocks);
  EXPECT_EQ((*engine)->Stats().blocks_held, static_cast<int64_t>(log.blocks.size()));
  ASSERT_TRUE((*engine)->ReleaseKv(id).ok());
  EXPECT_EQ((*engine)->Stats().blocks_free, (*engine)->Stats().blocks_total);
  // Requests without an export are not affected by the fault.
  RequestOptions ro;
  ro.sampling.temperature = 0.0f;
  ro.sampling.max_tokens = 4;
  ro.on_event = events.Callback();
  const RequestId ok = (*engine)->AddRequest(MakePrompt(40, 3), ro).value();
  ASSERT_TRUE(RunUntilIdle(engine->get()));
  EXPECT_EQ(events.Tokens(ok), ReferenceGreedy(TinyModel(), MakePrompt(40, 3), 4, kChunk));
}

TEST(EngineExportTest, ExportNeedsHeldSingleTokenPrefill) {
  auto engine = Engine::Create(Options(64), &TinyModel());
  ASSERT_TRUE(engine.ok());
  RequestOptions ro;
  ro.sampling.max_tokens = 1;
  ro.kv_export.layer_done = [](int64_t) {};
  EXPECT_EQ((*engine)->AddRequest(MakePrompt(8, 0), ro).status().code(), StatusCode::kInvalidArgument);
  ro.hold_kv = true;
  ro.sampling.max_tokens = 2;
  EXPECT_EQ((*engine)->AddRequest(MakePrompt(8, 0), ro).status().code(), StatusCode::kInvalidArgument);
  ro.sampling.max_tokens = 1;
  EXPECT_EQ((*engine)->ReserveImport(MakePrompt(8, 0), ro).status().code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE((*engine)->AddRequest(MakePrompt(8, 0), ro).ok());
}

// One sequence at a time: queued tokens count what is owed, and each request's first event
// carries its queue time, growing with its place in the queue.
TEST(EngineExportTest, QueueTimeAndQueuedTokens) {
  EngineOptions o = Options(64);
  o.scheduler.max_num_seqs = 1;
  auto engine = Engine::Create(o, &TinyModel());
  ASSERT_TRUE(engine.ok());
  EventCollector events;
  std::vector<RequestId> ids;
  for (int k = 0; k < 3; ++k) {
    RequestOptions ro;
    ro.sampling.temperature = 0.0f;
    ro.sampling.max_tokens = 5;
    ro.on_event = events.Callback();
    ids.push_back((*engine)->AddRequest(MakePrompt(10, k), ro).value());
  }
  EngineStats s = (*engine)->Stats();
  EXPECT_EQ(s.waiting, 3);
  EXPECT_EQ(s.queued_tokens, 3 * (10 + 5));
  ASSERT_TRUE((*engine)->Step());  // request 0: prompt computed, first token sampled
  s = (*engine)->Stats();
  EXPECT_EQ(s.running, 1);
  EXPECT_EQ(s.waiting, 2);
  EXPECT_EQ(s.queued_tokens, 4 + 2 * (10 + 5));
  ASSERT_TRUE(RunUntilIdle(engine->get()));
  EXPECT_EQ((*engine)->Stats().queued_tokens, 0);
  std::vector<double> queue;
  for (RequestId id : ids) {
    int with = 0;
    for (const TokenEvent& ev : events.events().at(id)) {
      if (ev.queue_seconds < 0) continue;
      ++with;
      EXPECT_EQ(ev.index, 0);
      queue.push_back(ev.queue_seconds);
    }
    EXPECT_EQ(with, 1) << "request " << id;
  }
  ASSERT_EQ(queue.size(), 3u);
  EXPECT_LT(queue[0], queue[1]);  // request 1 waited for request 0's whole run
  EXPECT_LT(queue[1], queue[2]);

  // An import queues from its commit; its queue time comes with its first decoded token.
  RequestOptions dro;
  dro.sampling.temperature = 0.0f;
  dro.sampling.max_tokens = 3;
  dro.on_event = events.Callback();
  auto import = (*engine)->ReserveImport(MakePrompt(10, 9), dro);
  ASSERT_TRUE(import.ok());
  EXPECT_EQ((*engine)->Stats().queued_tokens, 3);  // the prompt's KV comes from elsewhere
  ASSERT_TRUE((*engine)->CommitImport(import->id, 5).ok());
  ASSERT_TRUE(RunUntilIdle(engine->get()));
  int with = 0;
  for (const TokenEvent& ev : events.events().at(import->id))
    if (ev.queue_seconds >= 0) {
      ++with;
      EXPECT_EQ(ev.index, 1);
    }
  EXPECT_EQ(with, 1);
}

}  // namespace
}  // namespace pdserve::engine
