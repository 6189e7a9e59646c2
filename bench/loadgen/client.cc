#include "bench/loadgen/client.h"

#include <httplib.h>

#include <nlohmann/json.hpp>

#include "services/testing/sse_parser.h"

namespace pdserve::loadgen {

using services::testing::ParseStreamChunk;
using services::testing::SseParser;
using services::testing::StreamChunk;

namespace {
double Since(Clock::time_point t0, Clock::time_point t) { return std::chrono::duration<double>(t - t0).count(); }
}  // namespace

std::string RequestBody(const Target& target, const RequestSpec& spec) {
  nlohmann::json body = {{"model", target.model},
                         {"max_tokens", spec.max_tokens},
                         {"stream", true},
                         {"stream_options", {{"include_usage", true}}},
                         {"ignore_eos", true},
                         {"temperature", 0}};
  if (target.chat)
    body["messages"] = {{{"role", "user"}, {"content", spec.prompt_text}}};
  else
    body["prompt"] = spec.prompt_ids;
  if (spec.return_token_ids) body["return_token_ids"] = true;
  return body.dump();
}

StreamClient::StreamClient(Target target) : target_(std::move(target)) {
  cli_ = std::make_unique<httplib::Client>(target_.host, target_.port);
  cli_->set_keep_alive(true);
  cli_->set_tcp_nodelay(true);  // else Nagle + delayed ACK add 40 ms per request
  cli_->set_connection_timeout(std::chrono::seconds(10));
  cli_->set_read_timeout(target_.timeout);
}

StreamClient::~StreamClient() = default;

RequestRecord StreamClient::Run(const RequestSpec& spec, Clock::time_point run_start) {
  RequestRecord rec;
  rec.kind = spec.kind;
  rec.prompt_tokens = spec.prompt_len;
  httplib::Request req;
  req.method = "POST";
  req.path = target_.chat ? "/v1/chat/completions" : "/v1/completions";
  req.body = RequestBody(target_, spec);
  req.set_header("Content-Type", "application/json");
  SseParser parser;
  std::string raw;  // the start of the body, for error messages
  bool done = false;
  std::optional<int64_t> usage_out;
  int64_t text_chunks = 0;
  Clock::time_point t0;
  req.content_receiver = [&](const char* data, size_t n, uint64_t, uint64_t) {
    const auto now = Clock::now();
    if (raw.size() < 512) raw.append(data, std::min(n, 512 - raw.size()));
    parser.Feed(std::string_view(data, n), [&](std::string_view event) {
      auto chunk = ParseStreamChunk(event);
      if (!chunk.ok()) {
        if (rec.error.empty()) rec.error = chunk.status().message();
        return;
      }
      const StreamChunk& c = chunk.value();
      if (c.done) done = true;
      if (c.error && rec.error.empty()) rec.error = "error event: " + *c.error;
      if (c.completion_tokens) usage_out = c.completion_tokens;
      if (c.prompt_tokens) rec.prompt_tokens = *c.prompt_tokens;
      if (c.cached_tokens) rec.cached_tokens = *c.cached_tokens;
      rec.output_token_ids.insert(rec.output_token_ids.end(), c.token_ids.begin(), c.token_ids.end());
      if (!c.text.empty()) {
        const double t = Since(t0, now);
        if (rec.ttft_s < 0) rec.ttft_s = t;
        rec.chunk_s.push_back(t);
        ++text_chunks;
      }
    });
    return true;
  };
  t0 = Clock::now();
  rec.send_s = Since(run_start, t0);
  auto res = cli_->send(req);
  const auto end = Clock::now();
  rec.e2e_s = Since(t0, end);
  if (!res) {
    rec.error = "HTTP: " + httplib::to_string(res.error());
  } else if (res->status != 200) {
    rec.error = "HTTP " + std::to_string(res->status) + ": " + raw.substr(0, 200);
  } else if (rec.error.empty() && !done) {
    rec.error = "stream ended without [DONE]";
  }
  rec.output_tokens = usage_out.value_or(text_chunks);
  rec.ok = rec.error.empty();
  return rec;
}

}  // namespace pdserve::loadgen
