#include "services/router/generation_session.h"

#include <fmt/format.h>

#include "services/common/process_util.h"

namespace pdserve::router {

using Clock = std::chrono::steady_clock;

void AppendChatDelta(tokenizer::ChatDelta* into, tokenizer::ChatDelta&& from) {
  into->reasoning_content += from.reasoning_content;
  into->content += from.content;
  for (auto& call : from.tool_calls) {
    if (!into->tool_calls.empty() && into->tool_calls.back().index == call.index) {
      tokenizer::ToolCallDelta& last = into->tool_calls.back();
      if (call.name && !last.name) last.name = std::move(call.name);
      last.arguments += call.arguments;
    } else {
      into->tool_calls.push_back(std::move(call));
    }
  }
}

void AppendStep(SessionStep* into, SessionStep&& step) {
  into->text += step.text;
  for (auto& t : step.tokens) into->tokens.push_back(std::move(t));
  into->token_ids.insert(into->token_ids.end(), step.token_ids.begin(), step.token_ids.end());
  AppendChatDelta(&into->chat, std::move(step.chat));
  if (step.finished) {
    into->finished = true;
    into->finish_reason = std::move(step.finish_reason);
    into->error = std::move(step.error);
  }
}

GenerationSession::GenerationSession(RouterCore* core, std::shared_ptr<ActiveRequest> request,
                                     const tokenizer::Tokenizer& tokenizer, Options options, RouterMetrics* metrics)
    : core_(core),
      request_(std::move(request)),
      tokenizer_(tokenizer),
      metrics_(metrics),
      detokenizer_(tokenizer, tokenizer::DecodeOptions{options.skip_special_tokens}),
      matcher_(std::move(options.stop_strings)),
      stop_ids_(options.stop_token_ids.begin(), options.stop_token_ids.end()) {
  if (options.chat) parser_.emplace(*options.chat);
  metrics_->waiting.Increment();
}

void GenerationSession::Emit(std::string text, bool count_token, SessionStep* step) {
  if (parser_) {
    // A token counts as reasoning when the parser is in the reasoning as its text arrives.
    if (count_token && parser_->in_reasoning()) ++reasoning_tokens_;
    if (!text.empty()) AppendChatDelta(&step->chat, parser_->Push(text));
  }
  step->text += text;
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
      Emit(matcher_.Push(detokenizer_.Finish()), false, step);
      Emit(matcher_.Flush(), false, step);
    }
    if (parser_) {
      AppendChatDelta(&step->chat, parser_->Finish());
      // A reply that calls tools says so, unless max_tokens cut it.
      if (step->finish_reason == "stop" && !parser_->message().tool_calls.empty()) step->finish_reason = "tool_calls";
    }
    metrics_->e2e_latency.Observe(std::chrono::duration<double>(Clock::now() - request_->arrival()).count());
  }
  NameToolCalls(*step);
}

void GenerationSession::Consume(RequestEvent& ev, SessionStep* step) {
  const size_t n = ev.tokens.size();
  for (size_t i = 0; i < n && !finished_; ++i) {
    const int32_t token = ev.tokens[i];
    ++completion_tokens_;
    step->token_ids.push_back(token);
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
      Emit(matcher_.Push(piece.value()), true, step);
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
  NameToolCalls(step);
  return step;
}

void GenerationSession::NameToolCalls(const SessionStep& step) {
  for (const auto& call : step.chat.tool_calls)
    while (tool_call_ids_.size() <= static_cast<size_t>(call.index))
      tool_call_ids_.push_back(fmt::format("call_{:016x}", services::RandomU64()));
}

}  // namespace pdserve::router
