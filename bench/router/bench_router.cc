// bench_router: what the router adds to a request (docs/router.md, "Performance").
//
// Baseline: this program plays the router's part of the control plane itself (a ZeroMQ ROUTER
// socket speaking proto/control.capnp) toward one pdserve-echo-worker and times a job from
// send to its finishing token event: the cost of calling a worker directly. Measured: the same
// request through a real pdserve-router process (HTTP + JSON + tokenizer + routing + SSE) to
// another echo worker. The echo worker spends no model time (token delay 0), so the difference
// is the router's overhead. Sequential single-client latencies (median, p90, p99 of N runs
// after a warm-up), per-token streaming cost, and throughput with concurrent clients.
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <filesystem>
#include <map>
#include <mutex>
#include <thread>

#include <httplib.h>
#include <nlohmann/json.hpp>

#include "bench/common/bench_util.h"
#include "services/control/control_channel.h"
#include "services/control/control_codec.h"
#include "services/common/process_util.h"
#include "services/testing/child_process.h"

namespace {

using namespace pdserve;
using namespace pdserve::services;
using namespace std::chrono_literals;
using bench::Clock;
using nlohmann::json;

struct Stats {
  double median = 0, p90 = 0, p99 = 0, mean = 0;
};
Stats Summarize(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  Stats s;
  if (v.empty()) return s;
  s.median = v[v.size() / 2];
  s.p90 = v[std::min(v.size() - 1, v.size() * 9 / 10)];
  s.p99 = v[std::min(v.size() - 1, v.size() * 99 / 100)];
  for (double x : v) s.mean += x;
  s.mean /= static_cast<double>(v.size());
  return s;
}
json ToJson(const Stats& s) {
  return {{"median_us", s.median * 1e6}, {"p90_us", s.p90 * 1e6}, {"p99_us", s.p99 * 1e6}, {"mean_us", s.mean * 1e6}};
}

// The router's side of the control plane, minimal: registration, heartbeats, one job at a time.
class DirectRouter {
 public:
  DirectRouter() {
    channel_ = ControlChannel::Start({ControlChannelOptions::Kind::kRouterBind, "tcp://127.0.0.1:*", 20ms, "bench"},
                                     [this](std::string_view peer, std::string_view payload) { OnMessage(peer, payload); })
                   .value();
  }
  const std::string& endpoint() const { return channel_->endpoint(); }
  bool WaitRegistered(std::chrono::seconds timeout) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, timeout, [&] { return !peer_.empty(); });
  }
  // Sends a colocated job; returns (time to the first token, time to the finishing event).
  std::pair<double, double> Run(const std::vector<int32_t>& prompt, uint32_t max_tokens) {
    JobMsg job;
    job.request_id = ++next_id_;
    job.request_tag = "bench";
    job.prompt = prompt;
    job.sampling.max_tokens = max_tokens;
    job.sampling.temperature = 0;
    std::string peer;
    {
      std::lock_guard<std::mutex> lock(mu_);
      peer = peer_;
      first_ = done_ = Clock::time_point{};
      current_ = job.request_id;
    }
    const auto t0 = Clock::now();
    channel_->Send(peer, EncodeControlMessage(job).value());
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return done_ != Clock::time_point{}; });
    return {std::chrono::duration<double>(first_ - t0).count(), std::chrono::duration<double>(done_ - t0).count()};
  }

 private:
  void OnMessage(std::string_view peer, std::string_view payload) {
    auto m = DecodeControlMessage(payload);
    if (!m.ok()) return;
    if (std::holds_alternative<RegisterMsg>(m.value())) {
      channel_->Send(std::string(peer), EncodeControlMessage(RegisterAckMsg{1, 500, 5000}).value());
      std::lock_guard<std::mutex> lock(mu_);
      peer_ = std::string(peer);
      cv_.notify_all();
    } else if (auto* hb = std::get_if<HeartbeatMsg>(&m.value())) {
      channel_->Send(std::string(peer), EncodeControlMessage(HeartbeatAckMsg{hb->seq, true, 1}).value());
    } else if (auto* ev = std::get_if<TokenEventMsg>(&m.value())) {
      const auto now = Clock::now();
      std::lock_guard<std::mutex> lock(mu_);
      if (ev->request_id != current_) return;
      if (first_ == Clock::time_point{} && !ev->tokens.empty()) first_ = now;
      if (ev->finishing()) {
        done_ = now;
        cv_.notify_all();
      }
    }
  }

  std::unique_ptr<ControlChannel> channel_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::string peer_;
  uint64_t next_id_ = 0, current_ = 0;
  Clock::time_point first_{}, done_{};
};

}  // namespace

int main(int argc, char** argv) {
  int reps = 400;
  for (int i = 1; i + 1 < argc; ++i)
    if (std::string(argv[i]) == "--reps") reps = std::atoi(argv[i + 1]);
  BlockTerminationSignals();
  const std::string bin = bench::BinDir();
  const std::string dir = testing::MakeTempDir("pdserve-bench-router");

  // The direct path.
  DirectRouter direct;
  auto direct_worker = testing::ChildProcess::Spawn(
      {bin + "/pdserve-echo-worker", "--router", direct.endpoint(), "--worker-id", "direct", "--register-retry-ms", "20"},
      dir + "/direct.log");
  if (!direct_worker.ok() || !direct.WaitRegistered(10s)) {
    std::fprintf(stderr, "bench_router: the direct echo worker did not register\n");
    return 1;
  }

  // The routed path: a real router process and its own echo worker.
  const std::string ready = dir + "/router.ready";
  auto router = testing::ChildProcess::Spawn({bin + "/pdserve-router", "--port", "0", "--control", "tcp://127.0.0.1:*",
                                              "--ready-file", ready, "--log-level", "warn"},
                                             dir + "/router.log");
  json r;
  if (!testing::WaitFor([&] {
        auto t = ReadFile(ready);
        if (!t.ok()) return false;
        r = json::parse(t.value());
        return true;
      }, 30s)) {
    std::fprintf(stderr, "bench_router: the router did not start\n%s", (*router)->Log().c_str());
    return 1;
  }
  const int port = r["http_port"];
  auto routed_worker = testing::ChildProcess::Spawn(
      {bin + "/pdserve-echo-worker", "--router", r["control_endpoint"].get<std::string>(), "--worker-id", "routed",
       "--register-retry-ms", "20", "--log-level", "warn"},
      dir + "/routed.log");
  httplib::Client cli("127.0.0.1", port);
  cli.set_keep_alive(true);
  cli.set_tcp_nodelay(true);  // as curl and the OpenAI SDKs do (else Nagle + delayed ACK add 40 ms)
  cli.set_read_timeout(30s);
  if (!testing::WaitFor([&] {
        auto h = cli.Get("/health");
        return h && h->status == 200;
      }, 20s)) {
    std::fprintf(stderr, "bench_router: the cluster is not ready\n");
    return 1;
  }

  std::vector<int32_t> prompt;
  for (int i = 0; i < 32; ++i) prompt.push_back(1000 + 17 * i);
  const std::string chat_text = "Summarize the plot of a short story about a lighthouse keeper in two sentences.";

  auto post = [&](const json& body) {
    auto res = cli.Post("/v1/completions", body.dump(), "application/json");
    if (!res || res->status != 200) std::fprintf(stderr, "request failed\n");
  };
  // Streams a request; returns the time to the first chunk carrying generated text and sets
  // *total to the time of [DONE].
  auto stream = [&](const std::string& path, const json& body, double* total) {
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
        const json j = json::parse(payload);
        if (first >= 0 || !j.contains("choices") || j["choices"].empty()) continue;
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
  };

  const int warm = std::max(20, reps / 10);
  std::vector<double> d1, r1, d64, d64_total, r_ttft, r64_total, r_chat_ttft;
  for (int i = 0; i < warm + reps; ++i) {
    auto [first, total] = direct.Run(prompt, 1);
    if (i >= warm) d1.push_back(total);
  }
  const json body1 = {{"model", "pdserve"}, {"prompt", prompt}, {"max_tokens", 1}, {"temperature", 0}};
  for (int i = 0; i < warm + reps; ++i) {
    const auto t0 = Clock::now();
    post(body1);
    if (i >= warm) r1.push_back(bench::SecondsSince(t0));
  }
  const json body_stream = {{"model", "pdserve"}, {"prompt", prompt}, {"max_tokens", 64}, {"stream", true}};
  for (int i = 0; i < warm + reps / 2; ++i) {
    auto [first, total] = direct.Run(prompt, 64);
    double routed_total = 0;
    const double ttft = stream("/v1/completions", body_stream, &routed_total);
    if (i >= warm) {
      d64.push_back(first);
      d64_total.push_back(total);
      r_ttft.push_back(ttft);
      r64_total.push_back(routed_total);
    }
  }
  const json chat_body = {{"model", "pdserve"},
                          {"messages", {{{"role", "user"}, {"content", chat_text}}}},
                          {"max_tokens", 4},
                          {"stream", true}};
  for (int i = 0; i < warm + reps / 2; ++i) {
    const double ttft = stream("/v1/chat/completions", chat_body, nullptr);
    if (i >= warm) r_chat_ttft.push_back(ttft);
  }

  // Throughput: concurrent keep-alive clients, 16-token non-streaming completions, 3 s.
  const int clients = 8;
  std::atomic<int64_t> done{0};
  std::atomic<bool> stop{false};
  std::vector<std::thread> threads;
  const json body16 = {{"model", "pdserve"}, {"prompt", prompt}, {"max_tokens", 16}};
  const auto t0 = Clock::now();
  for (int c = 0; c < clients; ++c)
    threads.emplace_back([&] {
      httplib::Client tc("127.0.0.1", port);
      tc.set_keep_alive(true);
      tc.set_tcp_nodelay(true);
      tc.set_read_timeout(30s);
      while (!stop) {
        auto res = tc.Post("/v1/completions", body16.dump(), "application/json");
        if (res && res->status == 200) ++done;
      }
    });
  std::this_thread::sleep_for(3s);
  stop = true;
  for (auto& t : threads) t.join();
  const double tput_s = bench::SecondsSince(t0);
  const double rps = static_cast<double>(done.load()) / tput_s;

  const Stats sd1 = Summarize(d1), sr1 = Summarize(r1), sd64 = Summarize(d64), srt = Summarize(r_ttft),
              src = Summarize(r_chat_ttft), sdt = Summarize(d64_total), srtt = Summarize(r64_total);
  json out = {{"machine", bench::MachineName()},
              {"commit", bench::GitRevision()},
              {"reps", reps},
              {"prompt_tokens", prompt.size()},
              {"direct_job_1_token", ToJson(sd1)},
              {"router_completion_1_token", ToJson(sr1)},
              {"router_overhead_median_us", (sr1.median - sd1.median) * 1e6},
              {"direct_first_token_64", ToJson(sd64)},
              {"router_stream_ttft_64", ToJson(srt)},
              {"router_chat_stream_ttft", ToJson(src)},
              {"direct_64_tokens_total", ToJson(sdt)},
              {"router_stream_64_tokens_total", ToJson(srtt)},
              {"router_per_token_overhead_us", (srtt.median - sdt.median) / 64 * 1e6},
              {"throughput", {{"clients", clients}, {"requests_per_s", rps}, {"tokens_per_s", rps * 16}}}};
  char md[4096];
  std::snprintf(md, sizeof(md),
                "# Router overhead (echo protocol test worker, no model time)\n\n"
                "CPU: %s  \nCommit: %s  \nPrompt: %zu token ids; %d sequential requests per row after a warm-up; one "
                "keep-alive HTTP client.\n\n"
                "| path | median us | p90 us | p99 us |\n|---|---|---|---|\n"
                "| direct: control-plane job to the worker, 1 token | %.0f | %.0f | %.0f |\n"
                "| router: POST /v1/completions, 1 token, non-streaming | %.0f | %.0f | %.0f |\n"
                "| direct: first token of a 64-token job | %.0f | %.0f | %.0f |\n"
                "| router: first streamed token (SSE), 64-token completion | %.0f | %.0f | %.0f |\n"
                "| router: first streamed token, chat (template + tokenize %zu chars) | %.0f | %.0f | %.0f |\n"
                "| direct: all 64 tokens of a job | %.0f | %.0f | %.0f |\n"
                "| router: all 64 tokens streamed ([DONE]) | %.0f | %.0f | %.0f |\n\n"
                "Router overhead per request (median, 1 token): **%.0f us**; per streamed token (64-token stream, "
                "median): **%.1f us**. Throughput through the router with %d concurrent clients, 16-token completions: "
                "%.0f requests/s (%.0f tokens/s). The echo worker emits tokens as fast as it can here, so the stream "
                "rows measure plumbing only.\n",
                bench::MachineName().c_str(), bench::GitRevision().c_str(), prompt.size(), reps, sd1.median * 1e6,
                sd1.p90 * 1e6, sd1.p99 * 1e6, sr1.median * 1e6, sr1.p90 * 1e6, sr1.p99 * 1e6, sd64.median * 1e6,
                sd64.p90 * 1e6, sd64.p99 * 1e6, srt.median * 1e6, srt.p90 * 1e6, srt.p99 * 1e6, chat_text.size(),
                src.median * 1e6, src.p90 * 1e6, src.p99 * 1e6, sdt.median * 1e6, sdt.p90 * 1e6, sdt.p99 * 1e6,
                srtt.median * 1e6, srtt.p90 * 1e6, srtt.p99 * 1e6, (sr1.median - sd1.median) * 1e6,
                (srtt.median - sdt.median) / 64 * 1e6, clients, rps, rps * 16);
  bench::WriteResults("router", out, md);
  return 0;
}
