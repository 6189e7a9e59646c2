// OpenAI response bodies: full responses, streaming chunks (server-sent events), usage and
// logprobs in the shapes of the OpenAI API for /v1/completions ("text_completion") and
// /v1/chat/completions ("chat.completion" / "chat.completion.chunk").
//
// Streaming: chat streams start with a chunk carrying delta {"role": "assistant"}; text chunks
// follow; a chunk with an empty delta / text and the finish_reason ends the choice; with
// stream_options.include_usage every chunk has "usage": null and one last chunk has
// "choices": [] and the usage; the stream ends with "data: [DONE]". An error after the stream
// started is sent as `data: {"error": {...}}` followed by [DONE].
//
// Thread-safety: a ResponseBuilder belongs to one request (it tracks the completions text
// offset for logprobs).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "services/router/api_error.h"
#include "services/router/generation_session.h"
#include "services/router/openai_request.h"
#include "tokenizer/tokenizer.h"

namespace pdserve::router {

class ResponseBuilder {
 public:
  ResponseBuilder(ApiEndpoint endpoint, std::string id, std::string model, bool include_usage, bool logprobs,
                  const tokenizer::Tokenizer& tokenizer);

  nlohmann::json Full(const std::string& text, const std::vector<OutputToken>& tokens,
                      const std::string& finish_reason, uint32_t prompt_tokens, uint32_t completion_tokens);
  // Chat only: the first chunk (delta.role).
  nlohmann::json RoleChunk() const;
  nlohmann::json Chunk(const std::string& text, const std::vector<OutputToken>& tokens,
                       const std::optional<std::string>& finish_reason);
  nlohmann::json UsageChunk(uint32_t prompt_tokens, uint32_t completion_tokens) const;

  const std::string& id() const { return id_; }

 private:
  nlohmann::json Logprobs(const std::vector<OutputToken>& tokens);
  nlohmann::json Base(const char* object) const;

  const ApiEndpoint endpoint_;
  const std::string id_;
  const std::string model_;
  const int64_t created_;
  const bool include_usage_;
  const bool logprobs_;
  const tokenizer::Tokenizer& tokenizer_;
  size_t text_offset_ = 0;  // completions logprobs: offset of the next token's text
};

nlohmann::json UsageJson(uint32_t prompt_tokens, uint32_t completion_tokens);
// "data: <json>\n\n"
std::string SseEvent(const nlohmann::json& payload);
inline constexpr const char* kSseDone = "data: [DONE]\n\n";

}  // namespace pdserve::router
