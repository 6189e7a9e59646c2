// End-to-end tests of the engine-backed workers: a real pdserve-router and real pdserve-colocated
// / pdserve-prefill / pdserve-decode processes on loopback (UCX tcp between prefill and decode),
// a tiny model with the DeepSeek vocabulary made by `pdserve make-model`, and the greedy output
// of a single-process Engine (one request at a time) as the reference for every reply.
#include <signal.h>

#include <atomic>
#include <cstdlib>
#include <map>
#include <mutex>
#include <thread>

#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>

#include "services/common/process_util.h"
#include "services/testing/cluster_fixture.h"
#include "services/testing/worker_test_cluster.h"

namespace pdserve::services::worker {
namespace {

using namespace std::chrono_literals;
using nlohmann::json;
using router::testing::MetricValue;
using router::testing::PromtoolProblems;
using router::testing::TestCluster;
using testing::ChildProcess;
using testing::HttpGet;
using testing::HttpPost;
using testing::HttpPostSse;
using testing::SseReply;
using testing::WaitFor;
using namespace e2e;  // NOLINT: the shared e2e helpers

const std::string kBin = PDSERVE_BIN_DIR;

TEST(WorkerE2eTest, ColocatedMatchesSingleProcessGreedy) {
  TestCluster c("worker-colocated");
  ASSERT_OK_W(c.StartRouter(), Workers(&c));
  Workers w(&c);
  ASSERT_OK_W(w.Start("c0", "colocated"), w);
  ASSERT_TRUE(c.WaitForWorkers(1, 30s)) << w.Logs();
  for (int k = 0; k < 3; ++k) {
    const auto p = Prompt(k);
    const int n = 8 + k;
    const std::string want = Text(Reference(p, n));
    auto r = HttpPost(c.http_port(), "/v1/completions", Body(p, n, false), 60s);
    ASSERT_EQ(r.status, 200) << r.body << w.Logs();
    json j = json::parse(r.body);
    EXPECT_EQ(j["choices"][0]["text"].get<std::string>(), want);
    EXPECT_EQ(j["usage"]["prompt_tokens"].get<int>(), static_cast<int>(p.size()));
    EXPECT_EQ(j["usage"]["completion_tokens"].get<int>(), n);
    auto s = Collect(HttpPostSse(c.http_port(), "/v1/completions", Body(p, n, true), 60s));
    EXPECT_FALSE(s.error);
    EXPECT_EQ(s.text, want);
    ASSERT_FALSE(s.usage.is_null());
    EXPECT_EQ(s.usage["completion_tokens"].get<int>(), n);
  }
  EXPECT_EQ(PromtoolProblems(HttpGet(c.http_port(), "/metrics").body), "");
  EXPECT_EQ(PromtoolProblems(w.Metrics("c0")), "");
  EXPECT_TRUE(w.NoBlocksUsed("c0", 5s));
}

// CURVE on the control plane with an engine worker: keys from `pdserve keygen`, the router's
// allow-list holding the worker's key. A worker whose key file is missing stops at once (before
// loading the model) naming the file.
TEST(WorkerE2eTest, ColocatedWorkerOverCurve) {
  TestCluster c("worker-curve");
  const std::string keys = c.dir() + "/keys";
  const std::string keygen = kBin + "/pdserve keygen --out " + keys + " --name router --name c0 > " + keys + ".log 2>&1";
  ASSERT_EQ(std::system(keygen.c_str()), 0) << keygen;
  ASSERT_OK_W(c.StartRouter({"--control-curve-secret-key-file", keys + "/router.secret",
                             "--control-curve-allowed-clients-file", keys + "/c0.public"}),
              Workers(&c));
  Workers w(&c);
  const std::vector<std::string> curve = {"--curve-secret-key-file", keys + "/c0.secret", "--router-public-key-file",
                                          keys + "/router.public"};
  ASSERT_OK_W(w.Start("c0", "colocated", curve), w);
  ASSERT_TRUE(c.WaitForWorkers(1, 30s)) << w.Logs();
  const auto p = Prompt(4);
  auto r = HttpPost(c.http_port(), "/v1/completions", Body(p, 6, false), 60s);
  ASSERT_EQ(r.status, 200) << r.body << w.Logs();
  EXPECT_EQ(json::parse(r.body)["choices"][0]["text"].get<std::string>(), Text(Reference(p, 6)));

  auto bad = ChildProcess::Spawn({kBin + "/pdserve-colocated", "--router", c.control_endpoint(), "--worker-id", "c1",
                                  "--model", ModelDir(), "--curve-secret-key-file", keys + "/c1.secret",
                                  "--router-public-key-file", keys + "/router.public"},
                                 c.dir() + "/c1.log");
  ASSERT_TRUE(bad.ok());
  EXPECT_EQ((*bad)->WaitExit(10s), std::optional<int>(2)) << (*bad)->Log();
  EXPECT_NE((*bad)->Log().find(keys + "/c1.secret"), std::string::npos) << (*bad)->Log();
}

TEST(WorkerE2eTest, DisaggregatedThirtyTwoStreamsMatchGreedy) {
  if (!UcxTcpUsable()) GTEST_SKIP() << "no /sys/class/net here: UCX's tcp transport has no device to use";
  TestCluster c("worker-pd");
  ASSERT_OK_W(c.StartRouter(), Workers(&c));
  Workers w(&c);
  for (const char* id : {"p0", "p1"}) ASSERT_OK_W(w.Start(id, "prefill"), w);
  for (const char* id : {"d0", "d1"}) ASSERT_OK_W(w.Start(id, "decode"), w);
  ASSERT_TRUE(c.WaitForWorkers(4, 30s)) << w.Logs();
  constexpr int kN = 32, kMax = 10;
  std::vector<std::string> want(kN);
  for (int k = 0; k < kN; ++k) want[k] = Text(Reference(Prompt(k), kMax));
  std::vector<Streamed> got(kN);
  std::vector<std::thread> threads;
  for (int k = 0; k < kN; ++k)
    threads.emplace_back([&, k] {
      got[k] = Collect(HttpPostSse(c.http_port(), "/v1/completions", Body(Prompt(k), kMax, true), 120s));
    });
  for (auto& t : threads) t.join();
  for (int k = 0; k < kN; ++k) {
    EXPECT_FALSE(got[k].error) << k;
    EXPECT_EQ(got[k].text, want[k]) << "request " << k;
    ASSERT_FALSE(got[k].usage.is_null()) << k << w.Logs();
    EXPECT_EQ(got[k].usage["completion_tokens"].get<int>(), kMax);
    EXPECT_EQ(got[k].usage["prompt_tokens"].get<int>(), static_cast<int>(Prompt(k).size()));
  }
  EXPECT_EQ(PromtoolProblems(HttpGet(c.http_port(), "/metrics").body), "");
  for (const char* id : {"p0", "p1", "d0", "d1"}) {
    EXPECT_EQ(PromtoolProblems(w.Metrics(id)), "") << id;
    EXPECT_TRUE(w.NoBlocksUsed(id, 5s)) << id;
  }
  // Both decode workers received KV through the transfer layer.
  EXPECT_GT(MetricValue(w.Metrics("d0"), "pdserve_worker_kv_transfers_total", "ok") +
                MetricValue(w.Metrics("d1"), "pdserve_worker_kv_transfers_total", "ok"),
            kN - 1);
  if (HasFailure()) ADD_FAILURE() << w.Logs();
}

// Streams `n` long requests; calls kill() once every stream has produced output.
std::vector<Streamed> StreamAndKill(TestCluster& c, int n, int max_tokens, const std::function<void()>& kill,
                                    double* kill_at) {
  std::vector<Streamed> got(n);
  std::atomic<int> started{0};
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<std::thread> threads;
  std::vector<std::chrono::steady_clock::time_point> sent(n);
  for (int k = 0; k < n; ++k)
    threads.emplace_back([&, k] {
      bool counted = false;
      sent[k] = std::chrono::steady_clock::now();
      auto r = HttpPostSse(c.http_port(), "/v1/completions", Body(Prompt(100 + k), max_tokens, true), 60s,
                           [&](const std::string&) {
                             if (!counted) started.fetch_add(1), counted = true;
                             return true;
                           });
      if (!counted) started.fetch_add(1);
      got[k] = Collect(r);
      // Arrival times relative to the kill moment.
      if (got[k].error_at >= 0)
        got[k].error_at -= std::chrono::duration<double>(sent[k] - t0).count();
    });
  WaitFor([&] { return started.load() == n; }, 60s);
  *kill_at = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  kill();
  for (auto& t : threads) t.join();
  return got;
}

TEST(WorkerE2eTest, DecodeKilledMidStreamFailsOnlyItsRequests) {
  if (!UcxTcpUsable()) GTEST_SKIP() << "no /sys/class/net here: UCX's tcp transport has no device to use";
  TestCluster c("worker-dkill");
  // Without migration (worker_fault_test.cc covers it): the killed worker's requests fail fast.
  ASSERT_OK_W(c.StartRouter({"--max-migrations", "0"}), Workers(&c));
  Workers w(&c);
  ASSERT_OK_W(w.Start("p0", "prefill"), w);
  for (const char* id : {"d0", "d1"}) ASSERT_OK_W(w.Start(id, "decode"), w);
  ASSERT_TRUE(c.WaitForWorkers(3, 30s)) << w.Logs();
  constexpr int kN = 8, kMax = 400;
  double kill_at = 0;
  auto got = StreamAndKill(c, kN, kMax, [&] { w.proc("d0")->Kill(); }, &kill_at);
  int errors = 0;
  for (int k = 0; k < kN; ++k) {
    if (got[k].error) {
      ++errors;
      EXPECT_LT(got[k].error_at - kill_at, 5.0) << "error event too late for request " << k;
    } else {
      EXPECT_EQ(got[k].text, Text(Reference(Prompt(100 + k), kMax))) << k;
    }
  }
  EXPECT_GT(errors, 0);
  EXPECT_LT(errors, kN);
  EXPECT_TRUE(w.NoBlocksUsed("d1", 10s)) << "KV blocks leaked on the surviving decode worker";
  EXPECT_TRUE(w.NoBlocksUsed("p0", 10s));
  if (HasFailure()) ADD_FAILURE() << w.Logs();
}

TEST(WorkerE2eTest, PrefillKilledNoRequestHangs) {
  if (!UcxTcpUsable()) GTEST_SKIP() << "no /sys/class/net here: UCX's tcp transport has no device to use";
  TestCluster c("worker-pkill");
  ASSERT_OK_W(c.StartRouter(), Workers(&c));
  Workers w(&c);
  for (const char* id : {"p0", "p1"}) ASSERT_OK_W(w.Start(id, "prefill"), w);
  ASSERT_OK_W(w.Start("d0", "decode"), w);
  ASSERT_TRUE(c.WaitForWorkers(3, 30s)) << w.Logs();
  // Kill a prefill worker while requests keep arriving, at a moment the router has work
  // outstanding on it (prompts long enough that each prefill takes a while): each request ends
  // (tokens or an error).
  constexpr int kN = 12;
  std::vector<Streamed> got(kN);
  std::vector<std::thread> threads;
  const auto t0 = std::chrono::steady_clock::now();
  for (int k = 0; k < kN; ++k)
    threads.emplace_back([&, k] {
      std::this_thread::sleep_for(std::chrono::milliseconds(20 * k));
      got[k] = Collect(HttpPostSse(c.http_port(), "/v1/completions", Body(LongPrompt(200 + k, 400), 30, true), 60s));
    });
  const bool fired = w.KillWhenBusy("p0", 20s);
  for (auto& t : threads) t.join();
  ASSERT_TRUE(fired) << "p0 never had a request outstanding: the kill would prove nothing\n" << w.Logs();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 40s);
  int ok = 0;
  for (int k = 0; k < kN; ++k) {
    if (got[k].error || got[k].usage.is_null()) continue;  // failed with p0 (HTTP 503 or an error event)
    ++ok;
    EXPECT_EQ(got[k].text, Text(Reference(LongPrompt(200 + k, 400), 30))) << k;
  }
  EXPECT_GT(ok, 0);
  // Reservations whose prefill died come back (transfer failure or lease + quarantine).
  EXPECT_TRUE(w.NoBlocksUsed("d0", 15s)) << "KV blocks leaked on the decode worker";
  // The cluster still serves.
  auto r = HttpPost(c.http_port(), "/v1/completions", Body(Prompt(5), 6, false), 60s);
  EXPECT_EQ(r.status, 200) << r.body;
  if (HasFailure()) ADD_FAILURE() << w.Logs();
}

// Layer streaming over real UCX tcp: each layer's KV writes are queued during the prompt's
// forward (all of them: layers_streamed = layers x requests), some of the KV has landed on the
// decode worker before the forward ended (landed bytes > 0), and the outputs still equal the
// single-process greedy run. Requests go one at a time so every figure is per request.
TEST(WorkerE2eTest, LayerStreamingWritesDuringThePrefillForward) {
  if (!UcxTcpUsable()) GTEST_SKIP() << "no /sys/class/net here: UCX's tcp transport has no device to use";
  TestCluster c("worker-stream");
  ASSERT_OK_W(c.StartRouter(), Workers(&c));
  Workers w(&c);
  ASSERT_OK_W(w.Start("p0", "prefill"), w);
  ASSERT_OK_W(w.Start("d0", "decode"), w);
  ASSERT_TRUE(c.WaitForWorkers(2, 30s)) << w.Logs();
  constexpr int kN = 4, kMax = 8;
  for (int k = 0; k < kN; ++k) {
    const auto p = LongPrompt(k, 700);
    auto s = Collect(HttpPostSse(c.http_port(), "/v1/completions", Body(p, kMax, true), 120s));
    EXPECT_FALSE(s.error) << k;
    EXPECT_EQ(s.text, Text(Reference(p, kMax))) << "request " << k;
  }
  const std::string pm = w.Metrics("p0");
  const double layers = 3;  // the tiny preset
  EXPECT_EQ(MetricValue(pm, "pdserve_worker_kv_layers_streamed_total"), layers * kN) << pm;
  EXPECT_GT(MetricValue(pm, "pdserve_worker_kv_stream_landed_bytes_total"), 0) << pm;
  EXPECT_EQ(MetricValue(pm, "pdserve_worker_kv_transfers_total", "ok"), kN);
  EXPECT_EQ(MetricValue(pm, "pdserve_worker_kv_transfer_tail_seconds_count"), kN);
  EXPECT_EQ(MetricValue(w.Metrics("d0"), "pdserve_worker_kv_transfers_total", "ok"), kN);
  EXPECT_EQ(PromtoolProblems(pm), "");
  for (const char* id : {"p0", "d0"}) EXPECT_TRUE(w.NoBlocksUsed(id, 5s)) << id;
  if (HasFailure()) ADD_FAILURE() << w.Logs();
}

// The switch: --kv-stream-layers false writes every layer after the forward; same outputs.
TEST(WorkerE2eTest, WholePromptTransferStillMatchesGreedy) {
  if (!UcxTcpUsable()) GTEST_SKIP() << "no /sys/class/net here: UCX's tcp transport has no device to use";
  TestCluster c("worker-nostream");
  ASSERT_OK_W(c.StartRouter(), Workers(&c));
  Workers w(&c);
  ASSERT_OK_W(w.Start("p0", "prefill", {"--kv-stream-layers", "false"}), w);
  ASSERT_OK_W(w.Start("d0", "decode"), w);
  ASSERT_TRUE(c.WaitForWorkers(2, 30s)) << w.Logs();
  constexpr int kN = 3, kMax = 8;
  for (int k = 0; k < kN; ++k) {
    const auto p = LongPrompt(k, 300);
    auto s = Collect(HttpPostSse(c.http_port(), "/v1/completions", Body(p, kMax, true), 120s));
    EXPECT_FALSE(s.error) << k;
    EXPECT_EQ(s.text, Text(Reference(p, kMax))) << "request " << k;
  }
  const std::string pm = w.Metrics("p0");
  EXPECT_EQ(MetricValue(pm, "pdserve_worker_kv_layers_streamed_total"), 0);
  EXPECT_EQ(MetricValue(pm, "pdserve_worker_kv_transfers_total", "ok"), kN);
  for (const char* id : {"p0", "d0"}) EXPECT_TRUE(w.NoBlocksUsed(id, 5s)) << id;
  if (HasFailure()) ADD_FAILURE() << w.Logs();
}

// A prefill forward failing after layer 1 (injected), once layers 0 and 1 were already being
// written into the decode worker's blocks: every request ends with an error, quickly, and
// neither worker keeps a KV block.
TEST(WorkerE2eTest, PrefillFailingMidLayersLeaksNothing) {
  if (!UcxTcpUsable()) GTEST_SKIP() << "no /sys/class/net here: UCX's tcp transport has no device to use";
  TestCluster c("worker-midfail");
  // Migration off: each request gets exactly one attempt, so the counts below are per request
  // (with migration on, the router would retry the failed prefill, docs/router.md).
  ASSERT_OK_W(c.StartRouter({"--max-migrations", "0"}), Workers(&c));
  Workers w(&c);
  ASSERT_OK_W(w.Start("p0", "prefill", {"--fault-fail-prefill-at-layer", "1"}), w);
  ASSERT_OK_W(w.Start("d0", "decode"), w);
  ASSERT_TRUE(c.WaitForWorkers(2, 30s)) << w.Logs();
  // One at a time (a failing forward fails every request of its step, exporting or not).
  constexpr int kN = 4;
  for (int k = 0; k < kN; ++k) {
    const auto t0 = std::chrono::steady_clock::now();
    auto got = Collect(HttpPostSse(c.http_port(), "/v1/completions", Body(LongPrompt(10 + k, 400), 8, true), 60s));
    EXPECT_LT(std::chrono::steady_clock::now() - t0, 10s);
    EXPECT_TRUE(got.error || got.usage.is_null()) << k << ": " << got.text;
  }
  const std::string pm = w.Metrics("p0");
  // Layers 0 and 1 of each request were streamed before the failure, layer 2 never.
  EXPECT_EQ(MetricValue(pm, "pdserve_worker_kv_layers_streamed_total"), 2.0 * kN) << pm;
  EXPECT_EQ(MetricValue(pm, "pdserve_worker_kv_transfers_total", "ok"), 0);
  // The decode side's reservations come back through the abort path, well before the 4 s
  // lease would have reclaimed them.
  EXPECT_TRUE(w.NoBlocksUsed("d0", 3s)) << "KV blocks leaked on the decode worker";
  EXPECT_TRUE(w.NoBlocksUsed("p0", 5s)) << "held KV blocks leaked on the prefill worker";
  EXPECT_EQ(MetricValue(w.Metrics("d0"), "pdserve_worker_kv_transfers_total", "ok"), 0);
  if (HasFailure()) ADD_FAILURE() << w.Logs();
}

// Queue figures move: one sequence at a time on a colocated worker, several requests at
// once: the heartbeat-refreshed gauges show waiting requests and queued tokens while they
// wait, and every request's queue time is observed.
TEST(WorkerE2eTest, QueueTimeAndQueuedTokensAreReported) {
  TestCluster c("worker-queue");
  ASSERT_OK_W(c.StartRouter(), Workers(&c));
  Workers w(&c);
  ASSERT_OK_W(w.Start("c0", "colocated", {"--max-seqs", "1"}), w);
  ASSERT_TRUE(c.WaitForWorkers(1, 30s)) << w.Logs();
  constexpr int kN = 4, kMax = 300;
  std::vector<Streamed> got(kN);
  std::vector<std::thread> threads;
  for (int k = 0; k < kN; ++k)
    threads.emplace_back([&, k] {
      got[k] = Collect(HttpPostSse(c.http_port(), "/v1/completions", Body(Prompt(40 + k), kMax, true), 120s));
    });
  double max_queued = 0, max_waiting = 0;
  WaitFor(
      [&] {
        const std::string m = w.Metrics("c0");
        max_queued = std::max(max_queued, MetricValue(m, "pdserve_worker_queued_tokens"));
        max_waiting = std::max(max_waiting, MetricValue(m, "pdserve_worker_waiting_requests"));
        return max_queued > kMax && max_waiting >= 1;
      },
      60s, 50ms);
  for (auto& t : threads) t.join();
  EXPECT_GT(max_queued, kMax) << "queued tokens never showed more than one request's output";
  EXPECT_GE(max_waiting, 1);
  for (int k = 0; k < kN; ++k) EXPECT_FALSE(got[k].error) << k;
  const std::string m = w.Metrics("c0");
  EXPECT_EQ(MetricValue(m, "pdserve_worker_queue_time_seconds_count"), kN) << m;
  // The last of them waited for at least one other request's whole run.
  EXPECT_GT(MetricValue(m, "pdserve_worker_queue_time_seconds_sum"), 0.01) << m;
  EXPECT_TRUE(WaitFor([&] { return MetricValue(w.Metrics("c0"), "pdserve_worker_queued_tokens") == 0; }, 5s, 100ms));
  if (HasFailure()) ADD_FAILURE() << w.Logs();
}

// The prefix-cache tests' workers: p0 + d0 (P/D) or c0 (colocated), registered.
void StartCacheWorkers(TestCluster& c, Workers& w, bool pd) {
  if (pd) {
    ASSERT_OK_W(w.Start("p0", "prefill"), w);
    ASSERT_OK_W(w.Start("d0", "decode"), w);
  } else {
    ASSERT_OK_W(w.Start("c0", "colocated"), w);
  }
  ASSERT_TRUE(c.WaitForWorkers(pd ? 2 : 1, 30s)) << w.Logs();
}

// The prefix cache in the cluster: a second turn (the first prompt + more) maps the first
// turn's cached blocks and its reply still equals the cold single-process engine's, colocated
// and disaggregated. In P/D the prefill worker hits, and the decode worker (same namespace,
// announced at registration) caches the KV it imported.
TEST(WorkerE2eTest, PrefixCacheHitsKeepRepliesExact) {
  for (const bool pd : {false, true}) {
    SCOPED_TRACE(pd ? "P/D" : "colocated");
    if (pd && !UcxTcpUsable()) GTEST_SKIP() << "no /sys/class/net here: UCX's tcp transport has no device to use";
    TestCluster c(pd ? "worker-prefix-pd" : "worker-prefix");
    // Decode-side hits off: the turns are the prefill worker's to compute here (with them on, d0
    // would run turns 2 and 3 itself: KvRoutingE2eTest.DecodeSideHitsRunShortTurnsOnTheDecodeWorker).
    ASSERT_OK_W(c.StartRouter({"--decode-local-prefill-tokens", "0"}), Workers(&c));
    Workers w(&c);
    ASSERT_NO_FATAL_FAILURE(StartCacheWorkers(c, w, pd));
    const std::string computing = pd ? "p0" : "c0";
    // Longer than the engine's first prefill chunk (256), the least a hit maps.
    std::vector<int32_t> turn1 = LongPrompt(7, 600);
    constexpr int kMax = 6;
    std::vector<int32_t> turn2 = turn1;
    const std::vector<int32_t> more = LongPrompt(8, 90);
    turn2.insert(turn2.end(), more.begin(), more.end());
    int turn = 0;
    for (const auto* prompt : {&turn1, &turn2, &turn2}) {
      auto r = HttpPost(c.http_port(), "/v1/completions", Body(*prompt, kMax, false), 120s);
      ASSERT_EQ(r.status, 200) << r.body << w.Logs();
      const json j = json::parse(r.body);
      EXPECT_EQ(j["choices"][0]["text"].get<std::string>(), Text(Reference(*prompt, kMax)));
      // The usage says what the cache supplied: nothing cold, at least turn 1's 9 blocks after.
      const int cached = j["usage"]["prompt_tokens_details"]["cached_tokens"].get<int>();
      if (turn++ == 0) {
        EXPECT_EQ(cached, 0) << r.body;
      } else {
        EXPECT_GE(cached, 576) << r.body;
      }
    }
    // Heartbeats refresh the engine figures the metrics show: wait for all three lookups.
    const double looked_up = static_cast<double>(turn1.size() + 2 * turn2.size());
    EXPECT_TRUE(WaitFor(
        [&] { return MetricValue(w.Metrics(computing), "pdserve_prefix_cache_lookup_tokens_total") == looked_up; }, 10s,
        100ms))
        << w.Metrics(computing);
    const std::string m = w.Metrics(computing);
    // Turns 2 and 3 each map at least turn 1's 9 full blocks of 64.
    EXPECT_GE(MetricValue(m, "pdserve_prefix_cache_hit_tokens_total"), 2 * 576) << m;
    EXPECT_EQ(MetricValue(m, "pdserve_prefix_cache_hit_tokens_total") +
                  MetricValue(m, "pdserve_prefix_cache_computed_tokens_total"),
              looked_up)
        << m;
    EXPECT_GT(MetricValue(m, "pdserve_prefix_cache_blocks"), 0) << m;
    if (pd) {
      EXPECT_GT(MetricValue(w.Metrics("d0"), "pdserve_prefix_cache_blocks"), 0) << w.Metrics("d0");
    }
    for (const std::string& id : pd ? std::vector<std::string>{"p0", "d0"} : std::vector<std::string>{"c0"}) {
      EXPECT_EQ(PromtoolProblems(w.Metrics(id)), "") << id;
      EXPECT_TRUE(w.NoBlocksUsed(id, 5s)) << id;
    }
    if (HasFailure()) ADD_FAILURE() << w.Logs();
  }
}

// n > 1: the choices go to the same workers, and the engine lets the later ones wait for the
// first one's prefill, then map its blocks: the prompt's KV is computed once.
TEST(WorkerE2eTest, ChoicesOfOneRequestComputeThePromptOnce) {
  for (const bool pd : {false, true}) {
    SCOPED_TRACE(pd ? "P/D" : "colocated");
    if (pd && !UcxTcpUsable()) GTEST_SKIP() << "no /sys/class/net here: UCX's tcp transport has no device to use";
    TestCluster c(pd ? "worker-n-pd" : "worker-n");
    ASSERT_OK_W(c.StartRouter(), Workers(&c));
    Workers w(&c);
    ASSERT_NO_FATAL_FAILURE(StartCacheWorkers(c, w, pd));
    const std::vector<int32_t> prompt = LongPrompt(11, 600);
    constexpr int kMax = 5, kN = 3;
    json body = json::parse(Body(prompt, kMax, false));
    body["n"] = kN;
    auto r = HttpPost(c.http_port(), "/v1/completions", body.dump(), 120s);
    ASSERT_EQ(r.status, 200) << r.body << w.Logs();
    const json j = json::parse(r.body);
    ASSERT_EQ(j["choices"].size(), static_cast<size_t>(kN));
    for (int i = 0; i < kN; ++i)  // greedy: every choice is the reference
      EXPECT_EQ(j["choices"][i]["text"].get<std::string>(), Text(Reference(prompt, kMax))) << i;
    // The usage reports the most any choice found cached. Colocated, the choices are twin
    // prompts (engine/scheduler.h): two copy the first one's KV, the whole 600 tokens. The
    // P/D prefill worker exports each choice's KV, so there they map the prompt's 9 full
    // blocks of 64 from the prefix cache and compute the tail.
    const int found = pd ? 576 : 600;
    EXPECT_EQ(j["usage"]["prompt_tokens_details"]["cached_tokens"].get<int>(), found) << r.body;
    const std::string computing = pd ? "p0" : "c0";
    // Of the three lookups of the prompt, two find it: computed once.
    EXPECT_TRUE(WaitFor(
        [&] {
          return MetricValue(w.Metrics(computing), "pdserve_prefix_cache_lookup_tokens_total") ==
                 static_cast<double>(kN * prompt.size());
        },
        10s, 100ms))
        << w.Metrics(computing);
    EXPECT_EQ(MetricValue(w.Metrics(computing), "pdserve_prefix_cache_hit_tokens_total"), (kN - 1) * 1.0 * found)
        << w.Metrics(computing);
    for (const std::string& id : pd ? std::vector<std::string>{"p0", "d0"} : std::vector<std::string>{"c0"})
      EXPECT_TRUE(w.NoBlocksUsed(id, 5s)) << id;
    if (HasFailure()) ADD_FAILURE() << w.Logs();
  }
}

// The prefix cache's disk tier in a worker process: with a pool of about 21 blocks of 64,
// filler prompts push a first turn's cached blocks out of memory into the tier
// (--prefix-cache-disk-dir); the second turn reads them back, its reply still equals the cold
// single-process engine's, and the tier's metrics count the blocks stored and restored.
TEST(WorkerE2eTest, PrefixCacheDiskTierRestoresAnEvictedTurn) {
  TestCluster c("worker-prefix-disk");
  ASSERT_OK_W(c.StartRouter(), Workers(&c));
  Workers w(&c);
  const std::string tier = c.dir() + "/kv-tier";
  ASSERT_OK_W(w.Start("c0", "colocated", {"--kv-gib", "0.0015", "--prefix-cache-disk-dir", tier}), w);
  ASSERT_TRUE(c.WaitForWorkers(1, 30s)) << w.Logs();
  EXPECT_TRUE(std::filesystem::exists(tier + "/c0/LOCK"));  // the worker's own directory
  constexpr int kMax = 5;
  // The reply (checked against the reference) and the prompt tokens the cache supplied.
  auto run = [&](const std::vector<int32_t>& prompt) {
    auto r = HttpPost(c.http_port(), "/v1/completions", Body(prompt, kMax, false), 120s);
    EXPECT_EQ(r.status, 200) << r.body << w.Logs();
    if (r.status != 200) return -1;
    const json j = json::parse(r.body);
    EXPECT_EQ(j["choices"][0]["text"].get<std::string>(), Text(Reference(prompt, kMax)));
    return j["usage"]["prompt_tokens_details"]["cached_tokens"].get<int>();
  };
  const std::vector<int32_t> turn1 = LongPrompt(21, 600);
  std::vector<int32_t> turn2 = turn1;
  const std::vector<int32_t> more = LongPrompt(22, 90);
  turn2.insert(turn2.end(), more.begin(), more.end());
  EXPECT_EQ(run(turn1), 0);
  // Three fillers of 10 blocks each: turn 1's idle blocks are the oldest, evicted first.
  for (int k = 0; k < 3; ++k) EXPECT_EQ(run(LongPrompt(30 + k, 600)), 0) << k;
  EXPECT_TRUE(WaitFor(
      [&] { return MetricValue(w.Metrics("c0"), "pdserve_prefix_cache_tier_stored_blocks_total") >= 9; }, 10s, 100ms))
      << w.Metrics("c0");
  // Turn 1's 9 full blocks come back from disk (nothing of them is left in the pool).
  EXPECT_EQ(run(turn2), 576);
  EXPECT_TRUE(WaitFor(
      [&] { return MetricValue(w.Metrics("c0"), "pdserve_prefix_cache_tier_restored_tokens_total") == 576; }, 10s,
      100ms))
      << w.Metrics("c0");
  const std::string m = w.Metrics("c0");
  EXPECT_EQ(MetricValue(m, "pdserve_prefix_cache_tier_corrupt_files_total"), 0) << m;
  EXPECT_GT(MetricValue(m, "pdserve_prefix_cache_tier_blocks"), 0) << m;
  EXPECT_EQ(PromtoolProblems(m), "");
  EXPECT_TRUE(w.NoBlocksUsed("c0", 5s));
  if (HasFailure()) ADD_FAILURE() << w.Logs();
}

}  // namespace
}  // namespace pdserve::services::worker
