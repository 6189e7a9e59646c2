// POST /v1/tokenize and /v1/detokenize (also served as /tokenize and /detokenize), in the shapes
// vLLM and SGLang expose:
//
//   tokenize    {"model"?, "prompt": "text", "add_special_tokens"?: true}
//            or {"model"?, "messages": [...], "add_generation_prompt"?: true, "tools"?,
//                "chat_template_kwargs"?, "add_special_tokens"?: false}
//            -> {"tokens": [ids], "count": n, "max_model_len": m, "token_strs"?: [...]}
//               ("return_token_strs": true adds each token's text)
//   detokenize  {"model"?, "tokens": [ids]} -> {"prompt": "text"}
//
// The prompt is built exactly as a generation request builds it (request_prep.h: the chat
// format, the template with tools and the thinking switch, BOS before text prompts), so the
// count is what the request would cost. max_model_len is the largest context of the ready
// output workers (null when none is registered). Errors are OpenAI-shaped 400s naming the field
// (a token id outside the vocabulary, a missing prompt), or 404 for another model.
//
// Thread-safety: pure functions over const inputs.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

#include <nlohmann/json.hpp>

#include "services/router/api_error.h"
#include "services/router/router_config.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"

namespace pdserve::router {

std::optional<ApiError> Tokenize(const RouterConfig& config, const tokenizer::Tokenizer& tokenizer,
                                 const tokenizer::ChatTemplate& chat_template, std::string_view body,
                                 std::optional<uint32_t> max_model_len, nlohmann::json* out);

std::optional<ApiError> Detokenize(const RouterConfig& config, const tokenizer::Tokenizer& tokenizer,
                                   std::string_view body, nlohmann::json* out);

}  // namespace pdserve::router
