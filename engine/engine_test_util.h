// Helpers shared by the engine tests: a tiny model made once per test binary, the greedy
// reference (Model::Forward on the same prefill chunk grid, then one token per step), and a
// thread-safe collector of token events.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>

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

}  // namespace pdserve::engine::testing
