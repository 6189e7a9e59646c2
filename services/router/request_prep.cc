#include "services/router/request_prep.h"

#include <atomic>

#include <fmt/format.h>

#include "services/common/process_util.h"

namespace pdserve::router {

std::string NewRequestTag(bool chat) {
  static std::atomic<uint32_t> counter{0};
  return fmt::format("{}-{:016x}{:08x}", chat ? "chatcmpl" : "cmpl", services::RandomU64(), ++counter);
}

std::optional<ApiError> PrepareRequest(const RouterConfig& config, const tokenizer::Tokenizer& tokenizer,
                                       const tokenizer::ChatTemplate& chat_template, ParsedRequest& pr,
                                       const std::string& tag, std::chrono::steady_clock::time_point arrival,
                                       PreparedRequest* out) {
  const bool chat = pr.endpoint == ApiEndpoint::kChat;
  // An empty model (the request API's default) means the one model this router serves; the
  // HTTP API requires the field, as OpenAI's does.
  if (pr.model.empty()) pr.model = config.model_name;
  if (pr.model != config.model_name)
    return ApiError::NotFound(
        fmt::format("The model '{}' does not exist (this server serves '{}')", pr.model, config.model_name),
        "model_not_found");
  std::vector<int32_t> prompt;
  const char* prompt_param = chat ? "messages" : "prompt";
  if (chat) {
    auto text = chat_template.Render(pr.messages, pr.chat_options);
    if (!text.ok()) return ApiError::BadRequest(text.status().message(), "messages");
    auto ids = tokenizer.Encode(text.value(), {/*add_bos=*/false, /*parse_special_tokens=*/true});
    if (!ids.ok()) return ApiError::BadRequest(ids.status().message(), "messages");
    prompt = std::move(ids).value();
  } else if (pr.prompt_text) {
    // Plain-text prompts get BOS, as the model was trained (the chat template adds its own).
    auto ids = tokenizer.Encode(*pr.prompt_text, {tokenizer.bos_id().has_value(), true});
    if (!ids.ok()) return ApiError::BadRequest(ids.status().message(), "prompt");
    prompt = std::move(ids).value();
  } else {
    for (int32_t id : pr.prompt_ids)
      if (!tokenizer.IsValidId(id))
        return ApiError::BadRequest(fmt::format("token id {} is not in the vocabulary", id), "prompt");
    prompt = std::move(pr.prompt_ids);
  }
  if (prompt.empty()) return ApiError::BadRequest("the prompt is empty", prompt_param);
  if (config.max_prompt_tokens != 0 && prompt.size() > config.max_prompt_tokens)
    return ApiError::BadRequest(fmt::format("the prompt has {} tokens, more than this server's limit of {} "
                                            "(router.max_prompt_tokens)",
                                            prompt.size(), config.max_prompt_tokens),
                                prompt_param, "context_length_exceeded");

  SubmitSpec& spec = out->spec;
  spec.tag = tag;
  out->prompt_tokens = static_cast<uint32_t>(prompt.size());
  spec.prompt = std::move(prompt);
  spec.sampling = pr.sampling;
  spec.sampling.stop = pr.stop;
  spec.sampling.stop_token_ids = pr.stop_token_ids;
  if (!pr.ignore_eos && tokenizer.eos_id()) spec.sampling.stop_token_ids.push_back(*tokenizer.eos_id());
  if (pr.logprobs) spec.sampling.logprobs = static_cast<int32_t>(pr.top_logprobs);
  spec.max_tokens = pr.max_tokens;
  spec.arrival = arrival;
  spec.deadline_unix_ms = services::UnixMillis() + config.request_timeout.count();
  out->session.stop_strings = pr.stop;
  out->session.stop_token_ids = spec.sampling.stop_token_ids;
  out->session.skip_special_tokens = pr.skip_special_tokens;
  return std::nullopt;
}

ApiError SubmitError(const Status& st, const std::string& tag, bool chat) {
  ApiError e = ApiError::FromStatus(st, tag);
  if (st.code() == StatusCode::kInvalidArgument) {
    e.param = chat ? "messages" : "prompt";
    e.code = "context_length_exceeded";
  } else if (st.code() == StatusCode::kUnavailable) {
    e.code = "no_workers";
  }
  return e;
}

}  // namespace pdserve::router
