#include "engine/engine_test_util.h"

#include <algorithm>

namespace pdserve::engine::testing {

const model::Model& TinyModel() {
  static model::testing::TempDir* dir = [] {
    auto* d = new model::testing::TempDir("engine_tiny");
    model::MakeModelOptions o;
    o.preset = "tiny";
    o.out_dir = d->path();
    o.seed = 5;
    PDSERVE_CHECK(model::MakeModel(o).ok(), "make-model failed");
    return d;
  }();
  static ThreadPool pool(2);
  static std::unique_ptr<model::Model> m = [] {
    auto r = model::Model::Load(dir->path(), &pool);
    PDSERVE_CHECK(r.ok(), r.status().ToString());
    return std::move(r).value();
  }();
  return *m;
}

std::vector<int32_t> ReferenceGreedy(const model::Model& m, const std::vector<int32_t>& prompt, int64_t max_tokens,
                                     int64_t chunk, int64_t max_len) {
  model::SequenceKvCache cache(m.config());
  std::vector<float> logits(static_cast<size_t>(m.config().vocab_size));
  const int64_t P = static_cast<int64_t>(prompt.size());
  for (int64_t s = 0; s < P; s += chunk)
    PDSERVE_CHECK(m.Forward(&prompt[static_cast<size_t>(s)], std::min(chunk, P - s), &cache, logits.data()).ok());
  std::vector<int32_t> out;
  for (;;) {
    const int32_t t = static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
    out.push_back(t);
    if (static_cast<int64_t>(out.size()) >= max_tokens || P + static_cast<int64_t>(out.size()) >= max_len) break;
    PDSERVE_CHECK(m.Forward(&t, 1, &cache, logits.data()).ok());
  }
  return out;
}

EventCallback EventCollector::Callback() {
  return [this](const TokenEvent& ev) {
    std::lock_guard<std::mutex> lock(mu_);
    events_[ev.id].push_back(ev);
    if (ev.finished) {
      ++finished_;
      cv_.notify_all();
    }
  };
}

bool EventCollector::WaitFinished(size_t n, std::chrono::seconds deadline) {
  std::unique_lock<std::mutex> lock(mu_);
  return cv_.wait_for(lock, deadline, [&] { return finished_ >= n; });
}

std::map<RequestId, std::vector<TokenEvent>> EventCollector::events() const {
  std::lock_guard<std::mutex> lock(mu_);
  return events_;
}

std::vector<int32_t> EventCollector::Tokens(RequestId id) const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<int32_t> out;
  auto it = events_.find(id);
  if (it == events_.end()) return out;
  for (const TokenEvent& ev : it->second)
    if (ev.token >= 0) out.push_back(ev.token);
  return out;
}

const TokenEvent* EventCollector::Last(RequestId id) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = events_.find(id);
  return it == events_.end() || it->second.empty() ? nullptr : &it->second.back();
}

size_t EventCollector::finished() const {
  std::lock_guard<std::mutex> lock(mu_);
  return finished_;
}

bool RunUntilIdle(Engine* engine, int64_t max_steps) {
  for (int64_t i = 0; i < max_steps; ++i) {
    if (engine->Idle()) return true;
    engine->Step();
  }
  return engine->Idle();
}

}  // namespace pdserve::engine::testing
