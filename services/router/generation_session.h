// GenerationSession: turns one request's token events into client-visible output: incremental
// text (StreamDetokenizer: never a broken UTF-8 character), stop strings (StopMatcher: never a
// byte of a stop string), stop tokens hidden from the text, a router-side max_tokens cap,
// finish reasons, usage counts, and the router's latency metrics (TTFT, inter-token latency,
// end-to-end, running/waiting gauges). The streaming and the non-streaming handlers both drive
// one; they differ only in how they write the steps.
//
// Chat replies also go through a ChatOutputParser (Options::chat): each step carries the text
// split into reasoning_content, content and tool-call deltas; each tool call gets an id
// (call_<random>) when its first delta appears; a finished reply that holds calls ends with
// finish reason "tool_calls" (not when max_tokens cut it: "length"); tokens whose text went to
// the reasoning are counted (reasoning_tokens). The parser sees the text after stop strings
// are applied, so a stop string also ends a call or the reasoning.
//
// When the router ends a request itself (stop string matched, max_tokens reached, client gone,
// deadline) it cancels the workers' jobs through RouterCore::Cancel. Usage counts come from the
// tokens the router received (prompt tokens from its own tokenization), not from the workers.
//
// Thread-safety: one session per request, driven by the one HTTP thread serving it.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <unordered_set>
#include <vector>

#include "common/status.h"
#include "services/control/control_messages.h"
#include "services/router/active_request.h"
#include "services/router/router_core.h"
#include "services/router/router_metrics.h"
#include "services/router/stop_matcher.h"
#include "tokenizer/chat_output_parser.h"
#include "tokenizer/stream_detokenizer.h"
#include "tokenizer/tokenizer.h"

namespace pdserve::router {

struct OutputToken {
  int32_t id = 0;
  std::optional<services::TokenLogprob> logprob;
};

struct SessionStep {
  std::string text;                 // final text produced by this step (may be empty)
  std::vector<OutputToken> tokens;  // tokens rendered in this step (for logprobs)
  // Every token id this step consumed, a hidden stop token too (return_token_ids: the ids a
  // client appends to continue the conversation).
  std::vector<int32_t> token_ids;
  tokenizer::ChatDelta chat;        // Options::chat: `text` split into the message's fields
  bool finished = false;
  std::string finish_reason;        // "stop" | "length" | "tool_calls" when finished without error
  Status error;                     // finished with an error
};

// Appends `from` to `into` (text, tokens, chat delta; a finished step's end).
void AppendStep(SessionStep* into, SessionStep&& from);
// Appends one chat delta to another, merging the pieces of the same tool call.
void AppendChatDelta(tokenizer::ChatDelta* into, tokenizer::ChatDelta&& from);

class GenerationSession {
 public:
  struct Options {
    std::vector<std::string> stop_strings;
    std::vector<int32_t> stop_token_ids;  // a stop token ending the request is not rendered
    bool skip_special_tokens = true;
    // Chat: parse the output into reasoning / content / tool calls. Unset: text only.
    std::optional<tokenizer::ChatOutputParserOptions> chat;
  };

  GenerationSession(RouterCore* core, std::shared_ptr<ActiveRequest> request, const tokenizer::Tokenizer& tokenizer,
                    Options options, RouterMetrics* metrics);
  // An unfinished session cancels its request (e.g. the client went away).
  ~GenerationSession();
  GenerationSession(const GenerationSession&) = delete;
  GenerationSession& operator=(const GenerationSession&) = delete;

  // Waits until `until` for output; nullopt when nothing arrived (check the client and the
  // deadline, then call again). Never call again after a finished step.
  std::optional<SessionStep> Next(std::chrono::steady_clock::time_point until);
  // Ends the request now (aborting its workers); later Next() calls are not allowed.
  void Cancel(std::string_view reason);

  bool finished() const { return finished_; }
  bool has_first_token() const { return first_token_seen_; }
  uint32_t prompt_tokens() const { return request_->prompt_tokens(); }
  uint32_t cached_prompt_tokens() const { return request_->cached_prompt_tokens(); }
  uint32_t completion_tokens() const { return completion_tokens_; }
  // Tokens whose text went to the reasoning (Options::chat).
  uint32_t reasoning_tokens() const { return reasoning_tokens_; }
  // Options::chat: the message parsed so far (complete once finished), and the id of each of
  // its tool calls (by index; a call has its id from its first delta on).
  bool parses_chat() const { return parser_.has_value(); }
  const tokenizer::ParsedMessage* message() const { return parser_ ? &parser_->message() : nullptr; }
  const std::vector<std::string>& tool_call_ids() const { return tool_call_ids_; }
  const std::string& tag() const { return request_->tag(); }
  const ActiveRequest& request() const { return *request_; }
  // ActiveRequest::SetListener of this session's request.
  void SetListener(std::function<void()> listener) { request_->SetListener(std::move(listener)); }

 private:
  void Consume(RequestEvent& ev, SessionStep* step);
  void Finish(SessionStep* step, std::string reason, Status error);
  // Text released for the client (after stop strings): into the step, and the parser.
  void Emit(std::string text, bool count_token, SessionStep* step);
  // Gives an id to every tool call the step shows for the first time.
  void NameToolCalls(const SessionStep& step);

  RouterCore* const core_;
  const std::shared_ptr<ActiveRequest> request_;
  const tokenizer::Tokenizer& tokenizer_;
  RouterMetrics* const metrics_;
  tokenizer::StreamDetokenizer detokenizer_;
  StopMatcher matcher_;
  std::optional<tokenizer::ChatOutputParser> parser_;
  std::vector<std::string> tool_call_ids_;
  std::unordered_set<int32_t> stop_ids_;
  std::vector<RequestEvent> events_;  // scratch
  uint32_t completion_tokens_ = 0;
  uint32_t reasoning_tokens_ = 0;
  bool first_token_seen_ = false;
  bool finished_ = false;
  std::chrono::steady_clock::time_point last_token_time_{};
};

}  // namespace pdserve::router
