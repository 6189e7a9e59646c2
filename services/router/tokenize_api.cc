#include "services/router/tokenize_api.h"

#include <fmt/format.h>

#include "services/router/openai_request.h"
#include "services/router/request_prep.h"

namespace pdserve::router {

namespace {

using Json = nlohmann::ordered_json;

// Parses the body; checks the model when one is named.
std::optional<ApiError> ReadBody(const RouterConfig& config, std::string_view body, Json* out) {
  try {
    *out = Json::parse(body);
  } catch (const nlohmann::json::exception& e) {
    return ApiError::BadRequest(std::string("the request body is not valid JSON: ") + e.what());
  }
  if (!out->is_object()) return ApiError::BadRequest("the request body must be a JSON object");
  if (auto m = out->find("model"); m != out->end() && !m->is_null()) {
    if (!m->is_string()) return ApiError::BadRequest("'model' must be a string", "model");
    if (m->get<std::string>() != config.model_name)
      return ApiError::NotFound(fmt::format("The model '{}' does not exist (this server serves '{}')",
                                            m->get<std::string>(), config.model_name),
                                "model_not_found");
  }
  return std::nullopt;
}

std::optional<ApiError> OptionalBool(const Json& body, const char* key, bool* value) {
  auto it = body.find(key);
  if (it == body.end() || it->is_null()) return std::nullopt;
  if (!it->is_boolean()) return ApiError::BadRequest(std::string("'") + key + "' must be a boolean", key);
  *value = it->get<bool>();
  return std::nullopt;
}

}  // namespace

std::optional<ApiError> Tokenize(const RouterConfig& config, const tokenizer::Tokenizer& tokenizer,
                                 const tokenizer::ChatTemplate& chat_template, std::string_view text,
                                 std::optional<uint32_t> max_model_len, nlohmann::json* out) {
  Json body;
  if (auto e = ReadBody(config, text, &body)) return e;
  const bool chat = body.contains("messages") && !body["messages"].is_null();
  if (!chat && (!body.contains("prompt") || !body["prompt"].is_string()))
    return ApiError::BadRequest("'prompt' (a string) or 'messages' is required", "prompt");
  bool add_special_tokens = !chat;  // BOS before a text prompt; the template writes its own
  bool add_generation_prompt = true;
  bool return_token_strs = false;
  if (auto e = OptionalBool(body, "add_special_tokens", &add_special_tokens)) return e;
  if (auto e = OptionalBool(body, "add_generation_prompt", &add_generation_prompt)) return e;
  if (auto e = OptionalBool(body, "return_token_strs", &return_token_strs)) return e;

  // The generation request the body describes, parsed by the same validator (messages, tools,
  // thinking switch) and built into a prompt the same way.
  Json request = Json::object();
  request["model"] = config.model_name;
  for (const char* key : {"prompt", "messages", "tools", "tool_choice", "thinking", "chat_template_kwargs"})
    if (body.contains(key)) request[key] = body[key];
  ParsedRequest pr;
  if (auto e = ParseRequestJson(chat ? ApiEndpoint::kChat : ApiEndpoint::kCompletions, request, &pr)) return e;
  pr.chat_options.add_generation_prompt = add_generation_prompt;
  std::vector<int32_t> ids;
  bool opens_reasoning = false;
  if (auto e = BuildPrompt(config, tokenizer, chat_template, pr, add_special_tokens, &ids, &opens_reasoning))
    return e;
  if (chat && add_special_tokens && tokenizer.bos_id() && (ids.empty() || ids[0] != *tokenizer.bos_id()))
    ids.insert(ids.begin(), *tokenizer.bos_id());
  nlohmann::json reply = {{"count", ids.size()},
                          {"max_model_len", max_model_len ? nlohmann::json(*max_model_len) : nlohmann::json(nullptr)},
                          {"tokens", ids}};
  if (return_token_strs) {
    nlohmann::json strs = nlohmann::json::array();
    for (int32_t id : ids) {
      auto bytes = tokenizer.TokenBytes(id, false);
      strs.push_back(bytes.ok() ? std::string(bytes.value()) : std::string());
    }
    reply["token_strs"] = std::move(strs);
  }
  *out = std::move(reply);
  return std::nullopt;
}

std::optional<ApiError> Detokenize(const RouterConfig& config, const tokenizer::Tokenizer& tokenizer,
                                   std::string_view text, nlohmann::json* out) {
  Json body;
  if (auto e = ReadBody(config, text, &body)) return e;
  auto it = body.find("tokens");
  if (it == body.end() || !it->is_array()) return ApiError::BadRequest("'tokens' (a list of token ids) is required", "tokens");
  std::vector<int32_t> ids;
  for (const auto& t : *it) {
    if (!t.is_number_integer() || t.get<int64_t>() < 0 || t.get<int64_t>() > INT32_MAX ||
        !tokenizer.IsValidId(static_cast<int32_t>(t.get<int64_t>())))
      return ApiError::BadRequest(fmt::format("'tokens': {} is not a token id of the vocabulary", t.dump()), "tokens");
    ids.push_back(static_cast<int32_t>(t.get<int64_t>()));
  }
  auto decoded = tokenizer.Decode(ids, {/*skip_special_tokens=*/false});
  if (!decoded.ok()) return ApiError::BadRequest(decoded.status().message(), "tokens");
  *out = {{"prompt", decoded.value()}};
  return std::nullopt;
}

}  // namespace pdserve::router
