#include "services/testing/echo_worker/echo_engine.h"

#include <algorithm>

#include <fmt/format.h>

#include "services/common/request_log.h"

namespace pdserve::services {

using Clock = std::chrono::steady_clock;

namespace {
uint64_t PromptHash(const std::vector<int32_t>& prompt) {
  uint64_t h = 1469598103934665603ull;  // FNV-1a over the ids
  for (int32_t t : prompt) {
    h ^= static_cast<uint32_t>(t);
    h *= 1099511628211ull;
  }
  return h;
}
uint32_t BlocksFor(uint64_t tokens, uint32_t block_tokens) {
  return static_cast<uint32_t>((tokens + block_tokens - 1) / block_tokens);
}
}  // namespace

EchoEngine::EchoEngine(EchoOptions options) : options_(std::move(options)), blocks_free_(options_.kv_blocks) {
  thread_ = std::jthread([this](std::stop_token st) { Loop(st); });
}

EchoEngine::~EchoEngine() {
  thread_.request_stop();
  cv_.notify_all();
}

void EchoEngine::SetSinks(TokenSink tokens, KvSink kv) {
  std::lock_guard<std::mutex> lock(mu_);
  token_sink_ = std::move(tokens);
  kv_sink_ = std::move(kv);
}

WorkerCapacity EchoEngine::Capacity() const {
  return {options_.max_batch, options_.kv_blocks, options_.kv_blocks, options_.block_tokens, options_.max_context, 1};
}

std::string EchoEngine::Descriptor(uint64_t request_id, const std::vector<int32_t>& prompt, const std::string& decode_id) {
  return fmt::format("pdserve-echo-kv/1 {:x} {:016x} {}", request_id, PromptHash(prompt), decode_id);
}

Status EchoEngine::StartJob(const JobMsg& msg) {
  const uint64_t prompt = msg.prompt.size();
  if (prompt >= options_.max_context)
    return Status::InvalidArgument(fmt::format("prompt of {} tokens does not fit the context of {}", prompt,
                                               options_.max_context));
  const bool produces = msg.phase != JobPhase::kPrefill;
  if (produces && prompt + msg.sampling.max_tokens > options_.max_context)
    return Status::InvalidArgument("prompt + max_tokens exceed the context");
  if (msg.phase == JobPhase::kPrefill && msg.kv_descriptor != Descriptor(msg.request_id, msg.prompt, msg.decode_worker_id))
    return Status::InvalidArgument("the KV descriptor does not belong to this request / prompt / decode worker");
  if ((options_.role == WorkerRole::kColocated) != (msg.phase == JobPhase::kColocated) ||
      (options_.role == WorkerRole::kPrefill && msg.phase != JobPhase::kPrefill) ||
      (options_.role == WorkerRole::kDecode && msg.phase != JobPhase::kDecode))
    return Status::InvalidArgument(fmt::format("a {} worker cannot run a {} job", WorkerRoleName(options_.role),
                                               JobPhaseName(msg.phase)));
  Job job;
  job.blocks = BlocksFor(produces ? prompt + msg.sampling.max_tokens : prompt, options_.block_tokens);
  const auto now = Clock::now();
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (jobs_.size() >= options_.max_batch) return Status::ResourceExhausted("the echo worker's batch is full");
    if (job.blocks > blocks_free_)
      return Status::ResourceExhausted(fmt::format("needs {} KV blocks, {} free", job.blocks, blocks_free_));
    blocks_free_ -= job.blocks;
    job.msg = msg;
    if (msg.phase == JobPhase::kDecode) {
      job.stage = Stage::kSendKv;
      job.next_time = now;
    } else {
      job.stage = Stage::kPrefilling;
      job.next_time = now + options_.prefill_per_token * static_cast<int64_t>(prompt);
    }
    jobs_.emplace(msg.request_id, std::move(job));
  }
  cv_.notify_all();
  return Status::Ok();
}

Status EchoEngine::CommitFirstToken(const FirstTokenMsg& first) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = jobs_.find(first.request_id);
    if (it == jobs_.end()) return Status::NotFound("no such job");
    Job& job = it->second;
    if (job.stage != Stage::kAwaitingFirst) return Status::FailedPrecondition("not waiting for a first token");
    if (first.token != JobTokenAt(job.msg, 0))
      return Status::DataLoss(fmt::format("first token {} is not the prefill echo's {}", first.token,
                                          JobTokenAt(job.msg, 0)));
    job.stage = Stage::kGenerating;
    job.next_index = 1;
    job.next_time = Clock::now() + options_.token_delay;
  }
  cv_.notify_all();
  return Status::Ok();
}

void EchoEngine::AbortJob(uint64_t request_id, std::string_view reason) {
  std::string tag;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = jobs_.find(request_id);
    if (it == jobs_.end()) return;
    it->second.stage = Stage::kAborting;
    it->second.next_time = Clock::now();
    tag = it->second.msg.request_tag;
  }
  RequestLog("echo", tag).Debug("abort: {}", reason);
  cv_.notify_all();
}

WorkerLoad EchoEngine::CurrentLoad() {
  std::lock_guard<std::mutex> lock(mu_);
  WorkerLoad load;
  for (const auto& [id, job] : jobs_) {
    if (job.stage == Stage::kGenerating) {
      ++load.running;
      load.queued_tokens += job.msg.sampling.max_tokens - std::min<uint64_t>(job.next_index, job.msg.sampling.max_tokens);
    } else {
      ++load.waiting;
      load.queued_tokens += job.msg.prompt.size();
    }
  }
  load.kv_blocks_free = blocks_free_;
  load.kv_blocks_total = options_.kv_blocks;
  return load;
}

TokenEventMsg EchoEngine::MakeToken(const Job& job, uint64_t index) const {
  TokenEventMsg ev;
  ev.request_id = job.msg.request_id;
  ev.first_index = static_cast<uint32_t>(index);
  const int32_t token = JobTokenAt(job.msg, index);
  ev.tokens = {token};
  const SamplingSpec& s = job.msg.sampling;
  if (s.logprobs) {
    TokenLogprob lp;
    lp.logprob = -0.5f * static_cast<float>(index % 4);
    for (uint32_t k = 0; k < s.top_logprobs; ++k)
      lp.top.push_back({JobTokenAt(job.msg, index + k), lp.logprob - static_cast<float>(k)});
    ev.logprobs = {lp};
  }
  const bool stop = std::find(s.stop_token_ids.begin(), s.stop_token_ids.end(), token) != s.stop_token_ids.end();
  if (stop) {
    ev.finish = FinishReason::kStop;
  } else if (index + 1 >= s.max_tokens) {
    ev.finish = FinishReason::kLength;
  }
  if (ev.finish != FinishReason::kNone) {
    ev.prompt_tokens = static_cast<uint32_t>(job.msg.prompt.size());
    ev.completion_tokens = static_cast<uint32_t>(index + 1);
  }
  return ev;
}

bool EchoEngine::Step(Job& job, Clock::time_point now, std::vector<TokenEventMsg>* events,
                      std::vector<KvReservedMsg>* reserved) {
  switch (job.stage) {
    case Stage::kAborting: {
      TokenEventMsg ev;
      ev.request_id = job.msg.request_id;
      ev.finish = FinishReason::kAbort;
      events->push_back(std::move(ev));
      return true;
    }
    case Stage::kSendKv:
      reserved->push_back({job.msg.request_id, Descriptor(job.msg.request_id, job.msg.prompt, options_.worker_id),
                           "echo://" + options_.worker_id, job.blocks});
      job.stage = Stage::kAwaitingFirst;
      job.next_time = Clock::time_point::max();
      return false;
    case Stage::kAwaitingFirst:
      job.next_time = Clock::time_point::max();
      return false;
    case Stage::kPrefilling:
      if (job.msg.phase == JobPhase::kPrefill) {
        // The prefill's single event: the first token, finishing only if the request ends here.
        events->push_back(MakeToken(job, 0));
        return true;
      }
      job.stage = Stage::kGenerating;
      job.next_index = 0;
      [[fallthrough]];
    case Stage::kGenerating: {
      if (options_.stall_after > 0 && job.next_index >= options_.stall_after) {
        job.next_time = Clock::time_point::max();  // wedged (abort still ends it)
        return false;
      }
      TokenEventMsg ev = MakeToken(job, job.next_index);
      const bool done = ev.finishing();
      events->push_back(std::move(ev));
      ++job.next_index;
      job.next_time = now + options_.token_delay;
      return done;
    }
  }
  return true;
}

void EchoEngine::Loop(std::stop_token stop) {
  std::vector<TokenEventMsg> events;
  std::vector<KvReservedMsg> reserved;
  std::unique_lock<std::mutex> lock(mu_);
  while (!stop.stop_requested()) {
    auto next = Clock::time_point::max();
    for (const auto& [id, job] : jobs_) next = std::min(next, job.next_time);
    if (next == Clock::time_point::max()) {
      cv_.wait(lock, stop, [&] {
        for (const auto& [id, job] : jobs_)
          if (job.next_time != Clock::time_point::max()) return true;
        return false;
      });
      continue;
    }
    if (Clock::now() < next) {
      // Wake early when a job becomes due sooner (a new job, a first token, an abort).
      cv_.wait_until(lock, stop, next, [&] {
        for (const auto& [id, job] : jobs_)
          if (job.next_time < next) return true;
        return false;
      });
      continue;
    }
    const auto now = Clock::now();
    for (auto it = jobs_.begin(); it != jobs_.end();) {
      if (it->second.next_time > now) {
        ++it;
        continue;
      }
      if (Step(it->second, now, &events, &reserved)) {
        blocks_free_ += it->second.blocks;
        it = jobs_.erase(it);
      } else {
        ++it;
      }
    }
    TokenSink tokens = token_sink_;
    KvSink kv = kv_sink_;
    lock.unlock();
    for (auto& r : reserved) if (kv) kv(std::move(r));
    for (auto& e : events) if (tokens) tokens(std::move(e));
    reserved.clear();
    events.clear();
    lock.lock();
  }
}

}  // namespace pdserve::services
