#include "engine/engine_test_util.h"

#include <algorithm>
#include <cstring>

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

std::vector<int32_t> Random(std::mt19937* rng, int64_t n) {
  std::vector<int32_t> v(static_cast<size_t>(n));
  for (auto& t : v) t = static_cast<int32_t>((*rng)() % 1000);
  return v;
}

std::vector<int32_t> Concat(std::vector<int32_t> a, const std::vector<int32_t>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

SamplingParams Greedy(int32_t max_tokens) {
  SamplingParams p;
  p.temperature = 0.0f;
  p.max_tokens = max_tokens;
  p.logprobs = 2;
  return p;
}

SamplingParams Seeded(int32_t max_tokens, uint64_t seed) {
  SamplingParams p;
  p.temperature = 0.8f;
  p.top_k = 50;
  p.top_p = 0.9f;
  p.repetition_penalty = 1.1f;
  p.max_tokens = max_tokens;
  p.seed = seed;
  p.logprobs = 1;
  return p;
}

bool Output::operator==(const Output& o) const {
  if (tokens != o.tokens || reason != o.reason || logprobs.size() != o.logprobs.size()) return false;
  return std::memcmp(logprobs.data(), o.logprobs.data(), logprobs.size() * sizeof(float)) == 0;
}

Output Collect(const EventCollector& ev, RequestId id) {
  Output o;
  const auto events = ev.events();  // (a copy: keep it alive over the loop)
  for (const TokenEvent& e : events.at(id)) {
    if (e.token >= 0) {
      o.tokens.push_back(e.token);
      o.logprobs.push_back(e.logprob);
    }
    if (e.finished) {
      o.reason = e.reason;
      o.cached = e.cached_prompt_tokens;
    }
  }
  return o;
}

EngineOptions PrefixTestOptions(int64_t n_blocks, bool cache, KvLatentFormat latent) {
  EngineOptions o;
  o.block_tokens = kPrefixTestBlock;
  o.latent_format = latent;
  const KvLayout l = model::KvLayoutFor(TinyModel().config(), kPrefixTestBlock, latent);
  o.kv_cache_gib = static_cast<double>(n_blocks * l.BlockBytes()) / (1ull << 30);
  o.scheduler.max_num_seqs = 16;
  o.scheduler.max_step_tokens = 128;
  o.scheduler.prefill_chunk = kPrefixTestChunk;
  o.seed = 5;
  o.prefix_cache = cache;
  return o;
}

std::unique_ptr<Engine> MakeEngine(const EngineOptions& o) {
  auto e = Engine::Create(o, &TinyModel());
  PDSERVE_CHECK(e.ok(), e.status().ToString());
  return std::move(e).value();
}

Output Generate(Engine* e, const std::vector<int32_t>& prompt, const SamplingParams& p) {
  EventCollector ev;
  RequestOptions ro;
  ro.sampling = p;
  ro.on_event = ev.Callback();
  auto id = e->AddRequest(prompt, ro);
  PDSERVE_CHECK(id.ok(), id.status().ToString());
  PDSERVE_CHECK(RunUntilIdle(e));
  return Collect(ev, *id);
}

}  // namespace pdserve::engine::testing
