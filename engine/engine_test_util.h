// Helpers shared by the engine tests: a tiny model made once per test binary, the greedy
// reference (Model::Forward on the same prefill chunk grid, then one token per step), a
// thread-safe collector of token events, and the prefix-cache tests' prompts and outputs.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <vector>

#include "engine/engine.h"
#include "model/model.h"
#include "model/test_util.h"

namespace pdserve::engine::testing {

// The "tiny" preset (seed 5), loaded once with a 2-thread pool.
const model::Model& TinyModel();

// Greedy tokens of `prompt` run alone: prompt chunks [k*C, (k+1)*C), then decode steps; stops
// after max_tokens or when prompt + output reaches max_len.
std::vector<int32_t> ReferenceGreedy(const model::Model& m, const std::vector<int32_t>& prompt, int64_t max_tokens,
                                     int64_t chunk, int64_t max_len = INT64_MAX);

class EventCollector {
 public:
  EventCallback Callback();
  // Waits until `n` requests finished or the deadline passes; returns whether they did.
  bool WaitFinished(size_t n, std::chrono::seconds deadline);
  std::map<RequestId, std::vector<TokenEvent>> events() const;
  std::vector<int32_t> Tokens(RequestId id) const;
  const TokenEvent* Last(RequestId id) const;  // REQUIRES: valid until the next event
  size_t finished() const;

 private:
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::map<RequestId, std::vector<TokenEvent>> events_;
  size_t finished_ = 0;
};

// Steps `engine` on this thread until Idle() (at most max_steps); returns whether it got idle.
bool RunUntilIdle(Engine* engine, int64_t max_steps = 100000);

// Prefix-cache tests (engine_prefix_test, engine_disk_tier_test): prompts, sampling and one
// request's whole output, compared bitwise with a cold engine's.
// `n` random token ids below 1000.
std::vector<int32_t> Random(std::mt19937* rng, int64_t n);
std::vector<int32_t> Concat(std::vector<int32_t> a, const std::vector<int32_t>& b);
// Greedy with 2 logprobs; seeded top-k / top-p sampling with a repetition penalty and 1 logprob.
SamplingParams Greedy(int32_t max_tokens);
SamplingParams Seeded(int32_t max_tokens, uint64_t seed);

// What a request produced: its tokens, their logprobs (compared bitwise), how it ended.
struct Output {
  std::vector<int32_t> tokens;
  std::vector<float> logprobs;
  FinishReason reason = FinishReason::kNone;
  int64_t cached = -1;  // TokenEvent::cached_prompt_tokens
  bool operator==(const Output& o) const;
};
// Request `id`'s output among the collected events.
Output Collect(const EventCollector& ev, RequestId id);
// Runs one request to its end on `e` (stepped here).
Output Generate(Engine* e, const std::vector<int32_t>& prompt, const SamplingParams& p);

// The prefix-cache tests' engine: blocks of kPrefixTestBlock tokens, first chunk kPrefixTestChunk,
// a pool of n_blocks blocks in `latent`, up to 16 sequences and 128 tokens a step, seed 5.
inline constexpr int64_t kPrefixTestBlock = 16;
inline constexpr int64_t kPrefixTestChunk = 32;
EngineOptions PrefixTestOptions(int64_t n_blocks, bool cache = true,
                                KvLatentFormat latent = KvLatentFormat::kFp8Blockwise);
// Engine::Create on TinyModel(); aborts the test binary when it fails.
std::unique_ptr<Engine> MakeEngine(const EngineOptions& o);

}  // namespace pdserve::engine::testing
