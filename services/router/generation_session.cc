#include "services/router/generation_session.h"

#include <fmt/format.h>

namespace pdserve::router {

using Clock = std::chrono::steady_clock;

GenerationSession::GenerationSession(RouterCore* core, std::shared_ptr<ActiveRequest> request,
                                     const tokenizer::Tokenizer& tokenizer, Options options, RouterMetrics* metrics)
    : core_(core),
      request_(std::move(request)),
      tokenizer_(tokenizer),
      metrics_(metrics),
      detokenizer_(tokenizer, tokenizer::DecodeOptions{options.skip_special_tokens}),
      matcher_(std::move(options.stop_strings)),
      stop_ids_(options.stop_token_ids.begin(), options.stop_token_ids.end()) {
  metrics_->waiting.Increment();
}

GenerationSession::~GenerationSession() {
  if (!finished_) Cancel("client went away");
}

void GenerationSession::Cancel(std::string_view reason) {
  if (finished_) return;
  core_->Cancel(request_->id(), reason);
  SessionStep ignored;
  Finish(&ignored, "", Status::Cancelled(std::string(reason)));
}

void GenerationSession::Finish(SessionStep* step, std::string reason, Status error) {
  finished_ = true;
  step->finished = true;
  step->finish_reason = std::move(reason);
  step->error = std::move(error);
  if (first_token_seen_) {
    metrics_->running.Decrement();
  } else {
    metrics_->waiting.Decrement();
  }
  if (step->error.ok()) {
    // The held-back tail of an incomplete character or a possible stop-string prefix is final now.
    if (!matcher_.matched()) {
      step->text += matcher_.Push(detokenizer_.Finish());
      step->text += matcher_.Flush();
    }
    metrics_->e2e_latency.Observe(std::chrono::duration<double>(Clock::now() - request_->arrival()).count());
  }
}

void GenerationSession::Consume(RequestEvent& ev, SessionStep* step) {
  const size_t n = ev.tokens.size();
  for (size_t i = 0; i < n && !finished_; ++i) {
    const int32_t token = ev.tokens[i];
    ++completion_tokens_;
    metrics_->generation_tokens.Increment();
    if (!first_token_seen_) {
      first_token_seen_ = true;
      metrics_->ttft.Observe(std::chrono::duration<double>(ev.received - request_->arrival()).count());
      metrics_->waiting.Decrement();
      metrics_->running.Increment();
    } else {
      // Tokens that arrive together share the gap since the previous event.
      metrics_->inter_token_latency.Observe(std::chrono::duration<double>(ev.received - last_token_time_).count() /
                                            static_cast<double>(n));
    }
    const bool hidden = ev.finish == FinishReason::kStop && i + 1 == n && stop_ids_.count(token);
    if (!hidden) {
      auto piece = detokenizer_.Push(token);
      if (!piece.ok()) {
        core_->Cancel(request_->id(), "invalid token id");
        Finish(step, "", Status::Internal(fmt::format("a worker produced token id {} outside the vocabulary", token)));
        return;
      }
      step->text += matcher_.Push(piece.value());
      OutputToken out{token, std::nullopt};
      if (i < ev.logprobs.size()) out.logprob = ev.logprobs[i];
      step->tokens.push_back(std::move(out));
      if (matcher_.matched()) {
        if (!ev.finishing()) core_->Cancel(request_->id(), "stop string matched");
        Finish(step, "stop", Status::Ok());
        return;
      }
    }
    if (completion_tokens_ >= request_->max_tokens() && !(ev.finishing() && i + 1 == n)) {
      core_->Cancel(request_->id(), "max_tokens reached");  // a worker that overran its budget
      Finish(step, "length", Status::Ok());
      return;
    }
  }
  last_token_time_ = ev.received;
  if (finished_ || !ev.finishing()) return;
  if (!ev.error.ok()) {
    Finish(step, "", ev.error);
  } else if (ev.finish == FinishReason::kStop) {
    Finish(step, "stop", Status::Ok());
  } else {
    Finish(step, "length", Status::Ok());
  }
}

std::optional<SessionStep> GenerationSession::Next(Clock::time_point until) {
  events_.clear();
  if (!request_->WaitEvents(until, &events_)) return std::nullopt;
  SessionStep step;
  for (auto& ev : events_) {
    if (finished_) break;
    Consume(ev, &step);
  }
  return step;
}

}  // namespace pdserve::router
