// End-to-end tests of the router's hardening (docs/operations.md, "Security"): API keys, prompt
// limit, Retry-After on 429, and ZeroMQ CURVE on the control plane, with an in-process
// RouterServer, real pdserve-echo-worker processes and real `pdserve keygen` key files.
#include <fstream>
#include <thread>

#include <gtest/gtest.h>
#include <httplib.h>
#include <nlohmann/json.hpp>

#include "services/testing/child_process.h"
#include "services/testing/http_test_client.h"
#include "services/router/router_server.h"

namespace pdserve::router {
namespace {

using namespace std::chrono_literals;
using nlohmann::json;
using services::testing::ChildProcess;
using services::testing::WaitFor;

const std::string kBin = PDSERVE_BIN_DIR;

RouterConfig TestConfig() {
  RouterConfig c;
  c.port = 0;
  c.control_endpoint = "tcp://127.0.0.1:*";
  c.heartbeat_interval = 100ms;
  c.heartbeat_timeout = 800ms;
  return c;
}

std::unique_ptr<ChildProcess> StartEchoWorker(const std::string& endpoint, const std::string& id,
                                              const std::string& dir, std::vector<std::string> extra = {}) {
  std::vector<std::string> argv = {kBin + "/pdserve-echo-worker", "--router", endpoint, "--worker-id", id,
                                   "--register-retry-ms", "50"};
  argv.insert(argv.end(), extra.begin(), extra.end());
  auto w = ChildProcess::Spawn(argv, dir + "/" + id + ".log");
  EXPECT_TRUE(w.ok()) << w.status().ToString();
  return w.ok() ? std::move(w).value() : nullptr;
}

struct Reply {
  int status = 0;
  std::string body;
  httplib::Headers headers;
};
Reply Call(int port, const std::string& method, const std::string& path, const std::string& key,
           const std::string& body = "") {
  httplib::Client cli("127.0.0.1", port);
  cli.set_read_timeout(30s);
  httplib::Headers h;
  if (!key.empty()) h.emplace("Authorization", "Bearer " + key);
  auto r = method == "GET" ? cli.Get(path, h) : cli.Post(path, h, body, "application/json");
  if (!r) return {};
  return {r->status, r->body, r->headers};
}

std::string Completion(int max_tokens, const std::string& prompt = "alpha bravo charlie") {
  return json{{"model", "pdserve"}, {"prompt", prompt}, {"max_tokens", max_tokens}}.dump();
}

TEST(RouterSecurityE2eTest, ApiKeysPromptLimitAndRetryAfter) {
  const std::string dir = services::testing::MakeTempDir("pdserve-sec");
  std::ofstream(dir + "/api_keys") << "# clients\nsk-test-one\nsk-test-two\n";
  RouterConfig config = TestConfig();
  config.api_keys_file = dir + "/api_keys";
  config.max_outstanding_requests = 1;
  config.max_prompt_tokens = 40;
  config.retry_after_s = 2;
  auto server = RouterServer::Start(config);
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  const int port = (*server)->http_port();
  auto worker = StartEchoWorker((*server)->control_endpoint(), "w0", dir, {"--token-delay-us", "5000"});
  ASSERT_TRUE(worker);
  ASSERT_TRUE(WaitFor([&] { return (*server)->core().Health().ready; }, 10s)) << worker->Log();

  // No key, a wrong key, a prefix of a right key: 401, OpenAI-shaped, nothing reaches a worker.
  for (const std::string key : {"", "sk-wrong", "sk-test-on"}) {
    auto r = Call(port, "POST", "/v1/completions", key, Completion(3));
    EXPECT_EQ(r.status, 401) << key << ": " << r.body;
    auto e = json::parse(r.body)["error"];
    EXPECT_EQ(e["type"], "invalid_request_error");
    EXPECT_EQ(e["code"], "invalid_api_key");
    EXPECT_NE(e["message"].get<std::string>().find(key.empty() ? "Missing" : "Incorrect"), std::string::npos);
    EXPECT_EQ(r.headers.find("WWW-Authenticate")->second, "Bearer");
  }
  EXPECT_EQ(Call(port, "GET", "/v1/models", "").status, 401);
  {
    // Refused before the body is read: a client announcing 1 MB and sending 10 bytes gets its
    // 401 at once.
    services::testing::RawHttpConnection conn(port);
    ASSERT_TRUE(conn.SendAll("POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                             "Content-Length: 1000000\r\n\r\n{\"model\": "));
    EXPECT_NE(conn.ReadUntil("invalid_api_key", 3s).find("401"), std::string::npos);
  }
  EXPECT_EQ(Call(port, "GET", "/admin/workers", "sk-nope").status, 401);
  // Exempt by default: health and metrics (monitoring has no key).
  EXPECT_EQ(Call(port, "GET", "/health", "").status, 200);
  EXPECT_EQ(Call(port, "GET", "/metrics", "").status, 200);
  // Either key works.
  EXPECT_EQ(Call(port, "GET", "/v1/models", "sk-test-two").status, 200);
  auto ok = Call(port, "POST", "/v1/completions", "sk-test-one", Completion(3));
  ASSERT_EQ(ok.status, 200) << ok.body;
  EXPECT_EQ(json::parse(ok.body)["usage"]["completion_tokens"], 3);

  // Prompt over router.max_prompt_tokens: 400 before any worker sees it.
  std::string long_prompt;
  for (int i = 0; i < 60; ++i) long_prompt += " word" + std::to_string(i);
  auto too_long = Call(port, "POST", "/v1/completions", "sk-test-one", Completion(3, long_prompt));
  EXPECT_EQ(too_long.status, 400) << too_long.body;
  EXPECT_EQ(json::parse(too_long.body)["error"]["code"], "context_length_exceeded");
  EXPECT_EQ(json::parse(too_long.body)["error"]["param"], "prompt");

  // Admission: one request in flight is the cap; the next gets 429 with Retry-After.
  std::thread busy([&] { Call(port, "POST", "/v1/completions", "sk-test-one", Completion(200)); });
  ASSERT_TRUE(WaitFor([&] { return (*server)->core().outstanding() == 1; }, 5s));
  auto saturated = Call(port, "POST", "/v1/completions", "sk-test-two", Completion(2));
  EXPECT_EQ(saturated.status, 429) << saturated.body;
  EXPECT_EQ(json::parse(saturated.body)["error"]["type"], "rate_limit_error");
  auto retry = saturated.headers.find("Retry-After");
  ASSERT_NE(retry, saturated.headers.end());
  EXPECT_EQ(retry->second, "2");
  busy.join();
  server->reset();
}

TEST(RouterSecurityE2eTest, ApiKeyFileErrorsNameTheFile) {
  RouterConfig config = TestConfig();
  config.api_keys_file = "/nonexistent/pdserve/api_keys";
  auto server = RouterServer::Start(config);
  ASSERT_FALSE(server.ok());
  EXPECT_NE(server.status().message().find("/nonexistent/pdserve/api_keys"), std::string::npos)
      << server.status().ToString();
}

// Runs `pdserve keygen` (the real CLI) for `names` into `dir`.
void Keygen(const std::string& dir, const std::vector<std::string>& names) {
  std::vector<std::string> argv = {kBin + "/pdserve", "keygen", "--out", dir};
  for (const auto& n : names) argv.insert(argv.end(), {"--name", n});
  auto p = ChildProcess::Spawn(argv, dir + "/keygen-" + names[0] + ".log");
  ASSERT_TRUE(p.ok());
  ASSERT_EQ((*p)->WaitExit(10s), std::optional<int>(0)) << (*p)->Log();
}

std::vector<std::string> CurveArgs(const std::string& dir, const std::string& worker_key,
                                   const std::string& router_key = "router") {
  return {"--curve-secret-key-file", dir + "/" + worker_key + ".secret", "--router-public-key-file",
          dir + "/" + router_key + ".public"};
}

TEST(RouterSecurityE2eTest, CurveControlPlaneAllowList) {
  const std::string dir = services::testing::MakeTempDir("pdserve-curve");
  Keygen(dir, {"router", "good", "intruder", "fake-router"});
  {
    std::ifstream in(dir + "/good.public");
    std::ofstream(dir + "/allowed.public") << in.rdbuf();
  }
  RouterConfig config = TestConfig();
  config.control_curve_secret_key_file = dir + "/router.secret";
  config.control_curve_allowed_clients_file = dir + "/allowed.public";
  auto server = RouterServer::Start(config);
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  const std::string endpoint = (*server)->control_endpoint();
  const int port = (*server)->http_port();

  // Refused before the good worker exists: a key pair not in the list, a worker without CURVE,
  // and a worker that trusts another router key.
  auto intruder = StartEchoWorker(endpoint, "intruder", dir, CurveArgs(dir, "intruder"));
  auto plain = StartEchoWorker(endpoint, "plain", dir);
  auto misled = StartEchoWorker(endpoint, "misled", dir, CurveArgs(dir, "good", "fake-router"));
  ASSERT_TRUE(intruder && plain && misled);
  ASSERT_TRUE(WaitFor([&] { return (*server)->core().refused_handshakes() >= 1; }, 10s)) << intruder->Log();
  std::this_thread::sleep_for(1s);  // several registration attempts of each
  EXPECT_FALSE((*server)->core().Health().ready);
  EXPECT_EQ((*server)->core().WorkersJson().size(), 0u) << (*server)->core().WorkersJson().dump();
  EXPECT_TRUE(intruder->Running() && plain->Running() && misled->Running());
  auto none = Call(port, "POST", "/v1/completions", "", Completion(2));
  EXPECT_EQ(none.status, 503) << none.body;

  // The allowed worker registers and serves while the others keep knocking.
  auto good = StartEchoWorker(endpoint, "good", dir, CurveArgs(dir, "good"));
  ASSERT_TRUE(good);
  ASSERT_TRUE(WaitFor([&] { return (*server)->core().Health().ready; }, 10s)) << good->Log();
  for (int i = 0; i < 3; ++i) {
    auto r = Call(port, "POST", "/v1/completions", "", Completion(4));
    ASSERT_EQ(r.status, 200) << r.body;
    EXPECT_EQ(json::parse(r.body)["usage"]["completion_tokens"], 4);
  }
  const json workers = (*server)->core().WorkersJson();
  ASSERT_EQ(workers.size(), 1u) << workers.dump();
  EXPECT_EQ(workers[0]["id"], "good");
  server->reset();
}

TEST(RouterSecurityE2eTest, CurveAnyKeyPairAndConfigErrors) {
  const std::string dir = services::testing::MakeTempDir("pdserve-curve");
  Keygen(dir, {"router", "w"});
  RouterConfig config = TestConfig();
  config.control_curve_secret_key_file = dir + "/router.secret";  // no allow-list: any key pair
  auto server = RouterServer::Start(config);
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  auto worker = StartEchoWorker((*server)->control_endpoint(), "w", dir, CurveArgs(dir, "w"));
  ASSERT_TRUE(worker);
  ASSERT_TRUE(WaitFor([&] { return (*server)->core().Health().ready; }, 10s)) << worker->Log();
  EXPECT_EQ(Call((*server)->http_port(), "POST", "/v1/completions", "", Completion(2)).status, 200);
  server->reset();

  // Config errors name the file: a missing router key, a malformed allow-list, a worker's
  // missing key file (the worker exits 2 at once).
  config.control_curve_secret_key_file = dir + "/missing.secret";
  auto missing = RouterServer::Start(config);
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find(dir + "/missing.secret"), std::string::npos) << missing.status().ToString();
  std::ofstream(dir + "/bad.public") << "# workers\nnot-a-key\n";
  config.control_curve_secret_key_file = dir + "/router.secret";
  config.control_curve_allowed_clients_file = dir + "/bad.public";
  auto malformed = RouterServer::Start(config);
  ASSERT_FALSE(malformed.ok());
  EXPECT_NE(malformed.status().message().find("'" + dir + "/bad.public' line 2"), std::string::npos)
      << malformed.status().ToString();
  auto bad_worker = StartEchoWorker("tcp://127.0.0.1:1", "x", dir, CurveArgs(dir, "w", "nobody"));
  ASSERT_TRUE(bad_worker);
  EXPECT_EQ(bad_worker->WaitExit(10s), std::optional<int>(2));
  EXPECT_NE(bad_worker->Log().find(dir + "/nobody.public"), std::string::npos) << bad_worker->Log();
}

}  // namespace
}  // namespace pdserve::router
