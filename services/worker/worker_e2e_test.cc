// End-to-end tests of the engine-backed workers: a real pdserve-router and real pdserve-colocated
// / pdserve-prefill / pdserve-decode processes on loopback (UCX tcp between prefill and decode),
// a tiny model with the DeepSeek vocabulary made by `pdserve make-model`, and the greedy output
// of a single-process Engine (one request at a time) as the reference for every reply.
#include <signal.h>

#include <atomic>
#include <map>
#include <mutex>
#include <thread>

#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>

#include "engine/engine.h"
#include "services/common/process_util.h"
#include "services/router/cluster_fixture.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/tokenizer_paths.h"

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
const std::string kBin = PDSERVE_BIN_DIR;

const tokenizer::Tokenizer& Tok() {
  static const auto* tok = tokenizer::Tokenizer::Load(tokenizer::DefaultTokenizerDir()).value().release();
  return *tok;
}

// The tiny model, made once per test binary.
const std::string& ModelDir() {
  static const std::string dir = [] {
    const std::string d = testing::MakeTempDir("pdserve-worker-model") + "/tiny";
    const std::string cmd = kBin + "/pdserve make-model --preset tiny --vocab 128815 --seed 3 --out " + d +
                            " > " + d + ".log 2>&1";
    EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
    return d;
  }();
  return dir;
}

std::vector<int32_t> Prompt(int k) {
  static const char* kWords[] = {"alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel"};
  std::string text;
  for (int i = 0; i < 6 + k % 9; ++i) text += std::string(i ? " " : "") + kWords[(k * 5 + i * 3) % 8] + std::to_string(k);
  return Tok().Encode(text, {false, true}).value();
}

// Single-process greedy output (the Engine with one request at a time), cached.
std::vector<int32_t> Reference(const std::vector<int32_t>& prompt, int max_tokens) {
  static std::mutex mu;
  static std::unique_ptr<engine::Engine> eng;
  static std::map<std::pair<std::vector<int32_t>, int>, std::vector<int32_t>> cache;
  std::lock_guard<std::mutex> lock(mu);
  auto key = std::make_pair(prompt, max_tokens);
  if (auto it = cache.find(key); it != cache.end()) return it->second;
  if (!eng) {
    engine::EngineOptions eo;
    eo.model_dir = ModelDir();
    eo.kv_cache_gib = 0.125;
    eng = engine::Engine::Create(eo).value();
  }
  std::vector<int32_t> out;
  engine::RequestOptions ro;
  ro.sampling.temperature = 0;
  ro.sampling.max_tokens = max_tokens;
  ro.on_event = [&out](const engine::TokenEvent& ev) {
    if (ev.token >= 0) out.push_back(ev.token);
  };
  EXPECT_TRUE(eng->AddRequest(prompt, ro).ok());
  while (eng->Step()) {
  }
  cache[key] = out;
  return out;
}

std::string Text(const std::vector<int32_t>& tokens) { return Tok().Decode(tokens, {true}).value(); }

std::string Body(const std::vector<int32_t>& prompt, int max_tokens, bool stream) {
  json b = {{"model", "pdserve"}, {"prompt", prompt}, {"max_tokens", max_tokens}, {"temperature", 0},
            {"ignore_eos", true}};
  if (stream) {
    b["stream"] = true;
    b["stream_options"] = {{"include_usage", true}};
  }
  return b.dump();
}

struct Streamed {
  std::string text;
  json usage;
  bool error = false;
  double error_at = -1;  // seconds since the request was sent
};
Streamed Collect(const SseReply& r) {
  Streamed out;
  for (size_t i = 0; i < r.events.size(); ++i) {
    json j = json::parse(r.events[i], nullptr, false);
    if (j.is_discarded()) continue;
    if (j.contains("error")) {
      out.error = true;
      out.error_at = r.arrival_seconds[i];
      continue;
    }
    if (j.contains("usage") && !j["usage"].is_null()) out.usage = j["usage"];
    for (const auto& c : j["choices"])
      if (c.contains("text")) out.text += c["text"].get<std::string>();
  }
  return out;
}

// Worker processes next to a TestCluster's router.
class Workers {
 public:
  explicit Workers(TestCluster* c) : c_(c) {}
  Status Start(const std::string& id, const std::string& role, std::vector<std::string> extra = {}) {
    const std::string ready = c_->dir() + "/" + id + ".ready";
    std::vector<std::string> argv = {kBin + "/pdserve-" + role, "--router", c_->control_endpoint(), "--worker-id", id,
                                     "--model", ModelDir(), "--model-name", "pdserve", "--ready-file", ready,
                                     "--register-retry-ms", "50", "--kv-gib", "0.0625", "--threads", "1",
                                     "--kv-lease-ms", "4000", "--kv-transfer-timeout-ms", "4000"};
    argv.insert(argv.end(), extra.begin(), extra.end());
    PDSERVE_ASSIGN_OR_RETURN(auto child, ChildProcess::Spawn(argv, c_->dir() + "/" + id + ".log",
                                                             {"UCX_TLS=tcp", "UCX_NET_DEVICES=lo"}));
    ChildProcess* p = child.get();
    procs_[id] = std::move(child);
    json r;
    const bool ok = WaitFor(
        [&] {
          auto text = ReadFile(ready);
          if (!text.ok()) return !p->Running();
          r = json::parse(text.value(), nullptr, false);
          return !r.is_discarded();
        },
        60s);
    if (!ok || r.is_discarded() || r.is_null()) return Status::DeadlineExceeded(id + " did not start:\n" + p->Log());
    ports_[id] = r["metrics_port"].get<int>();
    return Status::Ok();
  }
  ChildProcess* proc(const std::string& id) { return procs_.at(id).get(); }
  int port(const std::string& id) { return ports_.at(id); }
  std::string Metrics(const std::string& id) { return HttpGet(port(id), "/metrics", 5s).body; }
  // Waits until the worker's heartbeat-refreshed gauge says no KV block is in use.
  bool NoBlocksUsed(const std::string& id, std::chrono::milliseconds timeout) {
    return WaitFor([&] { return MetricValue(Metrics(id), "pdserve_worker_kv_blocks", "used") == 0; }, timeout, 100ms);
  }
  std::string Logs() {
    std::string s = c_->Logs();
    for (auto& [id, p] : procs_) s += "==== " + id + "\n" + p->Log();
    return s;
  }

 private:
  TestCluster* c_;
  std::map<std::string, std::unique_ptr<ChildProcess>> procs_;
  std::map<std::string, int> ports_;
};

#define ASSERT_OK_W(expr, w)                                      \
  do {                                                            \
    Status s_ = (expr);                                           \
    ASSERT_TRUE(s_.ok()) << s_.ToString() << "\n" << (w).Logs(); \
  } while (0)

// The P/D tests move KV over UCX tcp on loopback; UCX finds interfaces through sysfs, which a
// bare chroot lacks.
bool UcxTcpUsable() { return std::filesystem::exists("/sys/class/net"); }

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
  ASSERT_OK_W(c.StartRouter(), Workers(&c));
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
  // Kill a prefill worker while requests keep arriving: each ends (tokens or an error).
  constexpr int kN = 12;
  std::vector<Streamed> got(kN);
  std::vector<std::thread> threads;
  const auto t0 = std::chrono::steady_clock::now();
  for (int k = 0; k < kN; ++k)
    threads.emplace_back([&, k] {
      std::this_thread::sleep_for(std::chrono::milliseconds(20 * k));
      got[k] = Collect(HttpPostSse(c.http_port(), "/v1/completions", Body(Prompt(200 + k), 30, true), 60s));
    });
  std::this_thread::sleep_for(100ms);
  w.proc("p0")->Kill();
  for (auto& t : threads) t.join();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 40s);
  int ok = 0;
  for (int k = 0; k < kN; ++k) {
    if (got[k].error || got[k].usage.is_null()) continue;  // failed with p0 (HTTP 503 or an error event)
    ++ok;
    EXPECT_EQ(got[k].text, Text(Reference(Prompt(200 + k), 30))) << k;
  }
  EXPECT_GT(ok, 0);
  // Reservations whose prefill died come back (transfer failure or lease + quarantine).
  EXPECT_TRUE(w.NoBlocksUsed("d0", 15s)) << "KV blocks leaked on the decode worker";
  // The cluster still serves.
  auto r = HttpPost(c.http_port(), "/v1/completions", Body(Prompt(5), 6, false), 60s);
  EXPECT_EQ(r.status, 200) << r.body;
  if (HasFailure()) ADD_FAILURE() << w.Logs();
}

}  // namespace
}  // namespace pdserve::services::worker
