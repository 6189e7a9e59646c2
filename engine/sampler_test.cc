// Sampler tests: parameter validation, greedy / penalties / logprobs by hand, seeded draws
// repeat exactly, and the empirical distributions of temperature, top-k, top-p and min-p
// sampling match their definitions on a fixed logits vector (chi-square, fixed seeds).
#include "engine/sampler.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>

namespace pdserve::engine {
namespace {

TEST(SamplingParamsTest, RejectsOutOfRangeValues) {
  auto bad = [](auto edit) {
    SamplingParams p;
    edit(p);
    return p.Validate(100);
  };
  EXPECT_TRUE(bad([](SamplingParams&) {}).ok());
  EXPECT_NE(bad([](SamplingParams& p) { p.temperature = -0.1f; }).message().find("temperature"), std::string::npos);
  EXPECT_EQ(bad([](SamplingParams& p) { p.temperature = NAN; }).code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad([](SamplingParams& p) { p.top_p = 0.0f; }).message().find("top_p"), std::string::npos);
  EXPECT_EQ(bad([](SamplingParams& p) { p.top_p = 1.01f; }).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(bad([](SamplingParams& p) { p.top_k = -2; }).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(bad([](SamplingParams& p) { p.min_p = 1.5f; }).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(bad([](SamplingParams& p) { p.presence_penalty = 2.5f; }).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(bad([](SamplingParams& p) { p.frequency_penalty = -3.0f; }).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(bad([](SamplingParams& p) { p.repetition_penalty = 0.0f; }).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(bad([](SamplingParams& p) { p.max_tokens = 0; }).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(bad([](SamplingParams& p) { p.logprobs = 21; }).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(bad([](SamplingParams& p) { p.stop_token_ids = {100}; }).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(bad([](SamplingParams& p) { p.stop = {""}; }).code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(bad([](SamplingParams& p) { p.logit_bias = {{0, -100.0f}, {99, 100.0f}}; }).ok());
  EXPECT_NE(bad([](SamplingParams& p) { p.logit_bias = {{100, 1.0f}}; }).message().find("logit_bias token id 100"),
            std::string::npos);
  EXPECT_NE(bad([](SamplingParams& p) { p.logit_bias = {{3, 100.5f}}; }).message().find("[-100, 100]"), std::string::npos);
  EXPECT_EQ(bad([](SamplingParams& p) { p.logit_bias = {{3, NAN}}; }).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(bad([](SamplingParams& p) { p.logit_bias.assign(SamplingParams::kMaxLogitBias + 1, {1, 1.0f}); }).code(),
            StatusCode::kInvalidArgument);
}

// logit_bias is added before the penalties and the greedy choice; the reported logprobs stay
// those of the raw model distribution.
TEST(SamplerTest, LogitBiasShiftsTheChoiceButNotTheRawLogprobs) {
  Sampler s;
  PenaltyState none;
  SamplingParams p;
  p.temperature = 0.0f;
  p.logprobs = 1;
  p.logit_bias = {{3, 5.0f}, {1, -100.0f}};
  std::vector<float> l = {1.0f, 3.0f, 2.0f, -1.0f};
  const SampleResult r = s.Sample(l.data(), 4, p, none, 1, 0);
  EXPECT_EQ(r.token, 3);  // -1 + 5 beats 2
  double z = 0;
  for (float v : {1.0f, 3.0f, 2.0f, -1.0f}) z += std::exp(v);
  EXPECT_NEAR(r.logprob, -1.0 - std::log(z), 1e-5);
  ASSERT_EQ(r.top_logprobs.size(), 1u);
  EXPECT_EQ(r.top_logprobs[0].first, 1);
  // Sampled, a -100 bias all but bans the token and +100 all but forces it.
  p.temperature = 1.0f;
  p.logprobs.reset();
  p.logit_bias = {{2, 100.0f}};
  for (int64_t i = 0; i < 50; ++i) {
    l = {1.0f, 3.0f, 2.0f, -1.0f};
    EXPECT_EQ(s.Sample(l.data(), 4, p, none, 7, i).token, 2);
  }
}

TEST(SamplerTest, GreedyPenaltiesAndLogprobs) {
  Sampler s;
  PenaltyState none;
  SamplingParams greedy;
  greedy.temperature = 0.0f;
  greedy.logprobs = 2;
  std::vector<float> l = {1.0f, 3.0f, 3.0f, -1.0f};
  const SampleResult r = s.Sample(l.data(), 4, greedy, none, 1, 0);
  EXPECT_EQ(r.token, 1);  // tie: lowest id
  double z = 0;
  for (float v : {1.0f, 3.0f, 3.0f, -1.0f}) z += std::exp(v);
  EXPECT_NEAR(r.logprob, 3.0 - std::log(z), 1e-5);
  ASSERT_EQ(r.top_logprobs.size(), 2u);
  EXPECT_EQ(r.top_logprobs[0].first, 1);
  EXPECT_EQ(r.top_logprobs[1].first, 2);

  // Repetition divides positive logits / multiplies negative ones of seen tokens; frequency
  // and presence subtract per output occurrence.
  PenaltyState pen;
  pen.SetPrompt({0, 3});
  pen.AddOutput(1);
  pen.AddOutput(1);
  SamplingParams p = greedy;
  p.logprobs.reset();
  p.repetition_penalty = 2.0f;
  p.frequency_penalty = 0.5f;
  p.presence_penalty = 0.25f;
  l = {4.0f, 3.0f, 1.4f, -1.0f};
  s.Sample(l.data(), 4, p, pen, 1, 0);
  EXPECT_FLOAT_EQ(l[0], 2.0f);
  EXPECT_FLOAT_EQ(l[1], 1.5f - 1.0f - 0.25f);
  EXPECT_FLOAT_EQ(l[2], 1.4f);
  EXPECT_FLOAT_EQ(l[3], -2.0f);
  l = {4.0f, 3.0f, 2.1f, -1.0f};
  EXPECT_EQ(s.Sample(l.data(), 4, p, pen, 1, 0).token, 2);  // 2.0 (token 0) < 2.1
}

TEST(SamplerTest, SeededDrawsRepeat) {
  Sampler s;
  PenaltyState none;
  SamplingParams p;
  p.temperature = 1.3f;
  p.top_p = 0.9f;
  std::vector<float> base(500);
  for (size_t i = 0; i < base.size(); ++i) base[i] = std::sin(static_cast<float>(i) * 0.37f) * 3.0f;
  std::vector<int32_t> a, b, c;
  for (int64_t i = 0; i < 50; ++i) {
    auto l1 = base, l2 = base, l3 = base;
    a.push_back(s.Sample(l1.data(), 500, p, none, 42, i).token);
    b.push_back(s.Sample(l2.data(), 500, p, none, 42, i).token);
    c.push_back(s.Sample(l3.data(), 500, p, none, 43, i).token);
  }
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
}

// Expected distribution from the definitions, computed independently in double.
std::vector<double> Expected(const std::vector<float>& logits, const SamplingParams& p) {
  const int n = static_cast<int>(logits.size());
  std::vector<double> l(logits.begin(), logits.end());
  for (auto& v : l) v /= p.temperature;
  std::vector<int> order(n);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return l[a] > l[b]; });
  std::vector<bool> keep(n, true);
  if (p.top_k > 0)
    for (int i = p.top_k; i < n; ++i) keep[order[i]] = false;
  double z = 0;
  for (int i = 0; i < n; ++i) if (keep[i]) z += std::exp(l[i] - l[order[0]]);
  if (p.top_p < 1.0f) {
    double cum = 0;
    bool reached = false;
    for (int i = 0; i < n; ++i) {
      const int t = order[i];
      if (!keep[t]) continue;
      if (reached) keep[t] = false;
      cum += std::exp(l[t] - l[order[0]]) / z;
      if (cum >= p.top_p) reached = true;
    }
  }
  for (int i = 0; i < n; ++i)
    if (std::exp(l[i] - l[order[0]]) < p.min_p) keep[i] = false;
  std::vector<double> out(n, 0.0);
  double s = 0;
  for (int i = 0; i < n; ++i) if (keep[i]) s += (out[i] = std::exp(l[i] - l[order[0]]));
  for (auto& v : out) v /= s;
  return out;
}

TEST(SamplerTest, DistributionsMatchDefinitions) {
  const std::vector<float> logits = {2.0f, 1.5f, 1.4f, 0.9f, 0.5f, 0.2f, 0.0f, -0.3f, -0.7f, -1.0f, -1.6f, -2.5f};
  struct Case { const char* name; float temperature; int32_t top_k; float top_p; float min_p; };
  const Case cases[] = {{"temperature 1", 1.0f, 0, 1.0f, 0.0f}, {"temperature 0.6", 0.6f, 0, 1.0f, 0.0f},
                        {"temperature 2", 2.0f, 0, 1.0f, 0.0f}, {"top-k 4", 1.0f, 4, 1.0f, 0.0f},
                        {"top-p 0.7", 1.0f, 0, 0.7f, 0.0f},     {"min-p 0.2", 1.0f, 0, 1.0f, 0.2f},
                        {"top-k 6 top-p 0.8 T 1.5", 1.5f, 6, 0.8f, 0.0f}};
  const int64_t N = 60000;
  Sampler s;
  PenaltyState none;
  for (const Case& c : cases) {
    SamplingParams p;
    p.temperature = c.temperature;
    p.top_k = c.top_k;
    p.top_p = c.top_p;
    p.min_p = c.min_p;
    const std::vector<double> want = Expected(logits, p);
    std::vector<int64_t> counts(logits.size(), 0);
    for (int64_t i = 0; i < N; ++i) {
      auto l = logits;
      ++counts[static_cast<size_t>(s.Sample(l.data(), static_cast<int64_t>(l.size()), p, none, 1000 + i, i).token)];
    }
    double chi2 = 0;
    int df = -1;
    for (size_t t = 0; t < logits.size(); ++t) {
      if (want[t] == 0.0) {
        EXPECT_EQ(counts[t], 0) << c.name << ": token " << t << " is outside the kept set";
        continue;
      }
      const double e = want[t] * N;
      chi2 += (counts[t] - e) * (counts[t] - e) / e;
      ++df;
    }
    // ~5 standard deviations above the chi-square mean (df): fails only on a real mismatch.
    EXPECT_LT(chi2, df + 5.0 * std::sqrt(2.0 * df) + 5.0) << c.name << " chi2 " << chi2 << " df " << df;
  }
}

}  // namespace
}  // namespace pdserve::engine
