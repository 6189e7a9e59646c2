// KV-aware routing end to end (docs/router.md "KV-aware routing"): a real pdserve-router with
// prefill_policy kv_aware, two real prefill workers (small pools, so they evict) and a decode
// worker on loopback, the tiny model, and the single-process greedy engine as the reference
// for every reply.
//
//   clean index   requests sharing a long prefix all land on the prefill worker that holds
//                 it, each maps the prefix (usage cached_tokens), the router's predicted hits
//                 equal the actual ones, and the replies equal the reference;
//   stale index   that worker's KV events are then lost (the test-only fault worker's
//                 --fault-kv-events-freeze-file) while other prompts evict the prefix there:
//                 the router still predicts the hit and sends the next request to it, which
//                 recomputes the prompt -- the reply is still exact, only the predicted and
//                 actual hit counters part, and no KV block leaks on any worker.
#include <atomic>
#include <csignal>
#include <fstream>
#include <thread>

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "services/testing/cluster_fixture.h"
#include "services/testing/worker_test_cluster.h"

namespace pdserve::services::worker {
namespace {

using namespace std::chrono_literals;
using nlohmann::json;
using router::testing::MetricValue;
using router::testing::PromtoolProblems;
using router::testing::TestCluster;
using testing::HttpGet;
using testing::HttpPost;
using testing::WaitFor;
using namespace e2e;  // NOLINT: the shared e2e helpers

// The router's index: blocks it holds per worker id (GET /v1/workers).
std::map<std::string, int64_t> IndexBlocks(int http_port) {
  std::map<std::string, int64_t> out;
  const json j = json::parse(HttpGet(http_port, "/v1/workers", 5s).body, nullptr, false);
  if (j.is_discarded() || !j.contains("data")) return out;
  for (const json& w : j["data"]) out[w["id"].get<std::string>()] = w["prefix_cache"]["blocks"].get<int64_t>();
  return out;
}

double RouterMetric(int http_port, const std::string& name, const std::string& label = "") {
  return MetricValue(HttpGet(http_port, "/metrics", 5s).body, name, label);
}

// Jobs the router placed on worker `id`.
double Placed(int http_port, const std::string& id) {
  return RouterMetric(http_port, "pdserve_router_placements_total", "worker=\"" + id + "\"");
}

// A greedy completion of `prompt` through the router: the reply must equal the single-process
// reference. Returns the usage's cached_tokens (-1 when the request failed).
int CompleteExact(int http_port, const std::vector<int32_t>& prompt, int max_tokens) {
  auto r = HttpPost(http_port, "/v1/completions", Body(prompt, max_tokens, false), 120s);
  EXPECT_EQ(r.status, 200) << r.body;
  if (r.status != 200) return -1;
  const json j = json::parse(r.body);
  EXPECT_EQ(j["choices"][0]["text"].get<std::string>(), Text(Reference(prompt, max_tokens)));
  return j["usage"]["prompt_tokens_details"]["cached_tokens"].get<int>();
}

TEST(KvRoutingE2eTest, SharedPrefixesGoToTheirHolderAndAStaleIndexCostsOnlyARecompute) {
  if (!UcxTcpUsable()) GTEST_SKIP() << "no /sys/class/net here: UCX's tcp transport has no device to use";
  TestCluster c("worker-kvroute");
  // Decode-side hits off: this test is about the prefill workers (the decode worker holds the
  // prefix too, and would otherwise compute the turns itself: the next test).
  ASSERT_OK_W(c.StartRouter({"--prefill-policy", "kv_aware", "--decode-local-prefill-tokens", "0"}), Workers(&c));
  Workers w(&c);
  // 0.004 GiB: 57 blocks of 64 tokens on the tiny model, so a few prompts evict.
  for (const std::string id : {"p0", "p1"})
    ASSERT_OK_W(w.Start(id, "prefill", {"--kv-gib", "0.004", "--fault-kv-events-freeze-file", c.dir() + "/freeze-" + id}),
                w);
  ASSERT_OK_W(w.Start("d0", "decode"), w);
  ASSERT_TRUE(c.WaitForWorkers(3, 30s)) << w.Logs();
  constexpr int kMax = 5;
  auto complete = [&](const std::vector<int32_t>& prompt) { return CompleteExact(c.http_port(), prompt, kMax); };

  // The shared prefix: 600 tokens, 9 whole blocks of 64 (above the first chunk of 256).
  const std::vector<int32_t> prefix = LongPrompt(41, 600);
  EXPECT_EQ(complete(prefix), 0);
  // The router learns which prefill worker holds its 9 blocks.
  std::string holder, other;
  ASSERT_TRUE(WaitFor(
      [&] {
        for (const auto& [id, blocks] : IndexBlocks(c.http_port()))
          if ((id == "p0" || id == "p1") && blocks >= 9) holder = id;
        return !holder.empty();
      },
      10s, 50ms))
      << w.Logs();
  other = holder == "p0" ? "p1" : "p0";
  // Clean index: every request sharing the prefix goes to the holder and maps the 9 blocks.
  constexpr int kTurns = 4;
  for (int k = 0; k < kTurns; ++k) {
    std::vector<int32_t> prompt = prefix;
    const std::vector<int32_t> more = LongPrompt(60 + k, 50);
    prompt.insert(prompt.end(), more.begin(), more.end());
    EXPECT_EQ(complete(prompt), 576) << "request " << k << " went to the worker without the prefix";
  }
  EXPECT_EQ(Placed(c.http_port(), holder), 1 + kTurns);
  EXPECT_LE(Placed(c.http_port(), other), 0);  // -1: no series
  EXPECT_EQ(RouterMetric(c.http_port(), "pdserve_router_prefix_actual_hit_tokens_total"), kTurns * 576);
  EXPECT_EQ(RouterMetric(c.http_port(), "pdserve_router_prefix_predicted_hit_tokens_total"), kTurns * 576);

  // Stale index: once the router knows the turns' blocks too (9 + one more block each), the
  // holder's events are lost from here on.
  ASSERT_TRUE(WaitFor([&] { return IndexBlocks(c.http_port())[holder] == 9 + kTurns; }, 10s, 50ms))
      << IndexBlocks(c.http_port())[holder];
  { std::ofstream(c.dir() + "/freeze-" + holder) << "frozen\n"; }
  // Other prompts until the holder evicted all 13 blocks of that time (the oldest in its LRU
  // go first). With nothing predicted anywhere they alternate between the prefill workers.
  const std::string evictions = "pdserve_prefix_cache_evictions_total";
  for (int k = 0; k < 40 && MetricValue(w.Metrics(holder), evictions) < 9 + kTurns; ++k) {
    EXPECT_EQ(complete(LongPrompt(100 + k, 700)), 0);
  }
  ASSERT_TRUE(WaitFor([&] { return MetricValue(w.Metrics(holder), evictions) >= 9 + kTurns; }, 10s, 100ms))
      << w.Metrics(holder);
  // The router still believes the holder has the prefix: the request goes there, finds
  // nothing and computes the whole prompt. The reply is exact all the same.
  std::vector<int32_t> prompt = prefix;
  const std::vector<int32_t> more = LongPrompt(90, 50);
  prompt.insert(prompt.end(), more.begin(), more.end());
  const double placed = Placed(c.http_port(), holder);
  EXPECT_EQ(complete(prompt), 0);
  EXPECT_EQ(Placed(c.http_port(), holder), placed + 1);
  EXPECT_EQ(RouterMetric(c.http_port(), "pdserve_router_prefix_predicted_hit_tokens_total") -
                RouterMetric(c.http_port(), "pdserve_router_prefix_actual_hit_tokens_total"),
            576);
  // Nothing leaked on any worker; the metrics parse.
  for (const std::string id : {"p0", "p1", "d0"}) {
    EXPECT_TRUE(w.NoBlocksUsed(id, 5s)) << id;
    EXPECT_EQ(PromtoolProblems(w.Metrics(id)), "") << id;
  }
  EXPECT_EQ(PromtoolProblems(HttpGet(c.http_port(), "/metrics", 5s).body), "");
  if (HasFailure()) ADD_FAILURE() << w.Logs();
}

// Decode-side hits (docs/router.md): in a conversation the decode worker that produced turn 1
// holds its prompt (imported) and the reply it decoded in its prefix cache, a block more than
// the prefill worker (turn 1 is 636 tokens: the reply fills block 9). Turn 2 (turn 1's prompt +
// reply + a short message) runs there alone: no prefill job, 640 tokens mapped (cached_tokens),
// the reply equal to the single-process reference. A turn whose new part is longer than the
// bound goes through the prefill worker again. No block leaks.
TEST(KvRoutingE2eTest, DecodeSideHitsRunShortTurnsOnTheDecodeWorker) {
  if (!UcxTcpUsable()) GTEST_SKIP() << "no /sys/class/net here: UCX's tcp transport has no device to use";
  TestCluster c("worker-decodehit");
  ASSERT_OK_W(c.StartRouter({"--decode-local-prefill-tokens", "128"}), Workers(&c));
  Workers w(&c);
  ASSERT_OK_W(w.Start("p0", "prefill"), w);
  ASSERT_OK_W(w.Start("d0", "decode"), w);
  ASSERT_TRUE(c.WaitForWorkers(2, 30s)) << w.Logs();
  constexpr int kMax = 5;
  auto complete = [&](const std::vector<int32_t>& prompt) { return CompleteExact(c.http_port(), prompt, kMax); };
  auto placed = [&](const std::string& id) { return Placed(c.http_port(), id); };
  const std::string local = "pdserve_router_decode_local_prefills_total";

  // Turn 1: 636 tokens, prefill + decode. The prefill worker caches 9 blocks; the decode worker
  // the 9 imported ones and block 9, which the reply's KV (positions 636-639) completes.
  std::vector<int32_t> turn = LongPrompt(43, 636);
  EXPECT_EQ(complete(turn), 0);
  EXPECT_EQ(placed("p0"), 1);
  ASSERT_TRUE(WaitFor([&] { return IndexBlocks(c.http_port())["d0"] >= 10 && IndexBlocks(c.http_port())["p0"] >= 9; },
                      10s, 50ms))
      << IndexBlocks(c.http_port())["d0"] << "\n" << w.Logs();
  // Turn 2: + the reply + 40 new tokens: 41 tokens past the 640 held on d0 (within 128), 105
  // past the 576 on p0.
  const std::vector<int32_t> reply = Reference(turn, kMax);
  turn.insert(turn.end(), reply.begin(), reply.end());
  const std::vector<int32_t> message = LongPrompt(44, 40);
  turn.insert(turn.end(), message.begin(), message.end());
  EXPECT_EQ(complete(turn), 640);
  EXPECT_EQ(RouterMetric(c.http_port(), local), 1);
  EXPECT_EQ(placed("p0"), 1) << "the prefill worker got the turn";
  EXPECT_EQ(placed("d0"), 2);
  // Turn 3: + 300 new tokens, past the bound: through the prefill worker, which holds turn 1's
  // blocks (576 of them).
  const std::vector<int32_t> long_message = LongPrompt(45, 300);
  turn.insert(turn.end(), long_message.begin(), long_message.end());
  EXPECT_EQ(complete(turn), 576);
  EXPECT_EQ(RouterMetric(c.http_port(), local), 1);
  EXPECT_EQ(placed("p0"), 2);
  for (const std::string id : {"p0", "d0"}) {
    EXPECT_TRUE(w.NoBlocksUsed(id, 5s)) << id;
    EXPECT_EQ(PromtoolProblems(w.Metrics(id)), "") << id;
  }
  EXPECT_EQ(PromtoolProblems(HttpGet(c.http_port(), "/metrics", 5s).body), "");
  if (HasFailure()) ADD_FAILURE() << w.Logs();
}

// Pulls (docs/prefix-cache.md "Pulls"): turn 1 of a conversation ran on prefill worker p0 and
// decode worker d0; p0 then leaves and p1 takes its place. Turn 2 reaches p1, which holds
// nothing: d0 holds turn 1's prompt (imported) and the block its reply completed, so p1 has d0
// write those 640 tokens' KV into its pool (one-sided, over UCX) and computes only the rest.
// The reply equals the single-process reference, usage says 640 cached, both sides count the
// pull, and no block leaks.
TEST(KvRoutingE2eTest, APrefillWorkerPullsTheConversationFromTheDecodeWorker) {
  if (!UcxTcpUsable()) GTEST_SKIP() << "no /sys/class/net here: UCX's tcp transport has no device to use";
  TestCluster c("worker-pull");
  ASSERT_OK_W(c.StartRouter({"--decode-local-prefill-tokens", "0"}), Workers(&c));
  Workers w(&c);
  ASSERT_OK_W(w.Start("p0", "prefill"), w);
  ASSERT_OK_W(w.Start("d0", "decode"), w);
  ASSERT_TRUE(c.WaitForWorkers(2, 30s)) << w.Logs();
  constexpr int kMax = 5;
  std::vector<int32_t> turn = LongPrompt(46, 636);
  EXPECT_EQ(CompleteExact(c.http_port(), turn, kMax), 0);
  w.proc("p0")->Signal(SIGTERM);  // drains and deregisters (the cluster is not ready until p1)
  ASSERT_TRUE(WaitFor([&] { return c.Workers().size() == 1; }, 30s, 20ms)) << w.Logs();
  ASSERT_OK_W(w.Start("p1", "prefill"), w);
  ASSERT_TRUE(c.WaitForWorkers(2, 30s)) << w.Logs();
  ASSERT_TRUE(WaitFor([&] { return IndexBlocks(c.http_port())["d0"] >= 10; }, 10s, 50ms)) << w.Logs();
  // Turn 2: + the reply + 300 new tokens.
  const std::vector<int32_t> reply = Reference(turn, kMax);
  turn.insert(turn.end(), reply.begin(), reply.end());
  const std::vector<int32_t> message = LongPrompt(47, 300);
  turn.insert(turn.end(), message.begin(), message.end());
  EXPECT_EQ(CompleteExact(c.http_port(), turn, kMax), 640);
  EXPECT_EQ(RouterMetric(c.http_port(), "pdserve_router_prefix_pulls_total", "outcome=\"planned\""), 1);
  EXPECT_LE(RouterMetric(c.http_port(), "pdserve_router_prefix_pulls_total", "outcome=\"failed\""), 0);
  EXPECT_EQ(MetricValue(w.Metrics("p1"), "pdserve_prefix_cache_pulled_tokens_total"), 640);
  EXPECT_EQ(MetricValue(w.Metrics("p1"), "pdserve_worker_kv_pulls_total", "outcome=\"adopted\""), 1);
  EXPECT_EQ(MetricValue(w.Metrics("d0"), "pdserve_worker_kv_pushes_total", "outcome=\"ok\""), 1);
  EXPECT_EQ(MetricValue(w.Metrics("d0"), "pdserve_prefix_cache_pushed_tokens_total"), 640);
  for (const std::string id : {"p1", "d0"}) {
    EXPECT_TRUE(w.NoBlocksUsed(id, 5s)) << id;
    EXPECT_EQ(PromtoolProblems(w.Metrics(id)), "") << id;
  }
  EXPECT_EQ(PromtoolProblems(HttpGet(c.http_port(), "/metrics", 5s).body), "");
  if (HasFailure()) ADD_FAILURE() << w.Logs();
}

// A pull between prefill workers: p0 computed a prompt; d0 caches nothing of its own
// (--prefix-cache false), so p0 is the only holder. A request with that prefix placed on p1
// (round robin) has p0 write the 576 cached tokens into p1's pool; p1 computes the rest. The
// reply equals the reference, both sides count the pull, and while p1's job waits for it p1's
// load reports the job.
TEST(KvRoutingE2eTest, APrefillWorkerPullsFromAnotherPrefillWorker) {
  if (!UcxTcpUsable()) GTEST_SKIP() << "no /sys/class/net here: UCX's tcp transport has no device to use";
  TestCluster c("worker-pullpp");
  ASSERT_OK_W(c.StartRouter({"--decode-local-prefill-tokens", "0", "--prefill-policy", "round_robin"}), Workers(&c));
  Workers w(&c);
  ASSERT_OK_W(w.Start("p0", "prefill", {"--fault-slow-kv-writes", "400"}), w);
  ASSERT_OK_W(w.Start("d0", "decode", {"--prefix-cache", "false"}), w);
  ASSERT_TRUE(c.WaitForWorkers(2, 30s)) << w.Logs();
  constexpr int kMax = 5;
  const std::vector<int32_t> prefix = LongPrompt(49, 600);
  EXPECT_EQ(CompleteExact(c.http_port(), prefix, kMax), 0);
  ASSERT_TRUE(WaitFor([&] { return IndexBlocks(c.http_port())["p0"] >= 9; }, 10s, 50ms)) << w.Logs();
  ASSERT_OK_W(w.Start("p1", "prefill"), w);
  ASSERT_TRUE(c.WaitForWorkers(3, 30s)) << w.Logs();
  // Round robin: requests until one is placed on p1; every one maps the 9 blocks (576 tokens),
  // on p0 from its own cache, on p1 pulled from p0. p0 holds each KV write batch back 400 ms,
  // so p1's job waits for its pull long enough for p1's heartbeats (100 ms) to report it: one
  // waiting request and the 650 - 576 + 1 tokens it still owes.
  double p1_waiting = 0, p1_queued = 0;
  for (int k = 0; k < 4 && Placed(c.http_port(), "p1") < 1; ++k) {
    std::vector<int32_t> prompt = prefix;
    const std::vector<int32_t> more = LongPrompt(80 + k, 50);
    prompt.insert(prompt.end(), more.begin(), more.end());
    std::atomic<bool> done{false};
    std::thread sampler([&] {
      while (!done.load()) {
        const std::string m = w.Metrics("p1");
        p1_waiting = std::max(p1_waiting, MetricValue(m, "pdserve_worker_waiting_requests"));
        p1_queued = std::max(p1_queued, MetricValue(m, "pdserve_worker_queued_tokens"));
        std::this_thread::sleep_for(20ms);
      }
    });
    EXPECT_EQ(CompleteExact(c.http_port(), prompt, kMax), 576) << "request " << k;
    done = true;
    sampler.join();
  }
  ASSERT_EQ(Placed(c.http_port(), "p1"), 1) << w.Logs();
  EXPECT_EQ(p1_waiting, 1) << "a job waiting for its pull counts in the worker's load";
  EXPECT_EQ(p1_queued, 650 - 576 + 1);
  // The engine counters follow the engine on each heartbeat (~100 ms), not per request.
  WaitFor([&] { return MetricValue(w.Metrics("p1"), "pdserve_prefix_cache_pulled_tokens_total") >= 576; }, 5s, 50ms);
  EXPECT_EQ(MetricValue(w.Metrics("p1"), "pdserve_prefix_cache_pulled_tokens_total"), 576);
  EXPECT_EQ(MetricValue(w.Metrics("p1"), "pdserve_worker_kv_pulls_total", "outcome=\"adopted\""), 1);
  EXPECT_EQ(MetricValue(w.Metrics("p0"), "pdserve_worker_kv_pushes_total", "outcome=\"ok\""), 1);
  for (const std::string id : {"p0", "p1", "d0"}) EXPECT_TRUE(w.NoBlocksUsed(id, 5s)) << id;
  if (HasFailure()) ADD_FAILURE() << w.Logs();
}

// A holder killed mid-pull: p0 (the test-only fault worker, every KV write batch held back 1 s)
// computed a prompt; d0 caches nothing of its own (--prefix-cache false), so p0 is the only
// holder. A request with that prefix is placed on p1 (round robin) with a pull from p0; p0 is
// SIGKILLed while its writes are in flight. p1's pull fails (its counter proves the pull was
// under way and ended badly), p1 computes the whole prompt, and the reply is still the
// reference; no block leaks on p1 or d0.
TEST(KvRoutingE2eTest, AHolderKilledMidPullCostsOnlyARecompute) {
  if (!UcxTcpUsable()) GTEST_SKIP() << "no /sys/class/net here: UCX's tcp transport has no device to use";
  TestCluster c("worker-pullkill");
  ASSERT_OK_W(c.StartRouter({"--decode-local-prefill-tokens", "0", "--prefill-policy", "round_robin"}), Workers(&c));
  Workers w(&c);
  ASSERT_OK_W(w.Start("p0", "prefill", {"--fault-slow-kv-writes", "1000"}), w);
  ASSERT_OK_W(w.Start("d0", "decode", {"--prefix-cache", "false"}), w);
  ASSERT_TRUE(c.WaitForWorkers(2, 30s)) << w.Logs();
  constexpr int kMax = 5;
  const std::vector<int32_t> prefix = LongPrompt(48, 600);
  EXPECT_EQ(CompleteExact(c.http_port(), prefix, kMax), 0);
  ASSERT_TRUE(WaitFor([&] { return IndexBlocks(c.http_port())["p0"] >= 9; }, 10s, 50ms)) << w.Logs();
  ASSERT_OK_W(w.Start("p1", "prefill"), w);
  ASSERT_TRUE(c.WaitForWorkers(3, 30s)) << w.Logs();
  // Round robin: requests until one is placed on p1 (those on p0 map the prefix there).
  const std::string planned = "outcome=\"planned\"";
  bool pulled = false;
  for (int k = 0; k < 4 && !pulled; ++k) {
    std::vector<int32_t> prompt = prefix;
    const std::vector<int32_t> more = LongPrompt(70 + k, 50);
    prompt.insert(prompt.end(), more.begin(), more.end());
    const double before = RouterMetric(c.http_port(), "pdserve_router_prefix_pulls_total", planned);
    int cached = -2;
    std::thread client([&] { cached = CompleteExact(c.http_port(), prompt, kMax); });
    // The job went to p1 with a pull: kill p0 once its first write batch is held back.
    pulled = WaitFor([&] { return RouterMetric(c.http_port(), "pdserve_router_prefix_pulls_total", planned) > before; },
                     3s, 5ms);
    if (pulled) {
      std::this_thread::sleep_for(300ms);
      w.proc("p0")->Kill();
    }
    client.join();
    EXPECT_EQ(cached, pulled ? 0 : 576) << "request " << k;
  }
  ASSERT_TRUE(pulled) << "no request was placed on p1\n" << w.Logs();
  // p1's own account: the pull it began ended without the blocks.
  const std::string p1_log = w.proc("p1")->Log();
  EXPECT_NE(p1_log.find("pull failed after"), std::string::npos) << p1_log;
  EXPECT_EQ(MetricValue(w.Metrics("p1"), "pdserve_worker_kv_pulls_total", "outcome=\"failed\""), 1);
  EXPECT_LE(MetricValue(w.Metrics("p1"), "pdserve_worker_kv_pulls_total", "outcome=\"adopted\""), 0);
  EXPECT_LE(MetricValue(w.Metrics("p1"), "pdserve_prefix_cache_pulled_tokens_total"), 0);
  for (const std::string id : {"p1", "d0"}) {
    EXPECT_TRUE(w.NoBlocksUsed(id, 10s)) << id;
    EXPECT_EQ(PromtoolProblems(w.Metrics(id)), "") << id;
  }
  if (HasFailure()) ADD_FAILURE() << w.Logs();
}

}  // namespace
}  // namespace pdserve::services::worker
