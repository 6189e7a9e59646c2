#include "services/router/active_request.h"

namespace pdserve::router {

void ActiveRequest::Push(RequestEvent event) {
  if (event.received == std::chrono::steady_clock::time_point{}) event.received = std::chrono::steady_clock::now();
  std::shared_ptr<const std::function<void()>> listener;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (ended_) return;
    ended_ = event.finishing();
    events_.push_back(std::move(event));
    listener = listener_;
  }
  cv_.notify_all();
  if (listener) (*listener)();
}

void ActiveRequest::SetListener(std::function<void()> listener) {
  std::lock_guard<std::mutex> lock(mu_);
  listener_ = listener ? std::make_shared<const std::function<void()>>(std::move(listener)) : nullptr;
}

bool ActiveRequest::WaitEvents(std::chrono::steady_clock::time_point until, std::vector<RequestEvent>* out) {
  std::unique_lock<std::mutex> lock(mu_);
  if (!cv_.wait_until(lock, until, [&] { return !events_.empty(); })) return false;
  for (auto& e : events_) out->push_back(std::move(e));
  events_.clear();
  return true;
}

bool ActiveRequest::ended() const {
  std::lock_guard<std::mutex> lock(mu_);
  return ended_;
}

}  // namespace pdserve::router
