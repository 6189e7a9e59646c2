// Request preparation shared by the router's fronts (HTTP: router_server.h; ZeroMQ:
// request_api_server.h): from a validated ParsedRequest (openai_request.h) to what
// RouterCore::Submit and GenerationSession need -- model check, chat format
// (router.chat_format) and template, tokenization (BOS for text prompts), vocabulary check of
// token-id prompts and logit_bias ids, the prompt length limit (router.max_prompt_tokens),
// stop tokens (EOS unless ignore_eos), the output constraint (docs/structured-output.md:
// response_format, or the tool-call grammar for tool_choice required / a named function, after
// free reasoning when the prompt opens it), the output parser of chat replies, deadline -- and
// the submission of the n choices and the error mapping of a refused Submit. Both fronts
// therefore accept, refuse and word errors identically.
//
// Thread-safety: pure functions over const inputs (the tokenizer is thread-safe for reads).
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"
#include "services/router/api_error.h"
#include "services/router/generation_session.h"
#include "services/router/openai_request.h"
#include "services/router/router_config.h"
#include "services/router/router_core.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"

namespace pdserve::router {

struct PreparedRequest {
  SubmitSpec spec;  // choice 0's (SubmitChoices derives the others)
  GenerationSession::Options session;
  uint32_t prompt_tokens = 0;
  uint32_t n = 1;
};

// A new request tag ("cmpl-..." / "chatcmpl-..."), unique per router process.
std::string NewRequestTag(bool chat);

// Errors: the ApiError to send (404 model_not_found, 400 naming "prompt" / "messages", 400
// context_length_exceeded over the length limit).
std::optional<ApiError> PrepareRequest(const RouterConfig& config, const tokenizer::Tokenizer& tokenizer,
                                       const tokenizer::ChatTemplate& chat_template, ParsedRequest& request,
                                       const std::string& tag, std::chrono::steady_clock::time_point arrival,
                                       PreparedRequest* out);

// Submits the request's n choices, each a job of its own. Choice i samples with seed + i when
// the request has a seed (reproducible, yet not n copies of one answer). Choices after the
// first go to the first one's workers when those can take them. All or nothing: when a choice
// is refused, those already submitted are cancelled. Errors: RouterCore::Submit's.
Result<std::vector<std::shared_ptr<ActiveRequest>>> SubmitChoices(RouterCore& core, const PreparedRequest& prepared);

// The prompt of a request: the chat template (router.chat_format) and tokenization for chat,
// tokenization for text (BOS when `add_bos_to_text` and the tokenizer has one), the token ids
// as given (checked against the vocabulary). Sets *opens_reasoning when the chat prompt leaves
// the model in its reasoning. No length check. Errors: 400 naming "messages", "tools" or
// "prompt".
std::optional<ApiError> BuildPrompt(const RouterConfig& config, const tokenizer::Tokenizer& tokenizer,
                                    const tokenizer::ChatTemplate& chat_template, ParsedRequest& request,
                                    bool add_bos_to_text, std::vector<int32_t>* prompt, bool* opens_reasoning);

// The ApiError for a Submit that RouterCore refused (context_length_exceeded, no_workers, 429).
ApiError SubmitError(const Status& status, const std::string& tag, bool chat);

}  // namespace pdserve::router
