// ChoiceSet: the n choices of one HTTP request (OpenAI's `n`), each a GenerationSession of its
// own job (request_prep.h: SubmitChoices), waited on together by the one HTTP thread serving
// the request. n == 1 is the common case and costs one extra mutex per event.
//
// Waiting: every choice's ActiveRequest signals one shared notifier (ActiveRequest::SetListener),
// so Next() sleeps until any choice has output instead of polling each in turn.
//
// Thread-safety: one thread drives it (Next / Cancel); the listeners run on RouterCore's
// control thread and only touch the shared notifier.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string_view>
#include <utility>
#include <vector>

#include "services/router/generation_session.h"

namespace pdserve::router {

class ChoiceSet {
 public:
  using Clock = std::chrono::steady_clock;

  // REQUIRES: sessions non-empty, none of them driven yet.
  explicit ChoiceSet(std::vector<std::unique_ptr<GenerationSession>> sessions);
  ChoiceSet(const ChoiceSet&) = delete;
  ChoiceSet& operator=(const ChoiceSet&) = delete;

  // Waits until `until` for output of any unfinished choice. Returns the steps that arrived,
  // as (choice index, step) in index order; empty when nothing arrived in time (check the
  // client and the deadline, then call again). REQUIRES: !finished().
  std::vector<std::pair<uint32_t, SessionStep>> Next(Clock::time_point until);
  // Ends every unfinished choice (their workers get Abort).
  void Cancel(std::string_view reason);

  size_t size() const { return sessions_.size(); }
  GenerationSession& choice(size_t i) { return *sessions_[i]; }
  const GenerationSession& choice(size_t i) const { return *sessions_[i]; }
  // Every choice finished.
  bool finished() const;
  // Every choice has its first token or finished.
  bool started() const;
  const std::string& tag() const { return sessions_[0]->tag(); }
  // Usage: the prompt once (the choices share it), the completions and reasoning of all.
  uint32_t prompt_tokens() const { return sessions_[0]->prompt_tokens(); }
  // Of the prompt, the most any choice found in its worker's prefix cache.
  uint32_t cached_prompt_tokens() const;
  uint32_t completion_tokens() const;
  uint32_t reasoning_tokens() const;

 private:
  struct Notifier {
    std::mutex mu;
    std::condition_variable cv;
    uint64_t seq = 0;  // guarded by mu: bumped by every event of any choice
  };

  std::vector<std::unique_ptr<GenerationSession>> sessions_;
  std::shared_ptr<Notifier> notifier_ = std::make_shared<Notifier>();  // shared with the listeners
};

}  // namespace pdserve::router
