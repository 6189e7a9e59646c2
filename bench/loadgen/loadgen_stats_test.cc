// The load generator's arithmetic and parsing: percentiles, TPOT / ITL, SLO and goodput,
// SSE framing split at every byte, stream chunk parsing, datasets, Poisson arrivals and the
// RSS growth rule of the soak.
#include <gtest/gtest.h>

#include <cmath>
#include <numeric>

#include "bench/loadgen/client.h"
#include "bench/loadgen/dataset.h"
#include "bench/loadgen/driver.h"
#include "bench/loadgen/stats.h"
#include "planner/cluster_sim.h"
#include "services/testing/sse_parser.h"

namespace pdserve::loadgen {
namespace {

using services::testing::ParseStreamChunk;
using services::testing::SseParser;

TEST(Percentile, InterpolatesBetweenClosestRanks) {
  EXPECT_DOUBLE_EQ(Percentile({5, 1, 4, 2, 3}, 50), 3);
  EXPECT_DOUBLE_EQ(Percentile({1, 2, 3, 4, 5}, 90), 4.6);
  EXPECT_DOUBLE_EQ(Percentile({1, 2, 3, 4, 5}, 0), 1);
  EXPECT_DOUBLE_EQ(Percentile({1, 2, 3, 4, 5}, 100), 5);
  std::vector<double> v(100);
  std::iota(v.begin(), v.end(), 1.0);
  EXPECT_NEAR(Percentile(v, 99), 99.01, 1e-9);
  EXPECT_NEAR(Percentile(v, 50), 50.5, 1e-9);
  EXPECT_DOUBLE_EQ(Percentile({7}, 99), 7);
  EXPECT_DOUBLE_EQ(Percentile({}, 50), 0);
}

TEST(Summarize, LatencyStats) {
  const LatencyStats s = Summarize(std::vector<double>{0.4, 0.1, 0.3, 0.2});
  EXPECT_EQ(s.count, 4u);
  EXPECT_DOUBLE_EQ(s.mean, 0.25);
  EXPECT_DOUBLE_EQ(s.p50, 0.25);
  EXPECT_DOUBLE_EQ(s.max, 0.4);
  EXPECT_NEAR(s.p99, 0.397, 1e-12);
}

RequestRecord Rec(double send, double ttft, double e2e, int64_t out, std::vector<double> chunks = {}) {
  RequestRecord r;
  r.kind = "short";
  r.ok = true;
  r.send_s = send;
  r.ttft_s = ttft;
  r.e2e_s = e2e;
  r.output_tokens = out;
  r.prompt_tokens = 10;
  r.chunk_s = std::move(chunks);
  return r;
}

TEST(Tpot, ExcludesTheFirstToken) {
  EXPECT_DOUBLE_EQ(*Tpot(Rec(0, 0.5, 1.5, 11)), 0.1);
  EXPECT_FALSE(Tpot(Rec(0, 0.5, 0.5, 1)).has_value());
  RequestRecord failed = Rec(0, 0.5, 1.5, 11);
  failed.ok = false;
  EXPECT_FALSE(Tpot(failed).has_value());
}

TEST(Slo, BothLimits) {
  const Slo slo{0.5, 0.05};
  EXPECT_TRUE(MeetsSlo(Rec(0, 0.4, 0.4 + 10 * 0.05, 11), slo));
  EXPECT_FALSE(MeetsSlo(Rec(0, 0.6, 0.7, 3), slo));          // TTFT over
  EXPECT_FALSE(MeetsSlo(Rec(0, 0.4, 0.4 + 10 * 0.06, 11), slo));  // TPOT over
  EXPECT_TRUE(MeetsSlo(Rec(0, 0.4, 0.4, 1), slo));           // one token: TTFT only
  RequestRecord failed = Rec(0, 0.1, 0.2, 3);
  failed.ok = false;
  EXPECT_FALSE(MeetsSlo(failed, slo));
}

TEST(Summarize, ThroughputGoodputAndKinds) {
  // 4 requests over 10 s (first send 0, last completion 10): 2 meet the SLO, 1 too slow, 1 failed.
  std::vector<RequestRecord> rs = {Rec(0, 0.2, 2.0, 10, {0.2, 0.4, 1.0}), Rec(1, 0.3, 3.0, 10),
                                   Rec(2, 0.3, 8.0, 10), Rec(3, 0.1, 0.1, 0)};
  rs[1].kind = "long";
  rs[3].ok = false;
  rs[3].error = "HTTP 429: busy";
  const RunSummary s = Summarize(rs, Slo{0.5, 0.35});
  EXPECT_EQ(s.requests, 4u);
  EXPECT_EQ(s.completed, 3u);
  EXPECT_EQ(s.failed, 1u);
  EXPECT_DOUBLE_EQ(s.duration_s, 10);
  EXPECT_DOUBLE_EQ(s.request_throughput, 0.3);
  EXPECT_DOUBLE_EQ(s.output_token_throughput, 3.0);
  EXPECT_DOUBLE_EQ(s.goodput, 0.2);  // rs[0] (tpot 0.2) and rs[1] (0.3); rs[2] has tpot 0.855
  EXPECT_DOUBLE_EQ(s.slo_attainment, 0.5);
  EXPECT_EQ(s.itl.count, 2u);
  EXPECT_NEAR(s.itl.max, 0.6, 1e-12);
  ASSERT_EQ(s.first_errors.size(), 1u);
  EXPECT_EQ(s.first_errors[0], "HTTP 429: busy");
  const RunSummary longs = Summarize(rs, Slo{0.5, 0.35}, "long");
  EXPECT_EQ(longs.requests, 1u);
  EXPECT_DOUBLE_EQ(longs.duration_s, 10);  // the whole run's
  EXPECT_DOUBLE_EQ(longs.goodput, 0.1);
}

TEST(SseParser, EventsSurviveEverySplit) {
  const std::string stream =
      ": keep-alive\r\n\r\ndata: {\"a\":1}\n\nevent: x\ndata: line1\ndata: line2\n\ndata:[DONE]\r\n\r\n";
  const std::vector<std::string> want = {"{\"a\":1}", "line1\nline2", "[DONE]"};
  for (size_t cut = 0; cut <= stream.size(); ++cut) {
    SseParser p;
    std::vector<std::string> got;
    auto on = [&](std::string_view d) { got.emplace_back(d); };
    p.Feed(std::string_view(stream).substr(0, cut), on);
    p.Feed(std::string_view(stream).substr(cut), on);
    EXPECT_EQ(got, want) << "split at " << cut;
    EXPECT_EQ(p.pending_bytes(), 0u);
  }
  SseParser p;  // byte by byte
  std::vector<std::string> got;
  for (char c : stream) p.Feed(std::string_view(&c, 1), [&](std::string_view d) { got.emplace_back(d); });
  EXPECT_EQ(got, want);
}

TEST(SseParser, TruncatedEventIsNotReported) {
  SseParser p;
  int events = 0;
  p.Feed("data: {\"partial\"", [&](std::string_view) { ++events; });
  EXPECT_EQ(events, 0);
  EXPECT_GT(p.pending_bytes(), 0u);
}

TEST(ParseStreamChunk, CompletionChatUsageErrorDone) {
  auto c = ParseStreamChunk(R"({"choices":[{"index":0,"text":"he","finish_reason":null}],"usage":null})");
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->text, "he");
  EXPECT_FALSE(c->finish_reason);
  c = ParseStreamChunk(R"({"choices":[{"delta":{"content":"llo"},"finish_reason":"length"}]})");
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->text, "llo");
  EXPECT_EQ(*c->finish_reason, "length");
  c = ParseStreamChunk(R"({"choices":[],"usage":{"prompt_tokens":7,"completion_tokens":32,"total_tokens":39}})");
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(*c->completion_tokens, 32);
  EXPECT_EQ(*c->prompt_tokens, 7);
  c = ParseStreamChunk(R"({"error":{"message":"worker lost","type":"service_unavailable"}})");
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(*c->error, "worker lost");
  c = ParseStreamChunk("[DONE]");
  ASSERT_TRUE(c.ok());
  EXPECT_TRUE(c->done);
  EXPECT_FALSE(ParseStreamChunk("{not json").ok());
  EXPECT_FALSE(ParseStreamChunk(R"({"choices":{}})").ok());
}

TEST(Dataset, LengthsKindsAndErrors) {
  DatasetOptions o;
  o.name = "mixed";
  o.num_requests = 100;
  o.input_len = 100;
  o.output_len = 50;
  o.range_ratio = 0.2;
  o.long_input_len = 1000;
  o.long_fraction = 0.1;
  auto d = MakeDataset(o);
  ASSERT_TRUE(d.ok());
  int longs = 0;
  for (const auto& r : d.value()) {
    if (r.kind == "long") {
      ++longs;
      EXPECT_EQ(r.prompt_ids.size(), 1000u);
      EXPECT_EQ(r.max_tokens, o.long_output_len);
    } else {
      EXPECT_GE(r.prompt_len, 80);
      EXPECT_LE(r.prompt_len, 120);
      EXPECT_GE(r.max_tokens, 40);
      EXPECT_LE(r.max_tokens, 60);
      EXPECT_EQ(r.prompt_ids.size(), static_cast<size_t>(r.prompt_len));
    }
    for (int32_t id : r.prompt_ids) ASSERT_TRUE(id >= o.token_lo && id < o.token_hi);
  }
  EXPECT_EQ(longs, 10);
  EXPECT_EQ(d.value()[0].kind, "short");  // decoding is under way before the first long prompt
  o.chat = true;
  o.name = "long";
  o.num_requests = 2;
  d = MakeDataset(o);
  ASSERT_TRUE(d.ok());
  EXPECT_TRUE(d.value()[0].prompt_ids.empty());
  EXPECT_FALSE(d.value()[0].prompt_text.empty());
  o.name = "sharegpt";
  EXPECT_FALSE(MakeDataset(o).ok());
  o.name = "random";
  o.token_hi = o.token_lo;
  EXPECT_FALSE(MakeDataset(o).ok());
}

TEST(Dataset, PoissonArrivalsHaveTheRequestedRate) {
  std::vector<RequestSpec> specs(4000);
  AssignPoissonArrivals(&specs, 20.0, 3);
  for (size_t i = 1; i < specs.size(); ++i) ASSERT_GE(specs[i].arrival_s, specs[i - 1].arrival_s);
  const double rate = static_cast<double>(specs.size() - 1) / specs.back().arrival_s;
  EXPECT_NEAR(rate, 20.0, 1.5);  // 4000 exponential gaps: the mean is within ~1.6% (1 sigma)
  AssignPoissonArrivals(&specs, INFINITY, 3);
  EXPECT_EQ(specs.back().arrival_s, 0);
}

// The planner replays a measured run's schedule (planner_validate_local): its arrivals for a
// seed must be the load generator's, to the bit.
TEST(Dataset, PlannerDrawsTheSameArrivals) {
  for (const double rate : {1.25, 2.5, 40.0}) {
    std::vector<RequestSpec> specs(64);
    AssignPoissonArrivals(&specs, rate, 1);
    const std::vector<double> planned = planner::PoissonArrivals(64, rate, 1);
    ASSERT_EQ(planned.size(), specs.size());
    for (size_t i = 0; i < specs.size(); ++i) EXPECT_EQ(planned[i], specs[i].arrival_s) << "rate " << rate << ", request " << i;
    EXPECT_GT(planned.back(), 0);
  }
  EXPECT_NE(planner::PoissonArrivals(8, 2.5, 2), planner::PoissonArrivals(8, 2.5, 1));
}

TEST(RequestBody, CompletionAndChat) {
  RequestSpec s;
  s.prompt_ids = {1, 2, 3};
  s.prompt_text = "hello";
  s.max_tokens = 8;
  Target t;
  t.model = "m";
  auto j = nlohmann::json::parse(RequestBody(t, s));
  EXPECT_EQ(j["prompt"], nlohmann::json({1, 2, 3}));
  EXPECT_EQ(j["stream"], true);
  EXPECT_EQ(j["ignore_eos"], true);
  EXPECT_EQ(j["stream_options"]["include_usage"], true);
  t.chat = true;
  j = nlohmann::json::parse(RequestBody(t, s));
  EXPECT_FALSE(j.contains("prompt"));
  EXPECT_EQ(j["messages"][0]["content"], "hello");
}

TEST(RssGrowth, WarmupBaselineAndTailMax) {
  RssSeries s;
  s.t_s = {0, 1, 2, 3, 4, 5, 6, 7, 8};
  s.rss_kib = {100, 500, 600, 610, 620, 630, 700, 650, 640};
  ComputeRssGrowth(&s);
  EXPECT_EQ(s.baseline_kib, 600);   // the last sample at or before t = 2 (a quarter of 8 s)
  EXPECT_EQ(s.final_max_kib, 700);  // the max from t = 6 on
  EXPECT_EQ(s.growth_kib(), 100);
  EXPECT_GT(ReadRssKib(getpid()), 0);
  EXPECT_EQ(ReadRssKib(0x7ffffff0), -1);
}

}  // namespace
}  // namespace pdserve::loadgen
