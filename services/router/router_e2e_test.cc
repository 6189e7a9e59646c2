// End-to-end tests of the router and the control plane: a real pdserve-router process (or a
// RouterServer in this process) and real pdserve-echo-worker processes on loopback sockets.
// The echo worker's output is predictable (echo_engine.h: token i = prompt[i % n]), so every
// reply is checked exactly.
#include <signal.h>

#include <atomic>
#include <mutex>
#include <thread>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "services/common/process_util.h"
#include "services/testing/cluster_fixture.h"
#include "services/router/router_server.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/tokenizer_paths.h"

namespace pdserve::router {
namespace {

using namespace std::chrono_literals;
using nlohmann::json;
using services::testing::HttpGet;
using services::testing::HttpPost;
using services::testing::HttpPostSse;
using services::testing::SseReply;
using services::testing::WaitFor;
using testing::TestCluster;
using Clock = std::chrono::steady_clock;

const tokenizer::Tokenizer& Tok() {
  static const auto* tok = tokenizer::Tokenizer::Load(tokenizer::DefaultTokenizerDir()).value().release();
  return *tok;
}

// Prompts of plain English words (no EOS inside, so only max_tokens ends the echo; the echoed
// text is readable in failure messages). Prompt(k, n) holds about n words.
std::vector<int32_t> Prompt(int k, int n = 12) {
  static const char* kWords[] = {"alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel",
                                 "india", "juliet", "kilo", "lima", "mike", "november", "oscar", "papa"};
  std::string text;
  for (int i = 0; i < n; ++i) text += std::string(i ? " " : "") + kWords[(k * 5 + i * 3) % 16] + std::to_string(k);
  return Tok().Encode(text, {false, true}).value();
}

std::string EchoText(const std::vector<int32_t>& prompt, size_t max_tokens) {
  std::vector<int32_t> out;
  for (size_t i = 0; i < max_tokens; ++i) out.push_back(prompt[i % prompt.size()]);
  return Tok().Decode(out, {/*skip_special_tokens=*/true}).value();
}

std::vector<int32_t> ChatPrompt(const std::string& user) {
  auto tmpl = tokenizer::ChatTemplate::FromConfig(Tok().config()).value();
  tokenizer::ChatTemplateOptions o;
  o.add_generation_prompt = true;
  auto text = tmpl.Render({{"user", user, {}}}, o).value();
  return Tok().Encode(text, {false, true}).value();
}

std::string CompletionBody(const std::vector<int32_t>& prompt, int max_tokens, bool stream = false) {
  json b = {{"model", "pdserve"}, {"prompt", prompt}, {"max_tokens", max_tokens}, {"temperature", 0}};
  if (stream) b["stream"] = true;
  return b.dump();
}

// Concatenated text of an SSE reply (chat deltas or completion texts), the usage chunk (or
// null) and whether an error event arrived.
struct StreamResult {
  std::string text;
  json usage;
  bool error = false;
  std::string finish_reason;
};
StreamResult Collect(const SseReply& r) {
  StreamResult out;
  for (const auto& e : r.events) {
    json j = json::parse(e);
    if (j.contains("error")) {
      out.error = true;
      continue;
    }
    if (j.contains("usage") && !j["usage"].is_null()) out.usage = j["usage"];
    for (const auto& c : j["choices"]) {
      if (c.contains("delta") && c["delta"].contains("content")) out.text += c["delta"]["content"].get<std::string>();
      if (c.contains("text")) out.text += c["text"].get<std::string>();
      if (!c["finish_reason"].is_null()) out.finish_reason = c["finish_reason"].get<std::string>();
    }
  }
  return out;
}

#define ASSERT_OK_C(expr, cluster) \
  do {                             \
    Status s_ = (expr);            \
    ASSERT_TRUE(s_.ok()) << s_.ToString() << "\n" << (cluster).Logs(); \
  } while (0)

// /v1/tokenize and /v1/detokenize through the real router (tokenize_api.h has the cases):
// the prompt a request gets, the largest worker context, a round trip, 400s naming the field.
TEST(RouterE2eTest, TokenizeAndDetokenize) {
  TestCluster c("tokenize");
  ASSERT_OK_C(c.StartRouter(), c);
  // Before any worker: the context is unknown.
  auto r = HttpPost(c.http_port(), "/v1/tokenize", R"({"model":"pdserve","prompt":"hello world"})");
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_TRUE(json::parse(r.body)["max_model_len"].is_null());
  ASSERT_OK_C(c.StartWorker("w0"), c);
  ASSERT_TRUE(c.WaitForWorkers(1)) << c.Logs();
  r = HttpPost(c.http_port(), "/v1/tokenize", R"({"model":"pdserve","prompt":"hello world"})");
  ASSERT_EQ(r.status, 200) << r.body;
  json j = json::parse(r.body);
  std::vector<int32_t> want = {*Tok().bos_id()};
  const std::vector<int32_t> hello = Tok().Encode("hello world", {false, true}).value();
  want.insert(want.end(), hello.begin(), hello.end());
  EXPECT_EQ(j["tokens"].get<std::vector<int32_t>>(), want);
  EXPECT_EQ(j["count"], want.size());
  EXPECT_EQ(j["max_model_len"], c.Workers()[0]["max_context_tokens"]);
  // The chat form gives the prompt a chat completion is sent with (the echo worker repeats it).
  r = HttpPost(c.http_port(), "/tokenize", R"({"messages":[{"role":"user","content":"Hi"}]})");
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(json::parse(r.body)["tokens"].get<std::vector<int32_t>>(), ChatPrompt("Hi"));
  r = HttpPost(c.http_port(), "/v1/detokenize", json{{"model", "pdserve"}, {"tokens", want}}.dump());
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(json::parse(r.body)["prompt"], "<｜begin▁of▁sentence｜>hello world");
  r = HttpPost(c.http_port(), "/detokenize", R"({"tokens":[1,999999999]})");
  EXPECT_EQ(r.status, 400);
  EXPECT_EQ(json::parse(r.body)["error"]["param"], "tokens");
  r = HttpPost(c.http_port(), "/v1/tokenize", R"({"model":"other","prompt":"x"})");
  EXPECT_EQ(r.status, 404);
  r = HttpPost(c.http_port(), "/v1/tokenize", R"({"prompt":7})");
  EXPECT_EQ(r.status, 400);
  EXPECT_EQ(json::parse(r.body)["error"]["param"], "prompt");
}

TEST(RouterE2eTest, CompletionsChatStreamingUsageModelsHealthMetrics) {
  TestCluster c("basic");
  ASSERT_OK_C(c.StartRouter(), c);
  ASSERT_OK_C(c.StartWorker("w0"), c);
  ASSERT_TRUE(c.WaitForWorkers(1)) << c.Logs();

  // Non-streaming completion from token ids.
  const auto p = Prompt(1);
  auto r = HttpPost(c.http_port(), "/v1/completions", CompletionBody(p, 20));
  ASSERT_EQ(r.status, 200) << r.body << r.error;
  EXPECT_FALSE(r.headers["X-Request-Id"].empty());
  json j = json::parse(r.body);
  EXPECT_EQ(j["object"], "text_completion");
  EXPECT_EQ(j["choices"][0]["text"], EchoText(p, 20));
  EXPECT_EQ(j["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(j["usage"]["prompt_tokens"], p.size());
  EXPECT_EQ(j["usage"]["completion_tokens"], 20);
  EXPECT_EQ(j["usage"]["total_tokens"], p.size() + 20);

  // Text prompt: the router adds BOS and tokenizes.
  r = HttpPost(c.http_port(), "/v1/completions", R"({"model":"pdserve","prompt":"The quick brown fox","max_tokens":4})");
  ASSERT_EQ(r.status, 200) << r.body;
  auto text_prompt = Tok().Encode("The quick brown fox", {true, true}).value();
  EXPECT_EQ(json::parse(r.body)["choices"][0]["text"], EchoText(text_prompt, 4));
  EXPECT_EQ(json::parse(r.body)["usage"]["prompt_tokens"], text_prompt.size());

  // Non-streaming chat.
  const auto chat_prompt = ChatPrompt("Hello, how are you?");
  r = HttpPost(c.http_port(), "/v1/chat/completions",
               R"({"model":"pdserve","messages":[{"role":"user","content":"Hello, how are you?"}],"max_tokens":9})");
  ASSERT_EQ(r.status, 200) << r.body;
  j = json::parse(r.body);
  EXPECT_EQ(j["object"], "chat.completion");
  EXPECT_EQ(j["choices"][0]["message"]["role"], "assistant");
  EXPECT_EQ(j["choices"][0]["message"]["content"], EchoText(chat_prompt, 9));
  EXPECT_EQ(j["usage"]["prompt_tokens"], chat_prompt.size());
  EXPECT_EQ(j["usage"]["completion_tokens"], 9);

  // Streaming chat with usage.
  auto s = HttpPostSse(c.http_port(), "/v1/chat/completions",
                       R"({"model":"pdserve","messages":[{"role":"user","content":"Hello, how are you?"}],
                           "max_completion_tokens":11,"stream":true,"stream_options":{"include_usage":true}})");
  ASSERT_EQ(s.status, 200) << s.raw;
  EXPECT_TRUE(s.done);
  ASSERT_GE(s.events.size(), 3u);
  EXPECT_EQ(json::parse(s.events[0])["choices"][0]["delta"]["role"], "assistant");
  auto sr = Collect(s);
  EXPECT_EQ(sr.text, EchoText(chat_prompt, 11));
  EXPECT_EQ(sr.finish_reason, "length");
  EXPECT_EQ(sr.usage["prompt_tokens"], chat_prompt.size());
  EXPECT_EQ(sr.usage["completion_tokens"], 11);
  EXPECT_TRUE(json::parse(s.events.back())["choices"].empty());  // the usage chunk is last

  // Streaming completion without usage; stop string and stop token.
  s = HttpPostSse(c.http_port(), "/v1/completions", CompletionBody(p, 15, true));
  sr = Collect(s);
  EXPECT_EQ(sr.text, EchoText(p, 15));
  EXPECT_TRUE(sr.usage.is_null());
  const std::string full = EchoText(p, 24);
  const std::string stop = full.substr(full.find(' ', 5), 3);  // ASCII: the prompt is English words
  r = HttpPost(c.http_port(), "/v1/completions",
               json{{"model", "pdserve"}, {"prompt", p}, {"max_tokens", 24}, {"stop", stop}}.dump());
  j = json::parse(r.body);
  EXPECT_EQ(j["choices"][0]["text"], full.substr(0, full.find(stop)));
  EXPECT_EQ(j["choices"][0]["finish_reason"], "stop");
  r = HttpPost(c.http_port(), "/v1/completions",
               json{{"model", "pdserve"}, {"prompt", p}, {"max_tokens", 24}, {"stop_token_ids", {p[3]}}}.dump());
  j = json::parse(r.body);
  EXPECT_EQ(j["choices"][0]["text"], EchoText(p, 3));  // the stop token is not rendered
  EXPECT_EQ(j["choices"][0]["finish_reason"], "stop");
  EXPECT_EQ(j["usage"]["completion_tokens"], 4);

  // Logprobs (synthetic from the echo worker, but shaped like OpenAI's).
  r = HttpPost(c.http_port(), "/v1/chat/completions",
               R"({"model":"pdserve","messages":[{"role":"user","content":"Hi"}],"max_tokens":3,"logprobs":true,"top_logprobs":2})");
  j = json::parse(r.body);
  ASSERT_EQ(j["choices"][0]["logprobs"]["content"].size(), 3u) << r.body;
  EXPECT_EQ(j["choices"][0]["logprobs"]["content"][1]["logprob"], -0.5);
  EXPECT_EQ(j["choices"][0]["logprobs"]["content"][1]["top_logprobs"].size(), 2u);

  // /v1/models, /health.
  r = HttpGet(c.http_port(), "/v1/models");
  EXPECT_EQ(json::parse(r.body)["data"][0]["id"], "pdserve");
  r = HttpGet(c.http_port(), "/health");
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(json::parse(r.body)["workers"]["colocated"], 1);

  // Metrics: the router's and the worker's pass promtool; counts add up.
  r = HttpGet(c.http_port(), "/metrics");
  ASSERT_EQ(r.status, 200);
  EXPECT_EQ(testing::PromtoolProblems(r.body), "");
  EXPECT_EQ(testing::MetricValue(r.body, "pdserve_router_requests_total", "outcome=\"ok\""), 8);
  EXPECT_EQ(testing::MetricValue(r.body, "pdserve_router_ttft_seconds_count"), 8);
  EXPECT_EQ(testing::MetricValue(r.body, "pdserve_router_running_requests"), 0);
  EXPECT_EQ(testing::MetricValue(r.body, "pdserve_router_waiting_requests"), 0);
  r = HttpGet(c.worker_metrics_port("w0"), "/metrics");
  EXPECT_EQ(testing::PromtoolProblems(r.body), "");
  EXPECT_GE(testing::MetricValue(r.body, "pdserve_worker_jobs_total", "outcome=\"finished\""), 6);
}

TEST(RouterE2eTest, ThirtyTwoConcurrentStreamsOverTwoWorkers) {
  TestCluster c("concurrent");
  ASSERT_OK_C(c.StartRouter(), c);
  ASSERT_OK_C(c.StartWorker("w0", "colocated", {"--token-delay-us", "2000"}), c);
  ASSERT_OK_C(c.StartWorker("w1", "colocated", {"--token-delay-us", "2000"}), c);
  ASSERT_TRUE(c.WaitForWorkers(2)) << c.Logs();
  constexpr int kStreams = 32;
  std::vector<SseReply> replies(kStreams);
  std::vector<std::thread> threads;
  for (int k = 0; k < kStreams; ++k) {
    threads.emplace_back([&, k] {
      json b = {{"model", "pdserve"}, {"prompt", Prompt(k, 5 + k % 7)}, {"max_tokens", 16 + k},
                {"stream", true}, {"stream_options", {{"include_usage", true}}}};
      replies[k] = HttpPostSse(c.http_port(), "/v1/completions", b.dump());
    });
  }
  for (auto& t : threads) t.join();
  for (int k = 0; k < kStreams; ++k) {
    SCOPED_TRACE(k);
    ASSERT_EQ(replies[k].status, 200) << replies[k].raw << replies[k].error;
    auto sr = Collect(replies[k]);
    EXPECT_FALSE(sr.error);
    EXPECT_EQ(sr.text, EchoText(Prompt(k, 5 + k % 7), 16 + k));
    EXPECT_EQ(sr.usage["completion_tokens"], 16 + k);
    EXPECT_EQ(sr.usage["prompt_tokens"], Prompt(k, 5 + k % 7).size());
  }
  // Both workers served (least-outstanding-tokens spreads a burst).
  EXPECT_GT(c.WorkerMetric("w0", "pdserve_worker_jobs_total", "finished"), 4);
  EXPECT_GT(c.WorkerMetric("w1", "pdserve_worker_jobs_total", "finished"), 4);
}

TEST(RouterE2eTest, DisaggregatedPairMatchesColocatedOutput) {
  TestCluster c("pd");
  ASSERT_OK_C(c.StartRouter(), c);
  ASSERT_OK_C(c.StartWorker("p0", "prefill"), c);
  ASSERT_OK_C(c.StartWorker("d0", "decode", {"--token-delay-us", "1000"}), c);
  ASSERT_TRUE(c.WaitForWorkers(2)) << c.Logs();
  auto h = json::parse(HttpGet(c.http_port(), "/health").body);
  EXPECT_EQ(h["workers"]["prefill"], 1);
  EXPECT_EQ(h["workers"]["decode"], 1);
  const auto p = Prompt(3);
  auto r = HttpPost(c.http_port(), "/v1/completions", CompletionBody(p, 17));
  ASSERT_EQ(r.status, 200) << r.body << c.Logs();
  EXPECT_EQ(json::parse(r.body)["choices"][0]["text"], EchoText(p, 17));
  EXPECT_EQ(json::parse(r.body)["usage"]["completion_tokens"], 17);
  auto s = HttpPostSse(c.http_port(), "/v1/completions", CompletionBody(p, 9, true));
  EXPECT_EQ(Collect(s).text, EchoText(p, 9));
  // A request that ends at the prefill's first token frees the decode reservation.
  r = HttpPost(c.http_port(), "/v1/completions", CompletionBody(p, 1));
  EXPECT_EQ(json::parse(r.body)["choices"][0]["text"], EchoText(p, 1));
  EXPECT_TRUE(WaitFor([&] {
    auto w = c.Workers();
    for (const auto& x : w)
      if (x["id"] == "d0") return x["kv_blocks_free"] == x["kv_blocks_total"];
    return false;
  }, 5s));
  EXPECT_EQ(c.WorkerMetric("p0", "pdserve_worker_jobs_total", "finished"), 3);

  // A decode worker whose model / KV layout hash differs is refused and exits.
  ASSERT_OK_C(c.StartWorker("d1", "decode", {"--compat-hash", "12345"}), c);
  EXPECT_EQ(c.worker("d1")->WaitExit(10s), std::optional<int>(3)) << c.Logs();
  EXPECT_EQ(c.Workers().size(), 2u);
}

TEST(RouterE2eTest, RoundRobinAndLeastOutstandingTokens) {
  {
    TestCluster c("rr");
    ASSERT_OK_C(c.StartRouter({"--colocated-policy", "round_robin"}), c);
    ASSERT_OK_C(c.StartWorker("w0"), c);
    ASSERT_OK_C(c.StartWorker("w1"), c);
    ASSERT_TRUE(c.WaitForWorkers(2)) << c.Logs();
    for (int i = 0; i < 10; ++i)
      ASSERT_EQ(HttpPost(c.http_port(), "/v1/completions", CompletionBody(Prompt(i), 2)).status, 200);
    EXPECT_EQ(c.WorkerMetric("w0", "pdserve_worker_jobs_total", "finished"), 5);
    EXPECT_EQ(c.WorkerMetric("w1", "pdserve_worker_jobs_total", "finished"), 5);
  }
  {
    TestCluster c("lot");
    ASSERT_OK_C(c.StartRouter({"--colocated-policy", "least_outstanding_tokens"}), c);
    ASSERT_OK_C(c.StartWorker("w0", "colocated", {"--token-delay-us", "20000"}), c);
    ASSERT_OK_C(c.StartWorker("w1", "colocated", {"--token-delay-us", "20000"}), c);
    ASSERT_TRUE(c.WaitForWorkers(2)) << c.Logs();
    // One long request occupies a worker; the short ones all go to the other.
    std::thread long_one([&] { HttpPost(c.http_port(), "/v1/completions", CompletionBody(Prompt(0), 100)); });
    ASSERT_TRUE(WaitFor([&] {
      for (const auto& w : c.Workers())
        if (w["outstanding_tokens"].get<int64_t>() > 0) return true;
      return false;
    }, 5s));
    for (int i = 1; i <= 4; ++i)
      ASSERT_EQ(HttpPost(c.http_port(), "/v1/completions", CompletionBody(Prompt(i), 2)).status, 200);
    long_one.join();
    const double f0 = c.WorkerMetric("w0", "pdserve_worker_jobs_total", "finished");
    const double f1 = c.WorkerMetric("w1", "pdserve_worker_jobs_total", "finished");
    EXPECT_TRUE((f0 == 1 && f1 == 4) || (f0 == 4 && f1 == 1)) << f0 << " " << f1;
  }
}

TEST(RouterE2eTest, WorkerKilledMidStreamFailsOnlyItsRequests) {
  TestCluster c("kill");
  // Migration off: a killed worker's requests fail at once (worker_fault_test.cc covers migration).
  ASSERT_OK_C(c.StartRouter({"--max-migrations", "0"}), c);
  ASSERT_OK_C(c.StartWorker("w0", "colocated", {"--token-delay-us", "20000"}), c);
  ASSERT_OK_C(c.StartWorker("w1", "colocated", {"--token-delay-us", "20000"}), c);
  ASSERT_TRUE(c.WaitForWorkers(2)) << c.Logs();
  constexpr int kStreams = 8;
  std::atomic<int> started{0};
  std::atomic<int64_t> kill_time_ns{0};
  std::vector<SseReply> replies(kStreams);
  std::vector<double> error_after_kill(kStreams, -1);
  std::vector<std::thread> threads;
  for (int k = 0; k < kStreams; ++k) {
    threads.emplace_back([&, k] {
      bool first = true;
      replies[k] = HttpPostSse(c.http_port(), "/v1/completions", CompletionBody(Prompt(k), 120, true), 60s,
                               [&, k](const std::string& ev) {
                                 if (first) {
                                   first = false;
                                   ++started;
                                 }
                                 if (ev.find("\"error\"") != std::string::npos && kill_time_ns > 0)
                                   error_after_kill[k] =
                                       (Clock::now().time_since_epoch().count() - kill_time_ns.load()) / 1e9;
                                 return true;
                               });
    });
  }
  ASSERT_TRUE(WaitFor([&] { return started == kStreams; }, 10s));
  kill_time_ns = Clock::now().time_since_epoch().count();
  c.worker("w0")->Kill();
  for (auto& t : threads) t.join();
  int failed = 0, completed = 0;
  for (int k = 0; k < kStreams; ++k) {
    SCOPED_TRACE(k);
    auto sr = Collect(replies[k]);
    EXPECT_TRUE(replies[k].done);  // every stream ends properly, none hangs
    if (sr.error) {
      ++failed;
      EXPECT_GE(error_after_kill[k], 0);
      EXPECT_LT(error_after_kill[k], 4.0);  // within seconds (heartbeat timeout 1.5 s)
    } else {
      ++completed;
      EXPECT_EQ(sr.text, EchoText(Prompt(k), 120));
    }
  }
  EXPECT_EQ(failed, kStreams / 2);
  EXPECT_EQ(completed, kStreams / 2);
  // The survivor holds no leaked KV blocks; the cluster keeps serving.
  EXPECT_TRUE(WaitFor([&] {
    auto w = c.Workers();
    return w.size() == 1 && w[0]["id"] == "w1" && w[0]["kv_blocks_free"] == w[0]["kv_blocks_total"] &&
           w[0]["outstanding_tokens"] == 0;
  }, 5s)) << c.Workers().dump();
  EXPECT_EQ(HttpPost(c.http_port(), "/v1/completions", CompletionBody(Prompt(1), 3)).status, 200);
  auto m = HttpGet(c.http_port(), "/metrics").body;
  EXPECT_EQ(testing::MetricValue(m, "pdserve_router_worker_removals_total", "reason=\"timeout\""), 1);
  EXPECT_EQ(testing::MetricValue(m, "pdserve_router_requests_total", "outcome=\"error\""), kStreams / 2);
}

// A worker killed mid-stream: its requests move to the survivors and continue exactly (the echo
// worker continues a migrated job where the original left off), with stop strings, max_tokens
// and usage right across the move.
TEST(RouterE2eTest, WorkerKilledMidStreamRequestsAreMigratedExactly) {
  TestCluster c("migrate");
  ASSERT_OK_C(c.StartRouter(), c);
  for (const char* id : {"w0", "w1", "w2"})
    ASSERT_OK_C(c.StartWorker(id, "colocated", {"--token-delay-us", "20000"}), c);
  ASSERT_TRUE(c.WaitForWorkers(3)) << c.Logs();
  static const char* kWords[] = {"alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel",
                                 "india", "juliet", "kilo", "lima", "mike", "november", "oscar", "papa"};
  constexpr int kStreams = 6, kMax = 60;
  std::atomic<int> started{0};
  std::vector<SseReply> replies(kStreams);
  std::vector<std::string> stops(kStreams);
  std::vector<std::thread> threads;
  for (int k = 0; k < kStreams; ++k) {
    json body = json::parse(CompletionBody(Prompt(k), kMax, true));
    body["stream_options"] = {{"include_usage", true}};
    // Odd streams stop at the prompt's last word: it is echoed only after the kill.
    if (k % 2) body["stop"] = stops[k] = std::string(kWords[(k * 5 + 11 * 3) % 16]) + std::to_string(k);
    threads.emplace_back([&, k, b = body.dump()] {
      bool first = true;
      replies[k] = HttpPostSse(c.http_port(), "/v1/completions", b, 60s, [&](const std::string&) {
        if (first) first = false, ++started;
        return true;
      });
    });
  }
  ASSERT_TRUE(WaitFor([&] { return started == kStreams; }, 10s));
  c.worker("w0")->Kill();
  for (auto& t : threads) t.join();
  for (int k = 0; k < kStreams; ++k) {
    SCOPED_TRACE(k);
    auto sr = Collect(replies[k]);
    EXPECT_FALSE(sr.error);
    const std::string full = EchoText(Prompt(k), kMax);
    if (stops[k].empty()) {
      EXPECT_EQ(sr.text, full);
      EXPECT_EQ(sr.finish_reason, "length");
      ASSERT_FALSE(sr.usage.is_null());
      EXPECT_EQ(sr.usage["completion_tokens"].get<int>(), kMax);
    } else {
      const size_t at = full.find(stops[k]);
      ASSERT_NE(at, std::string::npos);
      EXPECT_EQ(sr.text, full.substr(0, at));
      EXPECT_EQ(sr.finish_reason, "stop");
      ASSERT_FALSE(sr.usage.is_null());
      EXPECT_LT(sr.usage["completion_tokens"].get<int>(), kMax);
    }
  }
  auto m = HttpGet(c.http_port(), "/metrics").body;
  EXPECT_GE(testing::MetricValue(m, "pdserve_router_migrations_total", "outcome=\"migrated\",role=\"colocated\""), 1);
  EXPECT_EQ(testing::MetricValue(m, "pdserve_router_requests_total", "outcome=\"ok\""), kStreams);
  EXPECT_TRUE(WaitFor([&] {
    auto w = c.Workers();
    if (w.size() != 2) return false;
    for (const auto& e : w)
      if (e["outstanding_tokens"] != 0 || e["kv_blocks_free"] != e["kv_blocks_total"]) return false;
    return true;
  }, 5s)) << c.Workers().dump();
}

// A worker that keeps heartbeating but stops producing (a wedged engine): past
// router.stall_timeout_ms its stream moves to another worker and completes exactly; the wedged
// worker gets an abort and stays registered.
TEST(RouterE2eTest, StalledStreamIsMigratedToAnotherWorker) {
  TestCluster c("stall");
  ASSERT_OK_C(c.StartRouter({"--stall-timeout-ms", "400"}), c);
  ASSERT_OK_C(c.StartWorker("w0", "colocated", {"--token-delay-us", "10000", "--stall-after", "5"}), c);
  ASSERT_OK_C(c.StartWorker("w1", "colocated", {"--token-delay-us", "10000"}), c);
  ASSERT_TRUE(c.WaitForWorkers(2)) << c.Logs();
  constexpr int kMax = 40;
  std::vector<SseReply> replies(2);
  std::vector<std::thread> threads;
  for (int k = 0; k < 2; ++k)
    threads.emplace_back([&, k] {
      json body = json::parse(CompletionBody(Prompt(20 + k), kMax, true));
      body["stream_options"] = {{"include_usage", true}};
      replies[k] = HttpPostSse(c.http_port(), "/v1/completions", body.dump(), 30s);
    });
  for (auto& t : threads) t.join();
  double longest_gap = 0;
  for (int k = 0; k < 2; ++k) {
    SCOPED_TRACE(k);
    auto sr = Collect(replies[k]);
    EXPECT_FALSE(sr.error);
    EXPECT_EQ(sr.text, EchoText(Prompt(20 + k), kMax));
    ASSERT_FALSE(sr.usage.is_null());
    EXPECT_EQ(sr.usage["completion_tokens"].get<int>(), kMax);
    for (size_t i = 1; i < replies[k].arrival_seconds.size(); ++i)
      longest_gap = std::max(longest_gap, replies[k].arrival_seconds[i] - replies[k].arrival_seconds[i - 1]);
  }
  EXPECT_GE(longest_gap, 0.35);  // the stall timeout, then the move
  EXPECT_LT(longest_gap, 2.0);
  auto m = HttpGet(c.http_port(), "/metrics").body;
  EXPECT_EQ(testing::MetricValue(m, "pdserve_router_migrations_total", "outcome=\"migrated\",role=\"colocated\""), 1);
  EXPECT_TRUE(WaitFor([&] { return c.WorkerMetric("w0", "pdserve_worker_jobs_total", "aborted") == 1; }, 3s));
  EXPECT_EQ(c.Workers().size(), 2u);
}

// The whole-request deadline bounds a stream that is still producing: an error event at
// router.request_timeout_ms, the worker's job aborted (its blocks back).
TEST(RouterE2eTest, RequestDeadlineEndsARunningStream) {
  TestCluster c("deadline");
  ASSERT_OK_C(c.StartRouter({"--request-timeout-ms", "700"}), c);
  ASSERT_OK_C(c.StartWorker("w0", "colocated", {"--token-delay-us", "20000"}), c);
  ASSERT_TRUE(c.WaitForWorkers(1)) << c.Logs();
  const auto t0 = Clock::now();
  auto reply = HttpPostSse(c.http_port(), "/v1/completions", CompletionBody(Prompt(3), 1000, true), 30s);
  const double took = std::chrono::duration<double>(Clock::now() - t0).count();
  auto sr = Collect(reply);
  EXPECT_TRUE(sr.error);
  EXPECT_TRUE(reply.done);
  EXPECT_GT(sr.text.size(), 0u);  // it was streaming when the deadline came
  EXPECT_GE(took, 0.6);
  EXPECT_LT(took, 3.0);
  EXPECT_TRUE(WaitFor([&] { return c.WorkerMetric("w0", "pdserve_worker_jobs_total", "aborted") == 1; }, 3s));
  EXPECT_TRUE(WaitFor([&] {
    auto w = c.Workers();
    return w.size() == 1 && w[0]["kv_blocks_free"] == w[0]["kv_blocks_total"] && w[0]["outstanding_requests"] == 0;
  }, 3s)) << c.Workers().dump();
}

// A request whose worker keeps dying is migrated up to router.max_migrations times, then ends
// with a prompt error event; the survivors keep no charge for it.
TEST(RouterE2eTest, MigrationLimitEndsTheStreamWithAnError) {
  TestCluster c("migrate-limit");
  ASSERT_OK_C(c.StartRouter({"--max-migrations", "1"}), c);
  for (const char* id : {"w0", "w1", "w2"})
    ASSERT_OK_C(c.StartWorker(id, "colocated", {"--token-delay-us", "20000"}), c);
  ASSERT_TRUE(c.WaitForWorkers(3)) << c.Logs();
  // The worker that holds the request now (the router charges it until the request ends).
  auto holder = [&]() -> std::string {
    for (const auto& w : c.Workers())
      if (w["outstanding_requests"].get<int64_t>() == 1) return w["id"].get<std::string>();
    return "";
  };
  std::atomic<int> events{0};
  std::atomic<int64_t> error_ns{0};
  SseReply reply;
  std::thread stream([&] {
    reply = HttpPostSse(c.http_port(), "/v1/completions", CompletionBody(Prompt(7), 2000, true), 60s,
                        [&](const std::string& ev) {
                          ++events;
                          if (ev.find("\"error\"") != std::string::npos) error_ns = Clock::now().time_since_epoch().count();
                          return true;
                        });
  });
  ASSERT_TRUE(WaitFor([&] { return events > 0 && !holder().empty(); }, 10s)) << c.Logs();
  const std::string first = holder();
  c.worker(first)->Kill();
  // Migrated: another worker holds it and tokens keep coming.
  std::string second;
  ASSERT_TRUE(WaitFor([&] {
    second = holder();
    return !second.empty() && second != first && c.Workers().size() == 2;
  }, 5s)) << c.Logs();
  const int before = events.load();
  ASSERT_TRUE(WaitFor([&] { return events > before + 3; }, 5s));
  const auto killed = Clock::now();
  c.worker(second)->Kill();
  stream.join();
  EXPECT_TRUE(reply.done);
  ASSERT_GT(error_ns.load(), 0) << "no error event";
  const double error_after = (error_ns.load() - killed.time_since_epoch().count()) / 1e9;
  EXPECT_LT(error_after, 3.0);  // the heartbeat timeout (0.8 s), not the request timeout
  std::string error_event;
  for (const auto& e : reply.events)
    if (e.find("\"error\"") != std::string::npos) error_event = e;
  EXPECT_NE(error_event.find("after 1 migrations"), std::string::npos) << error_event;
  auto m = HttpGet(c.http_port(), "/metrics").body;
  EXPECT_EQ(testing::MetricValue(m, "pdserve_router_migrations_total", "outcome=\"migrated\""), 1);
  EXPECT_EQ(testing::MetricValue(m, "pdserve_router_migrations_total", "outcome=\"limit\""), 1);
  EXPECT_TRUE(WaitFor([&] {
    auto w = c.Workers();
    return w.size() == 1 && w[0]["outstanding_requests"] == 0 && w[0]["outstanding_tokens"] == 0;
  }, 5s)) << c.Workers().dump();
}

TEST(RouterE2eTest, PrefillKilledDuringPrefillFailsFast) {
  TestCluster c("killp");
  ASSERT_OK_C(c.StartRouter(), c);
  ASSERT_OK_C(c.StartWorker("p0", "prefill", {"--prefill-us-per-token", "500000"}), c);  // 6 s for 12 tokens
  ASSERT_OK_C(c.StartWorker("d0", "decode"), c);
  ASSERT_TRUE(c.WaitForWorkers(2)) << c.Logs();
  std::atomic<int64_t> kill_time_ns{0};
  std::thread killer([&] {
    WaitFor([&] { return c.WorkerMetric("p0", "pdserve_worker_prompt_tokens_total") > 0; }, 5s);
    c.worker("p0")->Kill();
    kill_time_ns = Clock::now().time_since_epoch().count();
  });
  auto r = HttpPost(c.http_port(), "/v1/completions", CompletionBody(Prompt(1), 5));
  const int64_t answered_ns = Clock::now().time_since_epoch().count();
  killer.join();
  EXPECT_EQ(r.status, 503) << r.body;
  // Fast: the answer comes a heartbeat timeout (1.5 s) after the kill, long before the 6 s the
  // prefill would have taken. Measured from the kill, so a loaded machine's slow start of the
  // request does not count.
  ASSERT_GT(kill_time_ns.load(), 0);
  EXPECT_LT((answered_ns - kill_time_ns.load()) / 1e9, 4.0);
  EXPECT_NE(json::parse(r.body)["error"]["message"].get<std::string>().find("prefill worker p0"), std::string::npos);
  EXPECT_TRUE(WaitFor([&] {
    auto w = c.Workers();
    return w.size() == 1 && w[0]["kv_blocks_free"] == w[0]["kv_blocks_total"];
  }, 5s)) << c.Workers().dump();
}

TEST(RouterE2eTest, WorkerBeforeAndAfterRouterAndRouterRestart) {
  TestCluster c("restart");
  const int control_port = services::testing::FreeTcpPort();
  ASSERT_OK_C(c.StartRouter({}, control_port), c);
  // No workers yet: not ready, requests get 503.
  EXPECT_EQ(HttpGet(c.http_port(), "/health").status, 503);
  auto r = HttpPost(c.http_port(), "/v1/completions", CompletionBody(Prompt(1), 2));
  EXPECT_EQ(r.status, 503);
  EXPECT_EQ(json::parse(r.body)["error"]["code"], "no_workers");
  // A worker registering after the router.
  ASSERT_OK_C(c.StartWorker("w0"), c);
  ASSERT_TRUE(c.WaitForWorkers(1)) << c.Logs();
  EXPECT_EQ(HttpPost(c.http_port(), "/v1/completions", CompletionBody(Prompt(1), 2)).status, 200);
  // The router dies and comes back on the same control port: the worker registers again.
  c.KillRouter();
  ASSERT_OK_C(c.StartRouter({}, control_port), c);
  ASSERT_TRUE(c.WaitForWorkers(1)) << c.Logs();
  EXPECT_EQ(HttpPost(c.http_port(), "/v1/completions", CompletionBody(Prompt(2), 3)).status, 200);
  EXPECT_GE(c.WorkerMetric("w0", "pdserve_worker_registrations_total"), 2);
  // A worker started while no router runs registers once it appears.
  c.KillRouter();
  ASSERT_OK_C(c.StartWorker("w1"), c);
  ASSERT_OK_C(c.StartRouter({}, control_port), c);
  ASSERT_TRUE(c.WaitForWorkers(2)) << c.Logs();
}

TEST(RouterE2eTest, HeartbeatLossRemovesWorkerAndFailsItsRequests) {
  TestCluster c("hb");
  ASSERT_OK_C(c.StartRouter(), c);
  ASSERT_OK_C(c.StartWorker("w0", "colocated", {"--token-delay-us", "20000"}), c);
  ASSERT_TRUE(c.WaitForWorkers(1)) << c.Logs();
  std::atomic<bool> first{false};
  // jthread: a failed ASSERT below returns with the stream still open; joining (the stream
  // ends by its own timeout at worst) beats std::terminate on a joinable std::thread.
  std::jthread stream([&] {
    auto s = HttpPostSse(c.http_port(), "/v1/completions", CompletionBody(Prompt(1), 200, true), 30s,
                         [&](const std::string&) {
                           first = true;
                           return true;
                         });
    EXPECT_TRUE(Collect(s).error);
    EXPECT_TRUE(s.done);
  });
  ASSERT_TRUE(WaitFor([&] { return first.load(); }, 5s));
  const auto t0 = Clock::now();
  c.worker("w0")->Signal(SIGSTOP);  // alive but silent
  ASSERT_TRUE(c.WaitForWorkers(0, 5s)) << c.Logs();
  EXPECT_LT(Clock::now() - t0, 4s);  // heartbeat timeout 1.5 s
  EXPECT_EQ(HttpGet(c.http_port(), "/health").status, 503);
  stream.join();
  c.worker("w0")->Signal(SIGCONT);  // hears "unknown worker", aborts its stale job, registers again
  ASSERT_TRUE(c.WaitForWorkers(1)) << c.Logs();
  EXPECT_EQ(HttpPost(c.http_port(), "/v1/completions", CompletionBody(Prompt(1), 2)).status, 200);
  EXPECT_TRUE(WaitFor([&] { return c.WorkerMetric("w0", "pdserve_worker_jobs_total", "aborted") == 1; }, 5s));
}

TEST(RouterE2eTest, BadInputGetsOpenAiErrorsAndTheClusterKeepsServing) {
  TestCluster c("bad");
  ASSERT_OK_C(c.StartRouter({"--max-body-bytes", "1048576"}), c);
  ASSERT_OK_C(c.StartWorker("w0", "colocated", {"--max-context", "64"}), c);
  ASSERT_TRUE(c.WaitForWorkers(1)) << c.Logs();
  struct Case {
    const char* path;
    std::string body;
    int status;
    const char* param;
    const char* code;
  };
  std::vector<int32_t> long_prompt(100, 1000);
  const std::vector<Case> cases = {
      {"/v1/chat/completions", "{\"model\": \"pdserve\", \"messages\": [", 400, "", ""},
      {"/v1/chat/completions", "not json at all", 400, "", ""},
      {"/v1/chat/completions", R"({"model":"pdserve","messages":"hi"})", 400, "messages", ""},
      {"/v1/chat/completions", R"({"model":"pdserve","messages":[{"role":"user","content":"x"}],"max_tokens":"ten"})", 400, "max_tokens", ""},
      {"/v1/chat/completions", R"({"model":"pdserve","messages":[{"role":"user","content":"x"}],"temperature":[1]})", 400, "temperature", ""},
      {"/v1/chat/completions", R"({"model":"pdserve"})", 400, "messages", ""},
      {"/v1/completions", R"({"model":"pdserve"})", 400, "prompt", ""},
      {"/v1/completions", R"({"prompt":"x"})", 400, "model", ""},
      {"/v1/completions", R"({"model":"gpt-9","prompt":"x"})", 404, "", "model_not_found"},
      {"/v1/completions", json{{"model", "pdserve"}, {"prompt", long_prompt}}.dump(), 400, "prompt", "context_length_exceeded"},
      {"/v1/completions", R"({"model":"pdserve","prompt":[1,2,3],"max_tokens":100})", 400, "prompt", "context_length_exceeded"},
      {"/v1/completions", R"({"model":"pdserve","prompt":[999999999]})", 400, "prompt", ""},
      {"/v1/completions", R"({"model":"pdserve","prompt":"x","n":17})", 400, "n", ""},
      {"/v1/chat/completions", R"({"model":"pdserve","messages":[{"role":"user","content":"x"}],"n":0,"stream":true})", 400, "n", ""},
      {"/v1/chat/completions", R"({"model":"pdserve","messages":[{"role":"user","content":"x"}],"response_format":{"type":"json_schema","json_schema":{"schema":{"type":"object","minProperties":1}}}})", 400, "response_format", ""},
      {"/v1/chat/completions", R"({"model":"pdserve","messages":[{"role":"user","content":"x"}],"tools":[{"type":"function","function":{"name":"f","parameters":{"if":{}}}}]})", 400, "tools", ""},
      {"/v1/completions", R"({"model":"pdserve","prompt":"x","logit_bias":{"999999999":3}})", 400, "logit_bias", ""},
      {"/v1/nope", "{}", 404, "", ""},
  };
  for (const auto& k : cases) {
    SCOPED_TRACE(k.body.substr(0, 80));
    auto r = HttpPost(c.http_port(), k.path, k.body);
    ASSERT_EQ(r.status, k.status) << r.body;
    json j = json::parse(r.body);
    ASSERT_TRUE(j["error"].is_object()) << r.body;
    EXPECT_TRUE(j["error"]["message"].is_string());
    EXPECT_TRUE(j["error"]["type"].is_string());
    EXPECT_EQ(j["error"]["param"].is_null() ? "" : j["error"]["param"].get<std::string>(), k.param);
    EXPECT_EQ(j["error"]["code"].is_null() ? "" : j["error"]["code"].get<std::string>(), k.code);
  }
  // A 100 MB body: 413, and the router survives.
  std::string huge = "{\"model\":\"pdserve\",\"prompt\":\"" + std::string(100u << 20, 'a') + "\"}";
  auto r = HttpPost(c.http_port(), "/v1/completions", huge, 60s);
  EXPECT_EQ(r.status, 413) << r.error;
  EXPECT_EQ(json::parse(r.body)["error"]["code"], "request_too_large");
  auto ok = HttpPost(c.http_port(), "/v1/completions", CompletionBody(Prompt(1), 5));
  ASSERT_EQ(ok.status, 200) << ok.body;
  EXPECT_EQ(json::parse(ok.body)["choices"][0]["text"], EchoText(Prompt(1), 5));
  auto m = HttpGet(c.http_port(), "/metrics").body;
  EXPECT_GE(testing::MetricValue(m, "pdserve_router_requests_total", "outcome=\"client_error\""), 14);
}

TEST(RouterE2eTest, ClientDisconnectAbortsTheWorkerJob) {
  TestCluster c("disconnect");
  ASSERT_OK_C(c.StartRouter(), c);
  ASSERT_OK_C(c.StartWorker("w0", "colocated", {"--token-delay-us", "20000"}), c);
  ASSERT_TRUE(c.WaitForWorkers(1)) << c.Logs();
  // Streaming: hang up after the first event.
  auto s = HttpPostSse(c.http_port(), "/v1/completions", CompletionBody(Prompt(1), 500, true), 10s,
                       [](const std::string&) { return false; });
  EXPECT_TRUE(s.cancelled);
  EXPECT_TRUE(WaitFor([&] { return c.WorkerMetric("w0", "pdserve_worker_jobs_total", "aborted") == 1; }, 3s));
  // Non-streaming: the client sends the request and goes away while the worker generates.
  {
    services::testing::RawHttpConnection conn(c.http_port());
    const std::string body = CompletionBody(Prompt(2), 500);
    ASSERT_TRUE(conn.SendAll("POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                             "Content-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body));
    ASSERT_TRUE(WaitFor([&] {
      auto w = c.Workers();
      return !w.empty() && w[0]["outstanding_requests"] == 1;
    }, 5s));
  }
  EXPECT_TRUE(WaitFor([&] { return c.WorkerMetric("w0", "pdserve_worker_jobs_total", "aborted") == 2; }, 3s));
  EXPECT_TRUE(WaitFor([&] {
    auto m = HttpGet(c.http_port(), "/metrics").body;
    return testing::MetricValue(m, "pdserve_router_requests_total", "outcome=\"cancelled\"") == 2;
  }, 3s));
}

TEST(RouterE2eTest, SaturationTimeoutsAndDrain) {
  TestCluster c("sat");
  ASSERT_OK_C(c.StartRouter({"--first-token-timeout-ms", "400"}), c);
  ASSERT_OK_C(c.StartWorker("w0", "colocated", {"--max-batch", "1", "--token-delay-us", "20000"}), c);
  ASSERT_TRUE(c.WaitForWorkers(1)) << c.Logs();
  // The one slot is taken: the worker refuses the second job -> 429.
  auto outstanding = [&] {
    auto w = c.Workers();
    return w.empty() ? -1 : w[0]["outstanding_requests"].get<int64_t>();
  };
  std::thread busy([&] { HttpPost(c.http_port(), "/v1/completions", CompletionBody(Prompt(1), 60)); });
  ASSERT_TRUE(WaitFor([&] { return outstanding() == 1; }, 5s));
  auto r = HttpPost(c.http_port(), "/v1/completions", CompletionBody(Prompt(2), 2));
  EXPECT_EQ(r.status, 429) << r.body;
  EXPECT_EQ(json::parse(r.body)["error"]["type"], "rate_limit_error");
  EXPECT_EQ(r.headers["Retry-After"], "1");  // router.retry_after_s
  busy.join();
  // Drain: the worker finishes what it runs, deregisters and exits 0.
  std::thread running([&] {
    auto rr = HttpPost(c.http_port(), "/v1/completions", CompletionBody(Prompt(3), 30));
    EXPECT_EQ(rr.status, 200) << rr.body;
    EXPECT_EQ(json::parse(rr.body)["choices"][0]["text"], EchoText(Prompt(3), 30));
  });
  ASSERT_TRUE(WaitFor([&] { return outstanding() == 1; }, 5s));
  r = HttpPost(c.http_port(), "/admin/drain", R"({"worker_id":"w0"})");
  EXPECT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(HttpPost(c.http_port(), "/v1/completions", CompletionBody(Prompt(4), 2)).status, 503);
  running.join();
  EXPECT_EQ(c.worker("w0")->WaitExit(10s), std::optional<int>(0)) << c.Logs();
  EXPECT_TRUE(c.WaitForWorkers(0, 3s));
  // First-token deadline: a slow prefill gets 504 and the job is aborted.
  ASSERT_OK_C(c.StartWorker("w1", "colocated", {"--prefill-us-per-token", "200000"}), c);
  ASSERT_TRUE(c.WaitForWorkers(1)) << c.Logs();
  const auto t0 = Clock::now();
  r = HttpPost(c.http_port(), "/v1/completions", CompletionBody(Prompt(5), 2));
  EXPECT_EQ(r.status, 504) << r.body;
  EXPECT_LT(Clock::now() - t0, 2s);
  EXPECT_TRUE(WaitFor([&] { return c.WorkerMetric("w1", "pdserve_worker_jobs_total", "aborted") == 1; }, 3s));
}

// Streams hold their connection's HTTP thread to the last token. With 2 threads kept ready and
// 4 streams open, the router starts more threads: /metrics, /health and a new request answer at
// once instead of waiting behind the streams (a fixed pool of 2 made them wait for a stream's
// end, ~2 s here).
TEST(RouterE2eTest, ScrapesAndNewRequestsAnswerWhileStreamsHoldEveryReadyThread) {
  TestCluster c("threads");
  ASSERT_OK_C(c.StartRouter({"--http-threads", "2"}), c);
  ASSERT_OK_C(c.StartWorker("w0", "colocated", {"--max-batch", "8", "--token-delay-us", "20000"}), c);
  ASSERT_TRUE(c.WaitForWorkers(1)) << c.Logs();
  auto outstanding = [&] {
    auto w = c.Workers();
    return w.empty() ? -1 : w[0]["outstanding_requests"].get<int64_t>();
  };
  std::atomic<int> streamed_ok{0};
  // jthreads: a failed assertion below joins them (their streams end within 30 s) before the
  // cluster stops; a joinable std::thread would terminate the test and leave the processes.
  std::vector<std::jthread> streams;
  for (int k = 0; k < 4; ++k)
    streams.emplace_back([&, k] {
      const SseReply r = HttpPostSse(c.http_port(), "/v1/completions", CompletionBody(Prompt(10 + k), 100, true), 30s);
      if (r.status == 200 && r.done) ++streamed_ok;
    });
  ASSERT_TRUE(WaitFor([&] { return outstanding() == 4; }, 10s)) << c.Logs();
  const auto t0 = Clock::now();
  const auto metrics = HttpGet(c.http_port(), "/metrics", 5s);
  const auto health = HttpGet(c.http_port(), "/health", 5s);
  const auto reply = HttpPost(c.http_port(), "/v1/completions", CompletionBody(Prompt(20), 2));
  const auto waited = Clock::now() - t0;
  EXPECT_EQ(metrics.status, 200);
  EXPECT_NE(metrics.body.find("pdserve_router_requests_total"), std::string::npos);
  EXPECT_EQ(health.status, 200);
  EXPECT_EQ(reply.status, 200) << reply.body;
  EXPECT_EQ(outstanding(), 4) << "the streams ended before the check: it proved nothing";
  EXPECT_LT(waited, 1s) << "the scrape, the health check and the request waited behind the streams";
  streams.clear();  // joins
  EXPECT_EQ(streamed_ok, 4);
}

TEST(RouterE2eTest, InProcessRouterServer) {
  RouterConfig config;
  config.port = 0;
  config.control_endpoint = "tcp://127.0.0.1:*";
  config.heartbeat_interval = 100ms;
  config.heartbeat_timeout = 800ms;
  auto server = RouterServer::Start(config);
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  const std::string dir = services::testing::MakeTempDir("pdserve-inproc");
  auto worker = services::testing::ChildProcess::Spawn(
      {std::string(PDSERVE_BIN_DIR) + "/pdserve-echo-worker", "--router", (*server)->control_endpoint(), "--worker-id",
       "w0", "--register-retry-ms", "50", "--token-delay-us", "5000"},
      dir + "/w0.log");
  ASSERT_TRUE(worker.ok());
  ASSERT_TRUE(WaitFor([&] { return (*server)->core().Health().ready; }, 10s)) << (*worker)->Log();
  auto r = HttpPost((*server)->http_port(), "/v1/completions", CompletionBody(Prompt(7), 6));
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(json::parse(r.body)["choices"][0]["text"], EchoText(Prompt(7), 6));
  // Shutting the server down while a stream is open ends the stream with an error, promptly.
  std::thread stream([&] {
    auto s = HttpPostSse((*server)->http_port(), "/v1/completions", CompletionBody(Prompt(7), 8000, true), 20s);
    EXPECT_TRUE(s.done || !s.error.empty());
  });
  ASSERT_TRUE(WaitFor([&] { return (*server)->core().outstanding() == 1; }, 5s));
  const auto t0 = Clock::now();
  server->reset();
  EXPECT_LT(Clock::now() - t0, 3s);
  stream.join();
}

}  // namespace
}  // namespace pdserve::router
