// End-to-end tests of the router's ZeroMQ request API (request_api_server.h) with the client
// library (services/client/request_client.h): a real pdserve-router process serving HTTP and
// ZeroMQ side by side, real pdserve-echo-worker processes (echo_engine.h: token i of a reply is
// prompt[i % n], so every output is known), loopback sockets. Also GET /v1/workers and the
// placement metrics.
#include <atomic>
#include <fstream>
#include <thread>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "services/client/request_client.h"
#include "services/common/curve_keys.h"
#include "services/request_api/request_api_codec.h"
#include "services/testing/cluster_fixture.h"
#include "services/router/router_server.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/tokenizer_paths.h"

namespace pdserve::router {
namespace {

using namespace std::chrono_literals;
using nlohmann::json;
using services::testing::HttpGet;
using services::testing::HttpPost;
using services::testing::WaitFor;
using testing::TestCluster;
namespace api = services::api;
using client::RequestClient;

const tokenizer::Tokenizer& Tok() {
  static const auto* tok = tokenizer::Tokenizer::Load(tokenizer::DefaultTokenizerDir()).value().release();
  return *tok;
}

// English words: no EOS inside, so only max_tokens (or a stop) ends the echo.
std::vector<int32_t> Prompt(int k, int n = 12) {
  static const char* kWords[] = {"alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel",
                                 "india", "juliet", "kilo", "lima", "mike", "november", "oscar", "papa"};
  std::string text;
  for (int i = 0; i < n; ++i) text += std::string(i ? " " : "") + kWords[(k * 5 + i * 3) % 16] + std::to_string(k);
  return Tok().Encode(text, {false, true}).value();
}

#define ASSERT_OK_C(expr, cluster)                                     \
  do {                                                                 \
    Status s_ = (expr);                                                \
    ASSERT_TRUE(s_.ok()) << s_.ToString() << "\n" << (cluster).Logs(); \
  } while (0)

std::unique_ptr<RequestClient> Connect(const TestCluster& c, client::ClientOptions options = {}) {
  options.timeout = std::chrono::milliseconds(10000);
  auto client = RequestClient::Connect(c.request_endpoint(), options);
  EXPECT_TRUE(client.ok()) << client.status().ToString();
  return client.ok() ? std::move(client).value() : nullptr;
}

double RouterMetric(const TestCluster& c, const std::string& name, const std::string& label = "") {
  return testing::MetricValue(HttpGet(c.http_port(), "/metrics").body, name, label);
}

// One request in both forms: an OpenAI JSON body and the equivalent submission.
struct Pair {
  std::string path;
  json body;
  api::Submit submit;
};

std::vector<Pair> SameRequests() {
  std::vector<Pair> out;
  const auto p = Prompt(1);
  {
    Pair x{"/v1/completions", {{"model", "pdserve"}, {"prompt", p}, {"max_tokens", 20}, {"temperature", 0}}, {}};
    x.submit.model = "pdserve";
    x.submit.prompt_ids = p;
    x.submit.sampling.max_tokens = 20;
    x.submit.sampling.temperature = 0;
    out.push_back(x);
  }
  {
    Pair x{"/v1/completions", {{"model", "pdserve"}, {"prompt", "The quick brown fox"}, {"max_tokens", 7}}, {}};
    x.submit.model = "pdserve";
    x.submit.kind = api::PromptKind::kText;
    x.submit.prompt_text = "The quick brown fox";
    x.submit.sampling.max_tokens = 7;
    out.push_back(x);
  }
  {
    Pair x{"/v1/chat/completions",
           {{"model", "pdserve"},
            {"messages", {{{"role", "system"}, {"content", "Be brief."}}, {{"role", "user"}, {"content", "Hello, how are you?"}}}},
            {"max_tokens", 11},
            {"thinking", false}},
           {}};
    x.submit.model = "pdserve";
    x.submit.kind = api::PromptKind::kChat;
    x.submit.messages = {{"system", "Be brief.", {}}, {"user", "Hello, how are you?", {}}};
    x.submit.thinking = false;
    x.submit.sampling.max_tokens = 11;
    out.push_back(x);
  }
  {
    // A stop string inside the echoed text: the reply ends before it.
    const std::string full = Tok().Decode(std::vector<int32_t>(p.begin(), p.end()), {true}).value();
    const std::string stop = full.substr(full.find(' ', 5), 3);
    Pair x{"/v1/completions", {{"model", "pdserve"}, {"prompt", p}, {"max_tokens", 24}, {"stop", stop}}, {}};
    x.submit.model = "pdserve";
    x.submit.prompt_ids = p;
    x.submit.sampling.max_tokens = 24;
    x.submit.stop = {stop};
    out.push_back(x);
  }
  {
    // A stop token: counted in usage, not rendered.
    Pair x{"/v1/completions", {{"model", "pdserve"}, {"prompt", p}, {"max_tokens", 24}, {"stop_token_ids", {p[3]}}}, {}};
    x.submit.model = "pdserve";
    x.submit.prompt_ids = p;
    x.submit.sampling.max_tokens = 24;
    x.submit.stop_token_ids = {p[3]};
    out.push_back(x);
  }
  {
    const auto q = Prompt(2, 40);
    Pair x{"/v1/completions",
           {{"model", "pdserve"}, {"prompt", q}, {"max_tokens", 90}, {"seed", 7}, {"top_k", 5}, {"top_p", 0.9}},
           {}};
    x.submit.model = "pdserve";
    x.submit.prompt_ids = q;
    x.submit.sampling.max_tokens = 90;
    x.submit.sampling.seed = 7;
    x.submit.sampling.top_k = 5;
    x.submit.sampling.top_p = 0.9;
    out.push_back(x);
  }
  return out;
}

void ExpectSameAsHttp(const TestCluster& c, RequestClient& client, const Pair& x) {
  SCOPED_TRACE(x.body.dump().substr(0, 120));
  auto r = HttpPost(c.http_port(), x.path, x.body.dump());
  ASSERT_EQ(r.status, 200) << r.body;
  const json j = json::parse(r.body);
  const json& choice = j["choices"][0];
  const std::string http_text =
      choice.contains("message") ? choice["message"]["content"].get<std::string>() : choice["text"].get<std::string>();
  size_t events = 0;
  std::string streamed;
  auto done = client.Generate(x.submit, [&](const api::Output& o) {
    ++events;
    streamed += o.text;
    return true;
  });
  ASSERT_TRUE(done.ok()) << done.status().ToString() << "\n" << c.Logs();
  EXPECT_EQ(done->text, http_text);
  EXPECT_EQ(streamed, http_text);
  EXPECT_EQ(FinishReasonName(done->finish), choice["finish_reason"].get<std::string>());
  EXPECT_EQ(done->prompt_tokens, j["usage"]["prompt_tokens"].get<uint32_t>());
  EXPECT_EQ(done->completion_tokens, j["usage"]["completion_tokens"].get<uint32_t>());
  // Token ids and text agree (a stop string may end the text inside the last token).
  EXPECT_EQ(Tok().Decode(done->tokens, {true}).value().substr(0, http_text.size()), http_text);
  EXPECT_TRUE(done->tag.rfind(choice.contains("message") ? "chatcmpl-" : "cmpl-", 0) == 0) << done->tag;
  EXPECT_GE(events, 1u);
}

TEST(RequestApiE2eTest, ServesTheSameRequestsAsHttpWithIdenticalOutputs) {
  TestCluster c("zmq-same");
  ASSERT_OK_C(c.StartRouter({"--request-endpoint", "tcp://127.0.0.1:*"}), c);
  ASSERT_FALSE(c.request_endpoint().empty());
  ASSERT_OK_C(c.StartWorker("w0"), c);
  ASSERT_TRUE(c.WaitForWorkers(1)) << c.Logs();
  auto client = Connect(c);
  ASSERT_TRUE(client);
  ASSERT_TRUE(client->Ping(5s).ok());
  const auto pairs = SameRequests();
  for (const auto& x : pairs) ExpectSameAsHttp(c, *client, x);
  // The echo is exact: token ids of a token-id prompt come back cyclically.
  auto done = client->Generate(pairs[0].submit);
  ASSERT_TRUE(done.ok());
  ASSERT_EQ(done->tokens.size(), 20u);
  for (size_t i = 0; i < 20; ++i) EXPECT_EQ(done->tokens[i], pairs[0].submit.prompt_ids[i % pairs[0].submit.prompt_ids.size()]);
  // Logprobs travel with the token ids (the echo worker's synthetic values).
  api::Submit lp = pairs[0].submit;
  lp.logprobs = true;
  lp.top_logprobs = 2;
  std::vector<services::TokenLogprob> got;
  ASSERT_TRUE(client->Generate(lp, [&](const api::Output& o) {
                      got.insert(got.end(), o.logprobs.begin(), o.logprobs.end());
                      return true;
                    }).ok());
  ASSERT_EQ(got.size(), 20u);
  EXPECT_FLOAT_EQ(got[1].logprob, -0.5f);
  EXPECT_EQ(got[1].top.size(), 2u);

  // Concurrent clients (one per thread), mixed with HTTP: every reply exact.
  std::vector<std::thread> threads;
  std::atomic<int> ok{0};
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      auto cl = RequestClient::Connect(c.request_endpoint()).value();
      for (int k = 0; k < 5; ++k) {
        api::Submit s;
        s.model = "pdserve";
        s.prompt_ids = Prompt(t * 10 + k);
        s.sampling.max_tokens = 16;
        auto d = cl->Generate(s);
        if (d.ok() && d->tokens.size() == 16 && d->tokens[15] == s.prompt_ids[15 % s.prompt_ids.size()]) ++ok;
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(ok.load(), 40);
  // Both fronts feed the same metrics: 2 * 6 pairs + 2 + 40 successful requests.
  EXPECT_EQ(RouterMetric(c, "pdserve_router_requests_total", "outcome=\"ok\""), 2 * 6 + 2 + 40);
  EXPECT_EQ(RouterMetric(c, "pdserve_router_running_requests"), 0);
  EXPECT_EQ(RouterMetric(c, "pdserve_router_waiting_requests"), 0);
  EXPECT_EQ(testing::PromtoolProblems(HttpGet(c.http_port(), "/metrics").body), "");
}

TEST(RequestApiE2eTest, AbortAndDisconnectFreeEverything) {
  TestCluster c("zmq-abort");
  ASSERT_OK_C(c.StartRouter({"--request-endpoint", "tcp://127.0.0.1:*", "--request-keepalive-ms", "100"}), c);
  // 20 ms per output token: requests stream long enough to be aborted mid-way.
  ASSERT_OK_C(c.StartWorker("w0", "colocated", {"--token-delay-us", "20000", "--kv-blocks", "256", "--block-tokens", "16"}),
              c);
  ASSERT_TRUE(c.WaitForWorkers(1)) << c.Logs();
  auto aborted = [&](const std::string& w) { return c.WorkerMetric(w, "pdserve_worker_jobs_total", "aborted"); };
  auto all_free = [&](const std::string& w) {
    return c.WorkerMetric(w, "pdserve_worker_kv_blocks", "state=\"used\"") == 0 &&
           c.WorkerMetric(w, "pdserve_worker_running_requests") == 0;
  };

  // 1. Abort through the API after the first output.
  {
    auto client = Connect(c);
    ASSERT_TRUE(client);
    api::Submit s;
    s.model = "pdserve";
    s.prompt_ids = Prompt(1);
    s.sampling.max_tokens = 500;
    int outputs = 0;
    auto done = client->Generate(s, [&](const api::Output&) { return ++outputs < 2; });
    ASSERT_TRUE(done.ok()) << done.status().ToString();
    EXPECT_EQ(done->finish, FinishReason::kAbort);
    EXPECT_LT(done->completion_tokens, 500u);
    EXPECT_TRUE(WaitFor([&] { return aborted("w0") == 1; }, 3s)) << c.Logs();
    // The same client keeps working after an abort.
    s.sampling.max_tokens = 3;
    auto again = client->Generate(s);
    ASSERT_TRUE(again.ok()) << again.status().ToString();
    EXPECT_EQ(again->tokens.size(), 3u);
  }
  // 2. The client disappears mid-stream (socket closed): aborted on the worker.
  {
    auto client = Connect(c);
    ASSERT_TRUE(client);
    api::Submit s;
    s.model = "pdserve";
    s.request_id = 42;
    s.prompt_ids = Prompt(2);
    s.sampling.max_tokens = 500;
    ASSERT_TRUE(client->Send(s).ok());
    bool got_output = false;
    for (int i = 0; i < 20 && !got_output; ++i) {
      auto m = client->Receive(5s);
      ASSERT_TRUE(m.ok()) << m.status().ToString();
      got_output = std::holds_alternative<api::Output>(m.value());
    }
    ASSERT_TRUE(got_output);
  }
  EXPECT_TRUE(WaitFor([&] { return aborted("w0") == 2; }, 3s)) << c.Logs();
  EXPECT_TRUE(WaitFor([&] { return all_free("w0"); }, 3s));

  // 3. The client disappears while waiting for its first token (no output to fail on): the
  // keepalive probe notices, long before the 3 s prefill would end.
  // A worker with a slow prefill (100 ms per prompt token: 3 s for 30 tokens) replaces w0.
  ASSERT_EQ(HttpPost(c.http_port(), "/admin/drain", R"({"worker_id":"w0","timeout_ms":60000})").status, 200);
  ASSERT_TRUE(c.WaitForWorkers(0, 10s)) << c.Logs();
  ASSERT_OK_C(c.StartWorker("slow", "colocated", {"--prefill-us-per-token", "100000"}), c);
  ASSERT_TRUE(c.WaitForWorkers(1)) << c.Logs();
  const std::string worker = "slow";
  {
    auto client = Connect(c);
    ASSERT_TRUE(client);
    api::Submit s;
    s.model = "pdserve";
    s.prompt_ids = Prompt(3, 30);
    s.sampling.max_tokens = 5;
    ASSERT_TRUE(client->Send(s).ok());
    auto m = client->Receive(5s);
    ASSERT_TRUE(m.ok() && std::holds_alternative<api::Accepted>(m.value()));
    ASSERT_TRUE(WaitFor([&] { return c.WorkerMetric(worker, "pdserve_worker_running_requests") +
                                         c.WorkerMetric(worker, "pdserve_worker_waiting_requests") >= 1; }, 3s));
  }
  const auto gone = std::chrono::steady_clock::now();
  EXPECT_TRUE(WaitFor([&] { return aborted(worker) == 1; }, 2s)) << c.Logs();
  EXPECT_LT(std::chrono::steady_clock::now() - gone, 2s);
  EXPECT_TRUE(WaitFor([&] { return all_free(worker); }, 3s));
  EXPECT_TRUE(WaitFor([&] {
    return RouterMetric(c, "pdserve_router_requests_total", "outcome=\"cancelled\"") == 3;
  }, 3s));
  for (const auto& w : c.Workers()) EXPECT_EQ(w["outstanding_requests"], 0) << w.dump();
  EXPECT_EQ(RouterMetric(c, "pdserve_router_running_requests"), 0);
  EXPECT_EQ(RouterMetric(c, "pdserve_router_waiting_requests"), 0);
}

TEST(RequestApiE2eTest, MalformedMessagesGetErrorRepliesAndTheRouterKeepsServing) {
  TestCluster c("zmq-bad");
  ASSERT_OK_C(c.StartRouter({"--request-endpoint", "tcp://127.0.0.1:*", "--max-prompt-tokens", "200"}), c);
  ASSERT_OK_C(c.StartWorker("w0", "colocated", {"--max-context", "64", "--token-delay-us", "5000"}), c);
  ASSERT_TRUE(c.WaitForWorkers(1)) << c.Logs();
  auto client = Connect(c);
  ASSERT_TRUE(client);
  auto next_error = [&]() -> api::Error {
    while (true) {
      auto m = client->Receive(5s);
      if (!m.ok()) {
        ADD_FAILURE() << m.status().ToString();
        return {};
      }
      if (auto* e = std::get_if<api::Error>(&m.value())) return *e;
    }
  };
  auto still_serving = [&] {
    ASSERT_TRUE(client->Ping(5s).ok());
    api::Submit ok;
    ok.model = "pdserve";
    ok.prompt_ids = Prompt(1);
    ok.sampling.max_tokens = 3;
    auto d = client->Generate(ok);
    ASSERT_TRUE(d.ok()) << d.status().ToString();
    EXPECT_EQ(d->tokens.size(), 3u);
  };

  // Undecodable bytes.
  for (const std::string& garbage : {std::string("hello world!"), std::string(16, '\xff'), std::string(64, '\0'),
                                     std::string("\x01\x00\x00\x00\xff\xff\xff\x7f", 8)}) {
    SCOPED_TRACE(garbage.size());
    ASSERT_TRUE(client->SendRaw(garbage).ok());
    const api::Error e = next_error();
    EXPECT_EQ(e.request_id, 0u);
    EXPECT_EQ(e.http_status, 400u);
    EXPECT_EQ(e.type, "invalid_request_error");
    EXPECT_EQ(e.code, "malformed_message");
    still_serving();
  }
  // A message kind only the router sends.
  for (const api::Message& wrong : {api::Message(api::Output{7, {1, 2}, "x", {}, FinishReason::kStop, 1, 2}),
                                    api::Message(api::Accepted{7, "tag", 1, 1}), api::Message(api::Keepalive{})}) {
    ASSERT_TRUE(client->Send(wrong).ok());
    const api::Error e = next_error();
    EXPECT_EQ(e.http_status, 400u);
    EXPECT_EQ(e.code, "unexpected_message") << e.message;
    still_serving();
  }
  // Invalid submissions: the HTTP API's errors (status, type, param, code), with the request id.
  struct Case {
    std::function<void(api::Submit&)> edit;
    uint32_t status;
    std::string param, code;
    std::string message_has = "";
  };
  const std::vector<Case> cases = {
      {[](api::Submit& s) { s.sampling.temperature = 5; }, 400, "temperature", ""},
      {[](api::Submit& s) { s.sampling.top_p = 0; }, 400, "top_p", ""},
      {[](api::Submit& s) { s.sampling.max_tokens = 0; }, 400, "max_tokens", ""},
      {[](api::Submit& s) { s.sampling.repetition_penalty = -1; }, 400, "repetition_penalty", ""},
      {[](api::Submit& s) { s.sampling.temperature = std::nan(""); }, 400, "temperature", ""},
      {[](api::Submit& s) { s.model = "gpt-9"; }, 404, "", "model_not_found"},
      {[](api::Submit& s) { s.model = "pdserve "; }, 404, "", "model_not_found"},
      {[](api::Submit& s) { s.prompt_ids.clear(); }, 400, "prompt", ""},
      {[](api::Submit& s) { s.prompt_ids = {999999999}; }, 400, "prompt", ""},
      {[](api::Submit& s) { s.prompt_ids = {-4}; }, 400, "prompt", ""},
      // Longer than the worker's context (refused by the router core) and longer than
      // router.max_prompt_tokens (refused before it).
      {[](api::Submit& s) { s.prompt_ids = std::vector<int32_t>(100, 1000); }, 400, "prompt", "context_length_exceeded"},
      {[](api::Submit& s) { s.prompt_ids = std::vector<int32_t>(201, 1000); }, 400, "prompt", "context_length_exceeded",
       "router.max_prompt_tokens"},
      {[](api::Submit& s) { s.stop = {""}; }, 400, "stop", ""},
      {[](api::Submit& s) { s.top_logprobs = 3; }, 400, "top_logprobs", ""},
      {[](api::Submit& s) {
         s.kind = api::PromptKind::kChat;
         s.messages = {{"user", std::nullopt, {}}};
       },
       400, "messages", ""},
  };
  uint64_t id = 100;
  for (const auto& k : cases) {
    api::Submit s;
    s.request_id = ++id;
    s.model = "pdserve";
    s.prompt_ids = Prompt(1);
    s.sampling.max_tokens = 4;
    k.edit(s);
    SCOPED_TRACE(id);
    auto r = client->Generate(s);
    ASSERT_FALSE(r.ok());
    ASSERT_TRUE(client->last_error().has_value());
    const api::Error& e = *client->last_error();
    EXPECT_EQ(e.request_id, id);
    EXPECT_EQ(e.http_status, k.status) << e.message;
    EXPECT_EQ(e.param, k.param) << e.message;
    EXPECT_EQ(e.code, k.code) << e.message;
    EXPECT_NE(e.message.find(k.message_has), std::string::npos) << e.message;
    EXPECT_EQ(r.status().code(), k.status == 404 ? StatusCode::kNotFound : StatusCode::kInvalidArgument);
  }
  // No model at all is the model this router serves (the request API's default; `pdserve
  // client` sends none unless told).
  {
    api::Submit s;
    s.request_id = 90;
    s.prompt_ids = Prompt(1);
    s.sampling.max_tokens = 2;
    auto served = client->Generate(s);
    EXPECT_TRUE(served.ok()) << served.status().ToString();
  }
  // The same invalid values over HTTP give the same error.
  auto r = HttpPost(c.http_port(), "/v1/completions", R"({"model":"pdserve","prompt":[1,2],"temperature":5})");
  EXPECT_EQ(r.status, 400);
  EXPECT_EQ(json::parse(r.body)["error"]["param"], "temperature");
  // A request id already in flight on this connection.
  api::Submit slow;
  slow.request_id = 9;
  slow.model = "pdserve";
  slow.prompt_ids = Prompt(2, 6);
  slow.sampling.max_tokens = 30;  // 150 ms
  ASSERT_TRUE(client->Send(slow).ok());
  ASSERT_TRUE(client->Send(slow).ok());
  const api::Error dup = next_error();
  EXPECT_EQ(dup.request_id, 9u);
  EXPECT_EQ(dup.code, "duplicate_request_id");
  bool finished = false;
  while (!finished) {
    auto m = client->Receive(5s);
    ASSERT_TRUE(m.ok());
    if (auto* o = std::get_if<api::Output>(&m.value())) finished = o->finishing();
  }
  still_serving();
  EXPECT_EQ(RouterMetric(c, "pdserve_router_request_api_malformed_total"), 7);
  EXPECT_EQ(RouterMetric(c, "pdserve_router_requests_total", "outcome=\"client_error\""), cases.size() + 1 + 1);
}

// With router.api_keys_file every submit needs one of the keys: the HTTP front's 401 and
// counting, nothing dispatched, the router keeps serving. Request ids are per connection, so
// another connection (even one without a key) cannot abort a request it did not submit.
TEST(RequestApiE2eTest, ApiKeysGuardSubmitsLikeHttpAndAbortsAreScopedToTheirConnection) {
  TestCluster c("zmq-keys");
  const std::string keys = c.dir() + "/api_keys";
  std::ofstream(keys) << "# request API clients\nsk-req-one\nsk-req-two\n";
  ASSERT_OK_C(c.StartRouter({"--request-endpoint", "tcp://127.0.0.1:*", "--api-keys-file", keys}), c);
  ASSERT_OK_C(c.StartWorker("w0", "colocated", {"--token-delay-us", "5000"}), c);
  // /admin/workers needs a key now; /health is exempt.
  ASSERT_TRUE(WaitFor([&] { return HttpGet(c.http_port(), "/health", 2s).status == 200; }, 10s)) << c.Logs();
  auto client = Connect(c);
  ASSERT_TRUE(client);

  api::Submit req;
  req.model = "pdserve";
  req.prompt_ids = Prompt(3);
  req.sampling.max_tokens = 6;
  const std::vector<int32_t> expected(req.prompt_ids.begin(), req.prompt_ids.begin() + 6);
  auto served = [&](const std::string& key, RequestClient& cl) {
    req.api_key = key;
    req.request_id = 0;
    auto d = cl.Generate(req);
    ASSERT_TRUE(d.ok()) << d.status().ToString() << "\n" << c.Logs();
    EXPECT_EQ(d->tokens, expected);
    EXPECT_EQ(d->finish, FinishReason::kLength);
  };
  served("sk-req-two", *client);

  // The HTTP front's answer without a key, for comparison.
  auto http = HttpPost(c.http_port(), "/v1/completions", json{{"model", "pdserve"}, {"prompt", "hi"}}.dump());
  ASSERT_EQ(http.status, 401) << http.body;
  const json http_error = json::parse(http.body)["error"];

  // Missing, wrong, a prefix, trailing blank, the HTTP header's form: refused with the same
  // status, type and code, attributed to the submit; a later valid key on the same connection
  // is served.
  const std::vector<std::string> bad = {"", "sk-wrong", "sk-req-on", "sk-req-one ", "Bearer sk-req-one"};
  uint64_t id = 100;
  for (const std::string& key : bad) {
    SCOPED_TRACE("key '" + key + "'");
    req.api_key = key;
    req.request_id = ++id;
    auto r = client->Generate(req);
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), StatusCode::kPermissionDenied) << r.status().ToString();
    ASSERT_TRUE(client->last_error());
    const api::Error& e = *client->last_error();
    EXPECT_EQ(e.request_id, id);
    EXPECT_EQ(e.http_status, 401u);
    EXPECT_EQ(e.type, http_error["type"].get<std::string>());
    EXPECT_EQ(e.code, http_error["code"].get<std::string>());
    EXPECT_EQ(e.code, "invalid_api_key");
    EXPECT_EQ(e.message.find(key.empty() ? "sk-" : key), std::string::npos) << "the key is not echoed: " << e.message;
  }
  served("sk-req-one", *client);
  // A client configured from a key file (what `pdserve client --api-key-file` does).
  std::ofstream(c.dir() + "/my_key") << "# mine\n  sk-req-two \n\n";
  client::ClientOptions from_file;
  auto key = client::ReadApiKeyFile(c.dir() + "/my_key");
  ASSERT_TRUE(key.ok()) << key.status().ToString();
  from_file.api_key = *key;
  auto fresh = Connect(c, from_file);
  ASSERT_TRUE(fresh);
  served("", *fresh);  // the submit has none: the client's key goes in
  std::ofstream(c.dir() + "/two_keys") << "sk-a\nsk-b\n";
  EXPECT_EQ(client::ReadApiKeyFile(c.dir() + "/two_keys").status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(client::ReadApiKeyFile(c.dir() + "/none").status().code(), StatusCode::kNotFound);

  // Refusals are counted as HTTP 401s are; nothing refused reached the worker.
  EXPECT_EQ(RouterMetric(c, "pdserve_router_requests_total", "outcome=\"client_error\""), bad.size() + 1);
  EXPECT_EQ(RouterMetric(c, "pdserve_router_requests_total", "outcome=\"ok\""), 3);
  EXPECT_EQ(RouterMetric(c, "pdserve_router_placements_total", "worker=\"w0\""), 3);

  // Abort scoping: `other` (no key at all) aborts `client`'s request id; the request runs on.
  auto other = Connect(c);
  ASSERT_TRUE(other);
  api::Submit longer = req;
  longer.api_key = "sk-req-one";
  longer.request_id = 7;
  longer.sampling.max_tokens = 40;  // 5 ms a token: ~200 ms, time for the abort to land
  ASSERT_TRUE(client->Send(longer).ok());
  bool accepted = false;
  while (!accepted) {
    auto m = client->Receive(5s);
    ASSERT_TRUE(m.ok()) << m.status().ToString();
    ASSERT_FALSE(std::holds_alternative<api::Error>(m.value())) << client->last_error()->message;
    accepted = std::holds_alternative<api::Accepted>(m.value());
  }
  ASSERT_TRUE(other->Send(api::Abort{7, "not yours"}).ok());
  ASSERT_TRUE(other->Ping(5s).ok());  // the router has handled the abort (one thread, in order)
  uint32_t tokens = 0;
  FinishReason finish = FinishReason::kNone;
  while (finish == FinishReason::kNone) {
    auto m = client->Receive(5s);
    ASSERT_TRUE(m.ok()) << m.status().ToString();
    ASSERT_FALSE(std::holds_alternative<api::Error>(m.value())) << client->last_error()->message;
    if (auto* o = std::get_if<api::Output>(&m.value())) {
      tokens += static_cast<uint32_t>(o->tokens.size());
      finish = o->finish;
    }
  }
  EXPECT_EQ(finish, FinishReason::kLength);
  EXPECT_EQ(tokens, 40u);
  EXPECT_LE(RouterMetric(c, "pdserve_router_requests_total", "outcome=\"cancelled\""), 0);  // 0, or -1: no series
}

// With router.request_curve_secret_key_file the request socket is a CURVE server: a client
// needs the router's public key and, with an allowed list, a listed key pair; any other never
// completes the handshake, reaches nothing, and the router keeps serving. API keys still apply.
TEST(RequestApiE2eTest, CurveOnTheRequestSocketLetsInOnlyListedClients) {
  if (!services::CurveAvailable()) GTEST_SKIP() << "libzmq without CURVE";
  TestCluster c("zmq-curve");
  for (const char* name : {"router", "client", "stranger"})
    ASSERT_TRUE(services::WriteCurveKeyPairFiles(c.dir(), name).ok());
  const std::string keys = c.dir() + "/api_keys";
  std::ofstream(keys) << "sk-curve\n";
  ASSERT_OK_C(c.StartRouter({"--request-endpoint", "tcp://127.0.0.1:*", "--api-keys-file", keys,
                             "--request-curve-secret-key-file", c.dir() + "/router.secret",
                             "--request-curve-allowed-clients-file", c.dir() + "/client.public"}),
              c);
  ASSERT_OK_C(c.StartWorker("w0"), c);
  ASSERT_TRUE(WaitFor([&] { return HttpGet(c.http_port(), "/health", 2s).status == 200; }, 10s)) << c.Logs();
  auto options = [&](const std::string& server_public, const std::string& own_secret) {
    client::ClientOptions o;
    auto curve = client::CurveClientOptions(c.dir() + server_public, own_secret.empty() ? "" : c.dir() + own_secret);
    EXPECT_TRUE(curve.ok()) << curve.status().ToString();
    if (curve.ok()) o.curve = std::move(curve).value();
    o.api_key = "sk-curve";
    return o;
  };
  api::Submit req;
  req.model = "pdserve";
  req.prompt_ids = Prompt(4);
  req.sampling.max_tokens = 5;
  const std::vector<int32_t> expected(req.prompt_ids.begin(), req.prompt_ids.begin() + 5);

  auto good = Connect(c, options("/router.public", "/client.secret"));
  ASSERT_TRUE(good);
  auto d = good->Generate(req);
  ASSERT_TRUE(d.ok()) << d.status().ToString() << "\n" << c.Logs();
  EXPECT_EQ(d->tokens, expected);

  // Refused: plain TCP, a key pair not in the list, a fresh key pair, the wrong router key.
  client::ClientOptions plain;
  plain.api_key = "sk-curve";
  const std::vector<std::pair<std::string, client::ClientOptions>> refused = {
      {"plain TCP", plain},
      {"unlisted key pair", options("/router.public", "/stranger.secret")},
      {"fresh key pair", options("/router.public", "")},
      {"wrong router key", options("/stranger.public", "/client.secret")}};
  for (const auto& [what, o] : refused) {
    SCOPED_TRACE(what);
    client::ClientOptions quick = o;
    quick.timeout = 500ms;
    quick.connect_timeout = 500ms;
    auto cl = RequestClient::Connect(c.request_endpoint(), quick);
    ASSERT_TRUE(cl.ok()) << cl.status().ToString();
    EXPECT_EQ((*cl)->Ping(500ms).code(), StatusCode::kDeadlineExceeded);
    // Never served, and never a hang: the client gives up after its timeout.
    const auto t0 = std::chrono::steady_clock::now();
    EXPECT_EQ((*cl)->Generate(req).status().code(), StatusCode::kDeadlineExceeded);
    EXPECT_LT(std::chrono::steady_clock::now() - t0, 3s);
  }
  EXPECT_NE(c.router()->Log().find("refused a CURVE client"), std::string::npos) << c.Logs();

  // Still serving the listed client; only its two requests reached the worker.
  d = good->Generate(req);
  ASSERT_TRUE(d.ok()) << d.status().ToString() << "\n" << c.Logs();
  EXPECT_EQ(d->tokens, expected);
  EXPECT_EQ(RouterMetric(c, "pdserve_router_placements_total", "worker=\"w0\""), 2);
  EXPECT_EQ(RouterMetric(c, "pdserve_router_request_api_malformed_total"), 0);
}

TEST(RequestApiE2eTest, WorkersViewListsRolesAndPlacements) {
  TestCluster c("zmq-workers");
  ASSERT_OK_C(c.StartRouter({"--request-endpoint", "tcp://127.0.0.1:*"}), c);
  ASSERT_OK_C(c.StartWorker("p0", "prefill"), c);
  ASSERT_OK_C(c.StartWorker("d0", "decode"), c);
  ASSERT_OK_C(c.StartWorker("c0", "colocated"), c);
  ASSERT_TRUE(c.WaitForWorkers(3)) << c.Logs();
  auto r = HttpGet(c.http_port(), "/v1/workers");
  ASSERT_EQ(r.status, 200) << r.body;
  const json view = json::parse(r.body);
  EXPECT_EQ(view["object"], "list");
  ASSERT_EQ(view["data"].size(), 3u) << r.body;
  std::map<std::string, std::string> roles;
  for (const auto& w : view["data"]) {
    roles[w["id"]] = w["role"];
    EXPECT_EQ(w["state"], "ready");
    EXPECT_EQ(w["health"], "healthy");
    EXPECT_EQ(w["dp_ranks"], 1);
    EXPECT_EQ(w["model"], "pdserve");
    EXPECT_TRUE(w["load"].contains("running"));
    EXPECT_EQ(w["load"]["kv_blocks_total"], 4096);
    EXPECT_EQ(w["address"]["metrics"], "127.0.0.1:" + std::to_string(c.worker_metrics_port(w["id"])));
  }
  EXPECT_EQ(roles, (std::map<std::string, std::string>{{"p0", "prefill"}, {"d0", "decode"}, {"c0", "colocated"}}));

  // routing.mode auto with a prefill + decode pair: disaggregated. The ZeroMQ API gives the
  // same output there, and every placement is counted per worker.
  auto client = Connect(c);
  ASSERT_TRUE(client);
  for (int k = 0; k < 3; ++k) {
    api::Submit s;
    s.model = "pdserve";
    s.prompt_ids = Prompt(k);
    s.sampling.max_tokens = 6;
    auto d = client->Generate(s);
    ASSERT_TRUE(d.ok()) << d.status().ToString() << c.Logs();
    ASSERT_EQ(d->tokens.size(), 6u);
    for (size_t i = 0; i < 6; ++i) EXPECT_EQ(d->tokens[i], s.prompt_ids[i % s.prompt_ids.size()]);
  }
  EXPECT_EQ(RouterMetric(c, "pdserve_router_placements_total", "worker=\"d0\""), 3);
  EXPECT_EQ(RouterMetric(c, "pdserve_router_placements_total", "worker=\"p0\""), 3);
  EXPECT_EQ(RouterMetric(c, "pdserve_router_placements_total", "worker=\"c0\""), -1);  // no series yet
  const std::string m = HttpGet(c.http_port(), "/metrics").body;
  EXPECT_NE(m.find("pdserve_router_placements_total{dp_rank=\"0\",role=\"decode\",worker=\"d0\"} 3"), std::string::npos)
      << m;
}

TEST(RequestApiE2eTest, InProcessShutdownEndsStreamsWithAnError) {
  RouterConfig config;
  config.port = 0;
  config.control_endpoint = "tcp://127.0.0.1:*";
  config.request_endpoint = "tcp://127.0.0.1:*";
  config.heartbeat_interval = 100ms;
  config.heartbeat_timeout = 800ms;
  auto server = RouterServer::Start(config);
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  ASSERT_FALSE((*server)->request_endpoint().empty());
  const std::string dir = services::testing::MakeTempDir("pdserve-zmq-inproc");
  auto worker = services::testing::ChildProcess::Spawn(
      {std::string(PDSERVE_BIN_DIR) + "/pdserve-echo-worker", "--router", (*server)->control_endpoint(), "--worker-id",
       "w0", "--register-retry-ms", "50", "--token-delay-us", "5000"},
      dir + "/w0.log");
  ASSERT_TRUE(worker.ok());
  ASSERT_TRUE(WaitFor([&] { return (*server)->core().Health().ready; }, 10s)) << (*worker)->Log();
  auto client = RequestClient::Connect((*server)->request_endpoint()).value();
  api::Submit s;
  s.model = "pdserve";
  s.prompt_ids = Prompt(7);
  s.sampling.max_tokens = 6;
  auto d = client->Generate(s);
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  EXPECT_EQ(d->tokens.size(), 6u);
  // A long stream is open when the server goes away: it ends with a 503, promptly.
  Status result;
  std::thread stream([&] {
    s.sampling.max_tokens = 8000;
    auto r = client->Generate(s);
    result = r.status();
  });
  ASSERT_TRUE(WaitFor([&] { return (*server)->core().outstanding() == 1; }, 5s));
  const auto t0 = std::chrono::steady_clock::now();
  server->reset();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 3s);
  stream.join();
  EXPECT_EQ(result.code(), StatusCode::kUnavailable) << result.ToString();
}

}  // namespace
}  // namespace pdserve::router
