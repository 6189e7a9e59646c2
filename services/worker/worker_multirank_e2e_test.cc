// End-to-end tests of multi-rank worker instances (docs/services.md "Multi-rank workers"): a real
// pdserve-router, single-process workers and an instance started by mpirun, UCX tcp for the KV
// transfer, and the single-process engine's greedy output as the reference for every reply.
//   * A decode instance with DP = 2 (EP over both ranks): each DP rank registers on its own, the
//     router places every request on one rank and the prefill writes into that rank's blocks.
//   * A prefill instance with CP = 2: prompts computed context-parallel, KV streamed from the
//     leader's copy; prompts sharing a long prefix hit the instance's prefix cache and compute
//     only their rest, split over the CP ranks.
//   * Two CP = 2 prefill instances (one plan, one namespace): the second pulls a prefix the
//     first holds over UCX, its leader sends the pulled blocks to its follower, and the reply is
//     a cold whole-prompt engine's.
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "services/testing/http_test_client.h"
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
using testing::HttpPostSse;
using testing::WaitFor;
using namespace e2e;  // NOLINT: the shared e2e helpers

// Streams request k (prompt Prompt(k), max_tokens[k]) for every k at once; returns the replies.
std::vector<Streamed> StreamAll(TestCluster& c, const std::vector<int>& max_tokens) {
  std::vector<Streamed> got(max_tokens.size());
  std::vector<std::thread> threads;
  for (size_t k = 0; k < max_tokens.size(); ++k)
    threads.emplace_back([&, k] {
      got[k] = Collect(HttpPostSse(c.http_port(), "/v1/completions",
                                   Body(Prompt(static_cast<int>(k)), max_tokens[k], true), 180s));
    });
  for (auto& t : threads) t.join();
  return got;
}

void ExpectGreedy(const std::vector<Streamed>& got, const std::vector<int>& max_tokens, Workers& w) {
  for (size_t k = 0; k < got.size(); ++k) {
    const auto p = Prompt(static_cast<int>(k));
    EXPECT_FALSE(got[k].error) << k << ": " << got[k].error_message;
    EXPECT_EQ(got[k].text, Text(Reference(p, max_tokens[k]))) << "request " << k;
    ASSERT_FALSE(got[k].usage.is_null()) << k << w.Logs();
    EXPECT_EQ(got[k].usage["completion_tokens"].get<int>(), max_tokens[k]);
    EXPECT_EQ(got[k].usage["prompt_tokens"].get<int>(), static_cast<int>(p.size()));
  }
}

TEST(WorkerMultiRankE2eTest, DecodeInstanceWithTwoDpRanks) {
  if (!UcxTcpUsable()) GTEST_SKIP() << "no /sys/class/net here: UCX's tcp transport has no device to use";
  TestCluster c("worker-dp2");
  ASSERT_OK_W(c.StartRouter(), Workers(&c));
  Workers w(&c);
  ASSERT_OK_W(w.Start("p0", "prefill"), w);
  ASSERT_OK_W(w.StartInstance("d", "decode", 2, "dp=2,ep=2", 2), w);
  ASSERT_TRUE(c.WaitForWorkers(3, 60s)) << w.Logs();

  // Each DP rank is a worker of its own in the router's view, with its place in the instance.
  auto view = json::parse(HttpGet(c.http_port(), "/v1/workers", 5s).body);
  int ranks_seen = 0;
  for (const auto& entry : view["data"]) {
    if (entry["role"] != "decode") continue;
    const int rank = entry["dp_rank"].get<int>();
    EXPECT_EQ(entry["id"], "d-dp" + std::to_string(rank));
    EXPECT_EQ(entry["instance"], "d");
    EXPECT_EQ(entry["dp_ranks"], 2);
    ++ranks_seen;
  }
  EXPECT_EQ(ranks_seen, 2) << view.dump();

  // 32 concurrent requests of mixed lengths.
  std::vector<int> max_tokens;
  for (int k = 0; k < 32; ++k) max_tokens.push_back(4 + (k * 5) % 17);
  ExpectGreedy(StreamAll(c, max_tokens), max_tokens, w);

  // Both ranks took work, in proportion to their (equal) capacity.
  const std::string router_metrics = HttpGet(c.http_port(), "/metrics", 5s).body;
  const double on0 = MetricValue(router_metrics, "pdserve_router_placements_total", "worker=\"d-dp0\"");
  const double on1 = MetricValue(router_metrics, "pdserve_router_placements_total", "worker=\"d-dp1\"");
  EXPECT_EQ(on0 + on1, 32);
  EXPECT_GE(on0, 8) << router_metrics;
  EXPECT_GE(on1, 8) << router_metrics;
  EXPECT_NE(router_metrics.find("dp_rank=\"1\",role=\"decode\",worker=\"d-dp1\""), std::string::npos);
  for (const char* id : {"p0", "d-dp0", "d-dp1"}) {
    EXPECT_EQ(PromtoolProblems(w.Metrics(id)), "") << id;
    EXPECT_TRUE(w.NoBlocksUsed(id, 5s)) << id;
  }
  // Each rank received its own requests' KV through its own transfer endpoint.
  EXPECT_EQ(MetricValue(w.Metrics("d-dp0"), "pdserve_worker_kv_transfers_total", "ok"), on0);
  EXPECT_EQ(MetricValue(w.Metrics("d-dp1"), "pdserve_worker_kv_transfers_total", "ok"), on1);

  // Prefix-cache hits in front of the DP ranks: requests sharing a 600-token prefix, one after
  // another, decoded on the DP ranks. After the first, the prefill worker maps the 9 whole
  // blocks (576 tokens; usage cached_tokens), and every reply is still the reference.
  const std::vector<int32_t> prefix = LongPrompt(51, 600);
  for (int k = 0; k < 4; ++k) {
    std::vector<int32_t> prompt = prefix;
    const std::vector<int32_t> more = LongPrompt(52 + k, 30);
    prompt.insert(prompt.end(), more.begin(), more.end());
    auto r = testing::HttpPost(c.http_port(), "/v1/completions", Body(prompt, 6, false), 120s);
    ASSERT_EQ(r.status, 200) << r.body;
    const json j = json::parse(r.body);
    EXPECT_EQ(j["choices"][0]["text"].get<std::string>(), Text(Reference(prompt, 6))) << "request " << k;
    EXPECT_EQ(j["usage"]["prompt_tokens_details"]["cached_tokens"].get<int>(), k == 0 ? 0 : 576) << "request " << k;
  }
  const std::string after = HttpGet(c.http_port(), "/metrics", 5s).body;
  EXPECT_EQ(MetricValue(after, "pdserve_router_placements_total", "worker=\"d-dp0\"") +
                MetricValue(after, "pdserve_router_placements_total", "worker=\"d-dp1\""),
            on0 + on1 + 4)
      << after;
  for (const char* id : {"p0", "d-dp0", "d-dp1"}) EXPECT_TRUE(w.NoBlocksUsed(id, 5s)) << id;
  if (HasFailure()) ADD_FAILURE() << w.Logs();
}

TEST(WorkerMultiRankE2eTest, ContextParallelPrefillInstance) {
  if (!UcxTcpUsable()) GTEST_SKIP() << "no /sys/class/net here: UCX's tcp transport has no device to use";
  TestCluster c("worker-cp2");
  ASSERT_OK_W(c.StartRouter(), Workers(&c));
  Workers w(&c);
  ASSERT_OK_W(w.StartInstance("p", "prefill", 2, "cp=2,ep=2", 1), w);
  ASSERT_OK_W(w.Start("d0", "decode"), w);
  ASSERT_TRUE(c.WaitForWorkers(2, 60s)) << w.Logs();
  std::vector<int> max_tokens;
  for (int k = 0; k < 8; ++k) max_tokens.push_back(6 + k);
  ExpectGreedy(StreamAll(c, max_tokens), max_tokens, w);
  for (const char* id : {"p", "d0"}) EXPECT_TRUE(w.NoBlocksUsed(id, 5s)) << id;
  EXPECT_EQ(MetricValue(w.Metrics("p"), "pdserve_worker_kv_transfers_total", "ok"), 8);

  // Prompts of a 600-token prefix and 30 more: the first is computed whole; the others map its
  // 9 whole blocks (576 tokens, usage cached_tokens) and compute 54 tokens, 27 on each CP rank.
  // Every reply is a cold whole-prompt engine's.
  const std::vector<int32_t> prefix = LongPrompt(61, 600);
  for (int k = 0; k < 3; ++k) {
    std::vector<int32_t> prompt = prefix;
    const std::vector<int32_t> more = LongPrompt(62 + k, 30);
    prompt.insert(prompt.end(), more.begin(), more.end());
    auto r = testing::HttpPost(c.http_port(), "/v1/completions", Body(prompt, 6, false), 120s);
    ASSERT_EQ(r.status, 200) << r.body;
    const json j = json::parse(r.body);
    EXPECT_EQ(j["choices"][0]["text"].get<std::string>(), Text(Reference(prompt, 6, /*whole_prompts=*/true)))
        << "request " << k;
    EXPECT_EQ(j["usage"]["prompt_tokens_details"]["cached_tokens"].get<int>(), k == 0 ? 0 : 576) << "request " << k;
  }
  // The worker's counters follow its engine on each heartbeat (~100 ms), not per request: the
  // last reply can arrive before the refresh that counts its hit.
  std::string metrics;
  WaitFor([&] {
    metrics = w.Metrics("p");
    return MetricValue(metrics, "pdserve_prefix_cache_hit_tokens_total", "") >= 2 * 576;
  }, 5s, 50ms);
  EXPECT_EQ(MetricValue(metrics, "pdserve_prefix_cache_hit_tokens_total", ""), 2 * 576) << metrics;
  for (const char* id : {"p", "d0"}) EXPECT_TRUE(w.NoBlocksUsed(id, 5s)) << id;
  if (HasFailure()) ADD_FAILURE() << w.Logs();
}

TEST(WorkerMultiRankE2eTest, AContextParallelInstancePullsFromAnother) {
  if (!UcxTcpUsable()) GTEST_SKIP() << "no /sys/class/net here: UCX's tcp transport has no device to use";
  TestCluster c("worker-cp-pull");
  ASSERT_OK_W(c.StartRouter({"--decode-local-prefill-tokens", "0", "--prefill-policy", "round_robin"}), Workers(&c));
  Workers w(&c);
  ASSERT_OK_W(w.StartInstance("pa", "prefill", 2, "cp=2,ep=2", 1), w);
  ASSERT_OK_W(w.Start("d0", "decode", {"--prefix-cache", "false"}), w);
  ASSERT_TRUE(c.WaitForWorkers(2, 60s)) << w.Logs();
  const std::vector<int32_t> prefix = LongPrompt(71, 600);
  auto complete = [&](const std::vector<int32_t>& prompt) {
    auto r = testing::HttpPost(c.http_port(), "/v1/completions", Body(prompt, 5, false), 120s);
    EXPECT_EQ(r.status, 200) << r.body;
    if (r.status != 200) return -1;
    const json j = json::parse(r.body);
    EXPECT_EQ(j["choices"][0]["text"].get<std::string>(), Text(Reference(prompt, 5, /*whole_prompts=*/true)));
    return j["usage"]["prompt_tokens_details"]["cached_tokens"].get<int>();
  };
  EXPECT_EQ(complete(prefix), 0);
  // The router's index learns pa's 9 blocks from its events.
  ASSERT_TRUE(WaitFor(
      [&] {
        const json j = json::parse(HttpGet(c.http_port(), "/v1/workers", 5s).body, nullptr, false);
        if (j.is_discarded() || !j.contains("data")) return false;
        for (const json& wk : j["data"])
          if (wk["id"] == "pa" && wk["prefix_cache"]["blocks"].get<int64_t>() >= 9) return true;
        return false;
      },
      10s, 50ms))
      << w.Logs();
  ASSERT_OK_W(w.StartInstance("pb", "prefill", 2, "cp=2,ep=2", 1), w);
  ASSERT_TRUE(c.WaitForWorkers(3, 60s)) << w.Logs();
  // Round robin: requests until one is placed on pb; each maps the 9 blocks (576 tokens), on pa
  // from its own cache, on pb pulled from pa.
  auto placed = [&](const std::string& id) {
    return MetricValue(HttpGet(c.http_port(), "/metrics", 5s).body, "pdserve_router_placements_total",
                       "worker=\"" + id + "\"");
  };
  for (int k = 0; k < 4 && placed("pb") < 1; ++k) {
    std::vector<int32_t> prompt = prefix;
    const std::vector<int32_t> more = LongPrompt(90 + k, 50);
    prompt.insert(prompt.end(), more.begin(), more.end());
    EXPECT_EQ(complete(prompt), 576) << "request " << k;
  }
  ASSERT_EQ(placed("pb"), 1) << w.Logs();
  EXPECT_EQ(MetricValue(w.Metrics("pb"), "pdserve_prefix_cache_pulled_tokens_total"), 576);
  EXPECT_EQ(MetricValue(w.Metrics("pb"), "pdserve_worker_kv_pulls_total", "outcome=\"adopted\""), 1);
  EXPECT_EQ(MetricValue(w.Metrics("pa"), "pdserve_worker_kv_pushes_total", "outcome=\"ok\""), 1);
  for (const char* id : {"pa", "pb", "d0"}) EXPECT_TRUE(w.NoBlocksUsed(id, 5s)) << id;
  if (HasFailure()) ADD_FAILURE() << w.Logs();
}

}  // namespace
}  // namespace pdserve::services::worker
