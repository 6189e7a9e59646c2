// bench_request_api: the router's ZeroMQ request API (docs/request-api.md) against its HTTP
// API, same router process, same echo worker (no model time), same requests. Rows alternate
// HTTP and ZeroMQ request by request so both see the same machine noise. Measured at the client:
// a 1-token request end to end, the first token of a 64-token stream, the whole 64-token stream,
// the first token of a chat request (template + tokenizer), and throughput with 8 concurrent
// clients. The difference between the columns is what each front adds at the router (the work
// behind them -- tokenizer, routing, GenerationSession -- is shared). bench_router has the
// direct control-plane baseline. Writes bench/results/router_request_api.{json,md}.
#include <algorithm>
#include <atomic>
#include <cstdio>
#include <filesystem>
#include <thread>

#include <httplib.h>
#include <nlohmann/json.hpp>

#include "bench/common/bench_util.h"
#include "services/client/request_client.h"
#include "services/common/process_util.h"
#include "services/testing/child_process.h"

namespace {

using namespace pdserve;
using namespace std::chrono_literals;
using bench::Clock;
using nlohmann::json;
namespace api = services::api;

struct Stats {
  double p50 = 0, p90 = 0, p99 = 0;
};
Stats Summarize(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  Stats s;
  if (v.empty()) return s;
  s.p50 = v[v.size() / 2];
  s.p90 = v[std::min(v.size() - 1, v.size() * 9 / 10)];
  s.p99 = v[std::min(v.size() - 1, v.size() * 99 / 100)];
  return s;
}
json ToJson(const Stats& s) { return {{"p50_us", s.p50 * 1e6}, {"p90_us", s.p90 * 1e6}, {"p99_us", s.p99 * 1e6}}; }

// Streams an SSE request; returns the time to the first chunk with text; *total: to [DONE].
double HttpStream(httplib::Client& cli, const std::string& path, const json& body, double* total) {
  httplib::Request req;
  req.method = "POST";
  req.path = path;
  req.body = body.dump();
  req.set_header("Content-Type", "application/json");
  const auto t0 = Clock::now();
  double first = -1;
  std::string buffer;
  req.content_receiver = [&](const char* data, size_t n, uint64_t, uint64_t) {
    const auto now = Clock::now();
    buffer.append(data, n);
    size_t end;
    while ((end = buffer.find("\n\n")) != std::string::npos) {
      const std::string event = buffer.substr(0, end);
      buffer.erase(0, end + 2);
      if (event.rfind("data: ", 0) != 0) continue;
      const std::string payload = event.substr(6);
      if (payload == "[DONE]") {
        if (total) *total = std::chrono::duration<double>(now - t0).count();
        continue;
      }
      if (first >= 0) continue;
      const json j = json::parse(payload);
      if (!j.contains("choices") || j["choices"].empty()) continue;
      const json& c = j["choices"][0];
      const bool text = (c.contains("text") && !c["text"].get<std::string>().empty()) ||
                        (c.contains("delta") && c["delta"].contains("content") &&
                         !c["delta"]["content"].get<std::string>().empty());
      if (text) first = std::chrono::duration<double>(now - t0).count();
    }
    return true;
  };
  cli.send(req);
  return first;
}

// Streams a ZeroMQ request; returns the time to the first output with tokens; *total: to the end.
double ZmqStream(client::RequestClient& cl, const api::Submit& s, double* total) {
  const auto t0 = Clock::now();
  double first = -1;
  auto done = cl.Generate(s, [&](const api::Output& o) {
    if (first < 0 && !o.text.empty()) first = bench::SecondsSince(t0);
    return true;
  });
  if (!done.ok()) std::fprintf(stderr, "zmq request failed: %s\n", done.status().ToString().c_str());
  if (total) *total = bench::SecondsSince(t0);
  return first;
}

}  // namespace

int main(int argc, char** argv) {
  int reps = 400;
  for (int i = 1; i + 1 < argc; ++i)
    if (std::string(argv[i]) == "--reps") reps = std::atoi(argv[i + 1]);
  services::BlockTerminationSignals();
  const std::string bin = bench::BinDir();
  const std::string dir = services::testing::MakeTempDir("pdserve-bench-request-api");
  const std::string ready = dir + "/router.ready";
  auto router = services::testing::ChildProcess::Spawn(
      {bin + "/pdserve-router", "--port", "0", "--control", "tcp://127.0.0.1:*", "--request-endpoint",
       "tcp://127.0.0.1:*", "--ready-file", ready, "--log-level", "warn"},
      dir + "/router.log");
  json r;
  if (!router.ok() || !services::testing::WaitFor([&] {
        auto t = services::ReadFile(ready);
        if (!t.ok()) return false;
        r = json::parse(t.value());
        return true;
      }, 30s)) {
    std::fprintf(stderr, "bench_request_api: the router did not start\n");
    return 1;
  }
  const int port = r["http_port"];
  const std::string endpoint = r["request_endpoint"];
  auto worker = services::testing::ChildProcess::Spawn(
      {bin + "/pdserve-echo-worker", "--router", r["control_endpoint"].get<std::string>(), "--worker-id", "echo",
       "--register-retry-ms", "20", "--log-level", "warn"},
      dir + "/echo.log");
  httplib::Client http("127.0.0.1", port);
  http.set_keep_alive(true);
  http.set_tcp_nodelay(true);
  http.set_read_timeout(30s);
  if (!worker.ok() || !services::testing::WaitFor([&] {
        auto h = http.Get("/health");
        return h && h->status == 200;
      }, 20s)) {
    std::fprintf(stderr, "bench_request_api: the cluster is not ready\n");
    return 1;
  }
  auto zmq = client::RequestClient::Connect(endpoint).value();

  std::vector<int32_t> prompt;
  for (int i = 0; i < 32; ++i) prompt.push_back(1000 + 17 * i);
  const std::string chat_text = "Summarize the plot of a short story about a lighthouse keeper in two sentences.";
  auto submit = [&](uint32_t max_tokens) {
    api::Submit s;
    s.model = "pdserve";
    s.prompt_ids = prompt;
    s.sampling.max_tokens = max_tokens;
    s.sampling.temperature = 0;
    return s;
  };
  const json body1 = {{"model", "pdserve"}, {"prompt", prompt}, {"max_tokens", 1}, {"temperature", 0}};
  const json body64 = {{"model", "pdserve"}, {"prompt", prompt}, {"max_tokens", 64}, {"temperature", 0}, {"stream", true}};
  const json chat_body = {{"model", "pdserve"},
                          {"messages", {{{"role", "user"}, {"content", chat_text}}}},
                          {"max_tokens", 4},
                          {"stream", true}};
  api::Submit chat = submit(4);
  chat.kind = api::PromptKind::kChat;
  chat.prompt_ids.clear();
  chat.sampling.temperature.reset();
  chat.messages = {{"user", chat_text, {}}};

  const int warm = std::max(20, reps / 10);
  std::vector<double> h1, z1, h_ttft, z_ttft, h64, z64, h_chat, z_chat;
  for (int i = 0; i < warm + reps; ++i) {
    auto t0 = Clock::now();
    auto res = http.Post("/v1/completions", body1.dump(), "application/json");
    const double th = bench::SecondsSince(t0);
    if (!res || res->status != 200) std::fprintf(stderr, "http request failed\n");
    t0 = Clock::now();
    auto done = zmq->Generate(submit(1));
    const double tz = bench::SecondsSince(t0);
    if (!done.ok()) std::fprintf(stderr, "zmq request failed: %s\n", done.status().ToString().c_str());
    if (i >= warm) h1.push_back(th), z1.push_back(tz);
  }
  const api::Submit s64 = submit(64);
  for (int i = 0; i < warm + reps / 2; ++i) {
    double ht = 0, zt = 0;
    const double hf = HttpStream(http, "/v1/completions", body64, &ht);
    const double zf = ZmqStream(*zmq, s64, &zt);
    const double hc = HttpStream(http, "/v1/chat/completions", chat_body, nullptr);
    const double zc = ZmqStream(*zmq, chat, nullptr);
    if (i >= warm) {
      h_ttft.push_back(hf), z_ttft.push_back(zf), h64.push_back(ht), z64.push_back(zt);
      h_chat.push_back(hc), z_chat.push_back(zc);
    }
  }

  // Throughput: 8 concurrent clients of one kind, 16-token completions, 3 s each.
  const int clients = 8;
  auto throughput = [&](bool use_zmq) {
    std::atomic<int64_t> done{0};
    std::atomic<bool> stop{false};
    std::vector<std::thread> threads;
    const json body16 = {{"model", "pdserve"}, {"prompt", prompt}, {"max_tokens", 16}};
    const api::Submit s16 = submit(16);
    const auto t0 = Clock::now();
    for (int c = 0; c < clients; ++c)
      threads.emplace_back([&] {
        if (use_zmq) {
          auto cl = client::RequestClient::Connect(endpoint).value();
          while (!stop)
            if (cl->Generate(s16).ok()) ++done;
        } else {
          httplib::Client tc("127.0.0.1", port);
          tc.set_keep_alive(true);
          tc.set_tcp_nodelay(true);
          tc.set_read_timeout(30s);
          while (!stop) {
            auto res = tc.Post("/v1/completions", body16.dump(), "application/json");
            if (res && res->status == 200) ++done;
          }
        }
      });
    std::this_thread::sleep_for(3s);
    stop = true;
    for (auto& t : threads) t.join();
    return static_cast<double>(done.load()) / bench::SecondsSince(t0);
  };
  const double rps_http = throughput(false);
  const double rps_zmq = throughput(true);

  const Stats sh1 = Summarize(h1), sz1 = Summarize(z1), shf = Summarize(h_ttft), szf = Summarize(z_ttft),
              sh64 = Summarize(h64), sz64 = Summarize(z64), shc = Summarize(h_chat), szc = Summarize(z_chat);
  json out = {{"machine", bench::MachineName()},
              {"commit", bench::GitRevision()},
              {"reps", reps},
              {"prompt_tokens", prompt.size()},
              {"http_completion_1_token", ToJson(sh1)},
              {"zmq_completion_1_token", ToJson(sz1)},
              {"http_stream_first_token_64", ToJson(shf)},
              {"zmq_stream_first_token_64", ToJson(szf)},
              {"http_stream_64_tokens_total", ToJson(sh64)},
              {"zmq_stream_64_tokens_total", ToJson(sz64)},
              {"http_chat_first_token", ToJson(shc)},
              {"zmq_chat_first_token", ToJson(szc)},
              {"throughput_clients", clients},
              {"http_requests_per_s", rps_http},
              {"zmq_requests_per_s", rps_zmq}};
  auto row = [](const char* what, const Stats& h, const Stats& z) {
    char line[256];
    std::snprintf(line, sizeof(line), "| %s | %.0f | %.0f | %.0f | %.0f |\n", what, h.p50 * 1e6, h.p99 * 1e6,
                  z.p50 * 1e6, z.p99 * 1e6);
    return std::string(line);
  };
  std::string md = "# Router request overhead: ZeroMQ request API vs HTTP (echo worker, no model time)\n\n";
  md += "CPU: " + bench::MachineName() + "  \nCommit: " + bench::GitRevision() + "  \nPrompt: " +
        std::to_string(prompt.size()) + " token ids; " + std::to_string(reps) +
        " requests per row (streams: half), HTTP and ZeroMQ alternating; one keep-alive HTTP client "
        "(TCP_NODELAY), one ZeroMQ client (services/client).\n\n"
        "| request | HTTP p50 us | HTTP p99 us | ZeroMQ p50 us | ZeroMQ p99 us |\n|---|---|---|---|---|\n";
  md += row("1-token completion, whole request", sh1, sz1);
  md += row("first token of a 64-token stream", shf, szf);
  md += row("all 64 tokens of a stream", sh64, sz64);
  md += row("first token of a chat stream (template + tokenize)", shc, szc);
  char tail[256];
  std::snprintf(tail, sizeof(tail),
                "\nThroughput, %d concurrent clients, 16-token completions: HTTP %.0f requests/s, ZeroMQ %.0f "
                "requests/s.\n",
                clients, rps_http, rps_zmq);
  md += tail;
  bench::WriteResults("router_request_api", out, md);
  return 0;
}
