// ActiveRequest: the hand-off point between the router's control thread, which receives a
// request's token events from its workers, and the HTTP thread serving the client, which
// consumes them. Events are queued in arrival order with their arrival time (TTFT and
// inter-token latency are measured from these stamps).
//
// Thread-safety: Push from the control thread (or any thread failing the request), WaitEvents
// from the one HTTP thread serving the request. Shared ownership (RouterCore's route table and
// the HTTP side); the last owner frees it.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "common/status.h"
#include "services/control/control_messages.h"

namespace pdserve::router {

struct RequestEvent {
  std::vector<int32_t> tokens;
  std::vector<services::TokenLogprob> logprobs;  // empty or parallel to tokens
  FinishReason finish = FinishReason::kNone;
  Status error;                                  // non-OK ends the request with an error
  std::chrono::steady_clock::time_point received{};

  bool finishing() const { return finish != FinishReason::kNone || !error.ok(); }
};

class ActiveRequest {
 public:
  ActiveRequest(uint64_t id, std::string tag, uint32_t prompt_tokens, uint32_t max_tokens,
                std::chrono::steady_clock::time_point arrival)
      : id_(id), tag_(std::move(tag)), prompt_tokens_(prompt_tokens), max_tokens_(max_tokens), arrival_(arrival) {}

  uint64_t id() const { return id_; }
  const std::string& tag() const { return tag_; }
  uint32_t prompt_tokens() const { return prompt_tokens_; }
  uint32_t max_tokens() const { return max_tokens_; }
  std::chrono::steady_clock::time_point arrival() const { return arrival_; }
  // Prompt tokens a worker's prefix cache supplied (its finishing event says; the latest
  // attempt's report wins). Any thread.
  void SetCachedPromptTokens(uint32_t n) { cached_prompt_tokens_.store(n, std::memory_order_relaxed); }
  uint32_t cached_prompt_tokens() const { return cached_prompt_tokens_.load(std::memory_order_relaxed); }

  // Queues an event (stamped with its arrival time if unset). Events after a finishing one are
  // dropped: a request ends exactly once.
  void Push(RequestEvent event);

  // Moves every queued event to *out (appending). Waits until at least one is queued or `until`
  // passes; returns false on timeout with nothing appended.
  bool WaitEvents(std::chrono::steady_clock::time_point until, std::vector<RequestEvent>* out);

  bool ended() const;

  // Optional: called after every queued event (outside the lock, on the pushing thread), so a
  // front that multiplexes many requests on one thread (request_api_server.h) learns which
  // request has output without a thread blocked in WaitEvents per request. It runs under
  // RouterCore's lock: it must not block or call into RouterCore. Events queued before it was
  // set are the caller's to check.
  void SetListener(std::function<void()> listener);

 private:
  const uint64_t id_;
  const std::string tag_;
  const uint32_t prompt_tokens_;
  const uint32_t max_tokens_;
  const std::chrono::steady_clock::time_point arrival_;
  std::atomic<uint32_t> cached_prompt_tokens_{0};

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<RequestEvent> events_;
  bool ended_ = false;  // a finishing event was pushed
  std::shared_ptr<const std::function<void()>> listener_;  // shared: Push copies it per event
};

}  // namespace pdserve::router
