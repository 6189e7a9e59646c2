// A randomized run of 1,000 requests on the engine's own thread (Start()): random prompt and
// output lengths, greedy and sampled, stop tokens, aborts from the caller's thread and from
// inside event callbacks, invalid requests mixed in, and a pool small enough to preempt.
// Every valid request must end with exactly one finished event, events must arrive in order,
// and every block must be back in the pool.
#include <gtest/gtest.h>

#include <random>
#include <set>

#include "engine/engine.h"
#include "engine/engine_test_util.h"

namespace pdserve::engine {
namespace {

using testing::TinyModel;

TEST(EngineStressTest, ThousandRandomRequestsReturnEveryBlock) {
  const model::Model& m = TinyModel();
  EngineOptions o;
  o.block_tokens = 16;
  const KvLayout l = model::KvLayoutFor(m.config(), o.block_tokens);
  o.kv_cache_gib = static_cast<double>(40 * l.BlockBytes()) / (1ull << 30);
  o.scheduler.max_num_seqs = 32;
  o.scheduler.max_step_tokens = 96;
  o.scheduler.prefill_chunk = 16;
  o.seed = 3;
  auto created = Engine::Create(o, &m);
  ASSERT_TRUE(created.ok());
  Engine& e = **created;
  e.Start();

  std::mutex mu;
  std::condition_variable cv;
  std::map<RequestId, std::vector<TokenEvent>> events;
  std::map<RequestId, int32_t> max_tokens;
  std::set<RequestId> abort_in_callback;
  size_t finished = 0;
  auto callback = [&](const TokenEvent& ev) {
    bool abort_now = false;
    {
      std::lock_guard<std::mutex> lock(mu);
      events[ev.id].push_back(ev);
      abort_now = !ev.finished && ev.index == 1 && abort_in_callback.count(ev.id);
      if (ev.finished) {
        ++finished;
        cv.notify_all();
      }
    }
    if (abort_now) {
      const Status s = e.Abort(ev.id);  // re-entrant call from the step thread
      EXPECT_TRUE(s.ok() || s.code() == StatusCode::kNotFound) << s.ToString();
    }
  };

  std::mt19937 rng(99);
  const int32_t V = static_cast<int32_t>(m.config().vocab_size);
  std::vector<int32_t> stop_ids;
  for (int i = 0; i < 30; ++i) stop_ids.push_back(static_cast<int32_t>(rng() % V));
  size_t valid = 0, rejected = 0;
  for (int i = 0; i < 1000; ++i) {
    std::vector<int32_t> prompt(1 + rng() % 40);
    for (auto& t : prompt) t = static_cast<int32_t>(rng() % V);
    RequestOptions ro;
    ro.sampling.max_tokens = 1 + static_cast<int32_t>(rng() % 12);
    ro.sampling.temperature = rng() % 2 ? 0.0f : 0.8f;
    ro.sampling.top_p = rng() % 2 ? 1.0f : 0.9f;
    if (rng() % 3 == 0) ro.sampling.stop_token_ids = stop_ids;
    const uint32_t kind = rng() % 100;
    if (kind < 5) ro.sampling.top_p = 0.0f;  // invalid: rejected, must not disturb the rest
    ro.on_event = callback;
    {
      std::lock_guard<std::mutex> lock(mu);  // the id is known before its first event lands
      auto id = e.AddRequest(std::move(prompt), ro);
      if (!id.ok()) {
        EXPECT_EQ(id.status().code(), StatusCode::kInvalidArgument);
        ++rejected;
        continue;
      }
      ++valid;
      max_tokens[*id] = ro.sampling.max_tokens;
      if (kind >= 5 && kind < 15) abort_in_callback.insert(*id);
      if (kind >= 15 && kind < 30) {
        const Status s = e.Abort(*id);  // at a random point of its life
        EXPECT_TRUE(s.ok() || s.code() == StatusCode::kNotFound);
      }
    }
  }
  {
    std::unique_lock<std::mutex> lock(mu);
    ASSERT_TRUE(cv.wait_for(lock, std::chrono::seconds(150), [&] { return finished >= valid; }))
        << finished << " of " << valid << " finished";
  }
  e.Stop();
  EXPECT_GT(rejected, 0u);
  std::lock_guard<std::mutex> lock(mu);
  EXPECT_EQ(events.size(), valid);
  size_t aborted = 0, stopped = 0;
  for (const auto& [id, evs] : events) {
    ASSERT_FALSE(evs.empty());
    int finals = 0;
    int64_t next_index = 0;
    for (const TokenEvent& ev : evs) {
      finals += ev.finished;
      if (ev.token >= 0) {
        EXPECT_EQ(ev.index, next_index++) << "request " << id;
      }
    }
    EXPECT_EQ(finals, 1) << "request " << id;
    EXPECT_TRUE(evs.back().finished);
    EXPECT_LE(next_index, max_tokens[id]);
    aborted += evs.back().reason == FinishReason::kAbort;
    stopped += evs.back().reason == FinishReason::kStop;
    if (evs.back().reason == FinishReason::kLength) {
      EXPECT_EQ(next_index, max_tokens[id]);
    }
  }
  const EngineStats s = e.Stats();
  EXPECT_EQ(s.blocks_free, s.blocks_total);
  EXPECT_EQ(s.running, 0);
  EXPECT_EQ(s.waiting, 0);
  EXPECT_TRUE(e.Idle());
  EXPECT_GT(s.preemptions, 0);
  EXPECT_GT(aborted, 0u);
  EXPECT_GT(stopped, 0u);
  std::printf("%zu valid, %zu rejected, %zu aborted, %zu stopped; %lld steps, %lld preemptions, overhead %.1f%%\n",
              valid, rejected, aborted, stopped, static_cast<long long>(s.steps), static_cast<long long>(s.preemptions),
              s.OverheadShare() * 100);
}

}  // namespace
}  // namespace pdserve::engine
