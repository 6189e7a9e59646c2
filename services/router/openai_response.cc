#include "services/router/openai_response.h"

#include <chrono>
#include <cmath>

namespace pdserve::router {

using nlohmann::json;

namespace {
// JSON has no -inf: OpenAI reports impossible tokens as -9999.
double JsonLogprob(float lp) { return std::isfinite(lp) ? lp : -9999.0; }

json ByteList(const std::string& s) {
  json b = json::array();
  for (unsigned char c : s) b.push_back(static_cast<int>(c));
  return b;
}
}  // namespace

ResponseBuilder::ResponseBuilder(ApiEndpoint endpoint, std::string id, std::string model, bool include_usage,
                                 bool logprobs, const tokenizer::Tokenizer& tokenizer)
    : endpoint_(endpoint),
      id_(std::move(id)),
      model_(std::move(model)),
      created_(std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch())
                   .count()),
      include_usage_(include_usage),
      logprobs_(logprobs),
      tokenizer_(tokenizer) {}

json UsageJson(uint32_t prompt_tokens, uint32_t completion_tokens) {
  return {{"prompt_tokens", prompt_tokens},
          {"completion_tokens", completion_tokens},
          {"total_tokens", prompt_tokens + completion_tokens}};
}

std::string SseEvent(const json& payload) { return "data: " + DumpJson(payload) + "\n\n"; }

json ResponseBuilder::Base(const char* object) const {
  return {{"id", id_}, {"object", object}, {"created", created_}, {"model", model_}};
}

json ResponseBuilder::Logprobs(const std::vector<OutputToken>& tokens) {
  if (!logprobs_) return nullptr;
  auto token_text = [&](int32_t id) {
    auto bytes = tokenizer_.TokenBytes(id, false);
    return bytes.ok() ? std::string(bytes.value()) : std::string();
  };
  if (endpoint_ == ApiEndpoint::kChat) {
    json content = json::array();
    for (const auto& t : tokens) {
      const std::string text = token_text(t.id);
      json top = json::array();
      if (t.logprob) {
        for (const auto& alt : t.logprob->top) {
          const std::string at = token_text(alt.token);
          top.push_back({{"token", at}, {"logprob", JsonLogprob(alt.logprob)}, {"bytes", ByteList(at)}});
        }
      }
      content.push_back({{"token", text},
                         {"logprob", t.logprob ? JsonLogprob(t.logprob->logprob) : 0.0},
                         {"bytes", ByteList(text)},
                         {"top_logprobs", top}});
    }
    return {{"content", content}};
  }
  json toks = json::array(), lps = json::array(), tops = json::array(), offsets = json::array();
  for (const auto& t : tokens) {
    const std::string text = token_text(t.id);
    toks.push_back(text);
    lps.push_back(t.logprob ? JsonLogprob(t.logprob->logprob) : 0.0);
    json top = json::object();
    if (t.logprob)
      for (const auto& alt : t.logprob->top) top[token_text(alt.token)] = JsonLogprob(alt.logprob);
    tops.push_back(top);
    offsets.push_back(text_offset_);
    text_offset_ += text.size();
  }
  return {{"tokens", toks}, {"token_logprobs", lps}, {"top_logprobs", tops}, {"text_offset", offsets}};
}

json ResponseBuilder::Full(const std::string& text, const std::vector<OutputToken>& tokens,
                           const std::string& finish_reason, uint32_t prompt_tokens, uint32_t completion_tokens) {
  json r;
  if (endpoint_ == ApiEndpoint::kChat) {
    r = Base("chat.completion");
    r["choices"] = json::array({{{"index", 0},
                                 {"message", {{"role", "assistant"}, {"content", text}}},
                                 {"logprobs", Logprobs(tokens)},
                                 {"finish_reason", finish_reason}}});
  } else {
    r = Base("text_completion");
    r["choices"] = json::array(
        {{{"index", 0}, {"text", text}, {"logprobs", Logprobs(tokens)}, {"finish_reason", finish_reason}}});
  }
  r["usage"] = UsageJson(prompt_tokens, completion_tokens);
  return r;
}

json ResponseBuilder::RoleChunk() const {
  json c = Base("chat.completion.chunk");
  c["choices"] = json::array(
      {{{"index", 0}, {"delta", {{"role", "assistant"}, {"content", ""}}}, {"logprobs", nullptr}, {"finish_reason", nullptr}}});
  if (include_usage_) c["usage"] = nullptr;
  return c;
}

json ResponseBuilder::Chunk(const std::string& text, const std::vector<OutputToken>& tokens,
                            const std::optional<std::string>& finish_reason) {
  json c;
  json fr = finish_reason ? json(*finish_reason) : json(nullptr);
  json lp = tokens.empty() ? json(nullptr) : Logprobs(tokens);
  if (endpoint_ == ApiEndpoint::kChat) {
    c = Base("chat.completion.chunk");
    json delta = json::object();
    if (!text.empty() || !finish_reason) delta["content"] = text;
    c["choices"] = json::array({{{"index", 0}, {"delta", delta}, {"logprobs", lp}, {"finish_reason", fr}}});
  } else {
    c = Base("text_completion");
    c["choices"] = json::array({{{"index", 0}, {"text", text}, {"logprobs", lp}, {"finish_reason", fr}}});
  }
  if (include_usage_) c["usage"] = nullptr;
  return c;
}

json ResponseBuilder::UsageChunk(uint32_t prompt_tokens, uint32_t completion_tokens) const {
  json c = Base(endpoint_ == ApiEndpoint::kChat ? "chat.completion.chunk" : "text_completion");
  c["choices"] = json::array();
  c["usage"] = UsageJson(prompt_tokens, completion_tokens);
  return c;
}

}  // namespace pdserve::router
