#include "services/router/choice_set.h"

#include <algorithm>

#include "common/check.h"

namespace pdserve::router {

ChoiceSet::ChoiceSet(std::vector<std::unique_ptr<GenerationSession>> sessions) : sessions_(std::move(sessions)) {
  PDSERVE_CHECK(!sessions_.empty(), "a ChoiceSet needs at least one choice");
  // The ActiveRequests may outlive this set (RouterCore holds them until their routes end):
  // the listeners hold the notifier, never the set.
  for (auto& s : sessions_) {
    std::weak_ptr<Notifier> weak = notifier_;
    s->SetListener([weak] {
      if (auto n = weak.lock()) {
        {
          std::lock_guard<std::mutex> lock(n->mu);
          ++n->seq;
        }
        n->cv.notify_all();
      }
    });
  }
}

std::vector<std::pair<uint32_t, SessionStep>> ChoiceSet::Next(Clock::time_point until) {
  std::vector<std::pair<uint32_t, SessionStep>> out;
  while (true) {
    uint64_t seen;
    {
      std::lock_guard<std::mutex> lock(notifier_->mu);
      seen = notifier_->seq;
    }
    // Events queued before `seen` are picked up here; later ones bump seq and end the wait.
    for (size_t i = 0; i < sessions_.size(); ++i) {
      if (sessions_[i]->finished()) continue;
      if (auto step = sessions_[i]->Next(Clock::now())) out.emplace_back(static_cast<uint32_t>(i), std::move(*step));
    }
    if (!out.empty()) return out;
    std::unique_lock<std::mutex> lock(notifier_->mu);
    if (!notifier_->cv.wait_until(lock, until, [&] { return notifier_->seq != seen; })) return out;
  }
}

void ChoiceSet::Cancel(std::string_view reason) {
  for (auto& s : sessions_) s->Cancel(reason);
}

bool ChoiceSet::finished() const {
  for (const auto& s : sessions_)
    if (!s->finished()) return false;
  return true;
}

bool ChoiceSet::started() const {
  for (const auto& s : sessions_)
    if (!s->finished() && !s->has_first_token()) return false;
  return true;
}

uint32_t ChoiceSet::completion_tokens() const {
  uint32_t n = 0;
  for (const auto& s : sessions_) n += s->completion_tokens();
  return n;
}

uint32_t ChoiceSet::reasoning_tokens() const {
  uint32_t n = 0;
  for (const auto& s : sessions_) n += s->reasoning_tokens();
  return n;
}

uint32_t ChoiceSet::cached_prompt_tokens() const {
  uint32_t most = 0;
  for (const auto& s : sessions_) most = std::max(most, s->cached_prompt_tokens());
  return most;
}

}  // namespace pdserve::router
