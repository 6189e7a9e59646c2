#include "engine/sampler.h"

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <unordered_set>

namespace pdserve::engine {

namespace {

uint64_t Mix(uint64_t z) {  // SplitMix64 finalizer
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

}  // namespace

void PenaltyState::SetPrompt(const std::vector<int32_t>& prompt) {
  std::unordered_set<int32_t> seen(prompt.begin(), prompt.end());
  prompt_unique_.assign(seen.begin(), seen.end());
  std::sort(prompt_unique_.begin(), prompt_unique_.end());
}

double SampleUniform(uint64_t seed, int64_t index) {
  const uint64_t z = Mix(Mix(seed + 0x9E3779B97F4A7C15ull) ^ (static_cast<uint64_t>(index) * 0xD1B54A32D192ED03ull));
  return static_cast<double>(z >> 11) * (1.0 / 9007199254740992.0);
}

SampleResult Sampler::Sample(float* logits, int64_t V, const SamplingParams& p, const PenaltyState& pen, uint64_t seed,
                             int64_t index) {
  SampleResult r;
  // Descending logit, lowest id first among equals: one total order for every selection.
  auto better = [logits](int32_t a, int32_t b) { return logits[a] > logits[b] || (logits[a] == logits[b] && a < b); };

  // 1. Logprobs of the raw model distribution.
  double lse = 0.0;
  std::vector<float> raw;
  if (p.logprobs) {
    const float mx = *std::max_element(logits, logits + V);
    double z = 0.0;
    for (int64_t i = 0; i < V; ++i) z += std::exp(static_cast<double>(logits[i]) - mx);
    lse = mx + std::log(z);
    raw.assign(logits, logits + V);
    if (*p.logprobs > 0) {
      const int64_t n = std::min<int64_t>(*p.logprobs, V);
      order_.resize(static_cast<size_t>(V));
      std::iota(order_.begin(), order_.end(), 0);
      std::partial_sort(order_.begin(), order_.begin() + n, order_.end(), better);
      for (int64_t i = 0; i < n; ++i)
        r.top_logprobs.push_back({order_[i], static_cast<float>(logits[order_[i]] - lse)});
    }
  }

  // 2. Logit bias (before the penalties, as vLLM applies it), then the penalties.
  for (const LogitBias& b : p.logit_bias) logits[b.token] += b.bias;
  if (p.repetition_penalty != 1.0f) {
    auto apply = [&](int32_t t) { logits[t] = logits[t] > 0 ? logits[t] / p.repetition_penalty : logits[t] * p.repetition_penalty; };
    for (int32_t t : pen.prompt_unique()) apply(t);
    for (const auto& [t, c] : pen.output_counts())
      if (!std::binary_search(pen.prompt_unique().begin(), pen.prompt_unique().end(), t)) apply(t);
  }
  if (p.frequency_penalty != 0.0f || p.presence_penalty != 0.0f)
    for (const auto& [t, c] : pen.output_counts())
      logits[t] -= p.frequency_penalty * static_cast<float>(c) + (c > 0 ? p.presence_penalty : 0.0f);

  auto finish = [&](int32_t token) {
    r.token = token;
    if (p.logprobs) r.logprob = static_cast<float>(raw[static_cast<size_t>(token)] - lse);
    return r;
  };

  // 3. Greedy: the first index holding the maximum (a max is exact in any order).
  if (p.greedy()) {
    float mx = logits[0];
    int64_t i = 0;
#if defined(__AVX2__)
    if (V >= 8) {
      __m256 m = _mm256_loadu_ps(logits);
      for (i = 8; i + 8 <= V; i += 8) m = _mm256_max_ps(m, _mm256_loadu_ps(logits + i));
      alignas(32) float lanes[8];
      _mm256_store_ps(lanes, m);
      for (float v : lanes) mx = std::max(mx, v);
    }
#endif
    for (; i < V; ++i) mx = std::max(mx, logits[i]);
    int32_t best = 0;
    while (best < V - 1 && !(logits[best] == mx)) ++best;
    if (std::isnan(mx)) best = 0;  // NaN logits: a defined (if useless) answer
    return finish(best);
  }

  // 4. Temperature, truncation, draw.
  for (int64_t i = 0; i < V; ++i) logits[i] /= p.temperature;
  order_.resize(static_cast<size_t>(V));
  std::iota(order_.begin(), order_.end(), 0);
  int64_t n = V;          // candidates: order_[0, n)
  int64_t sorted = 0;     // order_[0, sorted) is in `better` order
  if (p.top_k > 0 && p.top_k < V) {
    n = p.top_k;
    std::partial_sort(order_.begin(), order_.begin() + n, order_.end(), better);
    sorted = n;
  }
  float mx = -INFINITY;
  for (int64_t i = 0; i < n; ++i) mx = std::max(mx, logits[order_[i]]);
  probs_.resize(static_cast<size_t>(V));
  double z = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    const int32_t t = order_[i];
    probs_[t] = static_cast<float>(std::exp(static_cast<double>(logits[t]) - mx));
    z += probs_[t];
  }
  if (p.top_p < 1.0f) {
    // Smallest descending prefix with mass >= top_p * z; sort progressively larger prefixes.
    const double target = static_cast<double>(p.top_p) * z;
    int64_t want = std::min<int64_t>(n, 64);
    for (;;) {
      if (sorted < want) {
        std::partial_sort(order_.begin(), order_.begin() + want, order_.begin() + n, better);
        sorted = want;
      }
      double cum = 0.0;
      int64_t keep = 0;
      while (keep < sorted && cum < target) cum += probs_[order_[keep++]];
      if (cum >= target || sorted == n) {
        n = std::max<int64_t>(keep, 1);
        break;
      }
      want = std::min<int64_t>(n, want * 4);
    }
  }
  if (p.min_p > 0.0f) {  // relative to the most likely token, whose unnormalized prob is 1
    int64_t w = 0;
    for (int64_t i = 0; i < n; ++i)
      if (probs_[order_[i]] >= p.min_p) order_[w++] = order_[i];
    n = std::max<int64_t>(w, 1);
  }
  double kept = 0.0;
  for (int64_t i = 0; i < n; ++i) kept += probs_[order_[i]];
  const double target = SampleUniform(seed, index) * kept;
  double cum = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    cum += probs_[order_[i]];
    if (cum > target) return finish(order_[i]);
  }
  return finish(order_[n - 1]);
}

}  // namespace pdserve::engine
