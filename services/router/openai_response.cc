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
                                 bool logprobs, const tokenizer::Tokenizer& tokenizer, uint32_t n)
    : endpoint_(endpoint),
      id_(std::move(id)),
      model_(std::move(model)),
      created_(std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch())
                   .count()),
      include_usage_(include_usage),
      logprobs_(logprobs),
      tokenizer_(tokenizer),
      text_offset_(n, 0),
      sent_prompt_ids_(n, false) {}

void ResponseBuilder::ReturnTokenIds(std::vector<int32_t> prompt_token_ids) {
  return_token_ids_ = true;
  prompt_token_ids_ = std::move(prompt_token_ids);
}

json UsageJson(const UsageCounts& u) {
  json j = {{"prompt_tokens", u.prompt_tokens},
            {"completion_tokens", u.completion_tokens},
            {"total_tokens", u.prompt_tokens + u.completion_tokens},
            {"prompt_tokens_details", {{"cached_tokens", u.cached_tokens}}}};
  if (u.reasoning_tokens) j["completion_tokens_details"] = {{"reasoning_tokens", *u.reasoning_tokens}};
  return j;
}

std::string SseEvent(const json& payload) { return "data: " + DumpJson(payload) + "\n\n"; }

json ResponseBuilder::Base(const char* object) const {
  return {{"id", id_}, {"object", object}, {"created", created_}, {"model", model_}};
}

json ResponseBuilder::Logprobs(uint32_t index, const std::vector<OutputToken>& tokens) {
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
    offsets.push_back(text_offset_[index]);
    text_offset_[index] += text.size();
  }
  return {{"tokens", toks}, {"token_logprobs", lps}, {"top_logprobs", tops}, {"text_offset", offsets}};
}

json ResponseBuilder::Message(const ChoiceOutput& c) const {
  json m = {{"role", "assistant"}};
  if (!c.message) {
    m["content"] = c.text;
    return m;
  }
  const tokenizer::ParsedMessage& pm = *c.message;
  // OpenAI: a reply that is only tool calls has null content.
  m["content"] = pm.content.empty() && !pm.tool_calls.empty() ? json(nullptr) : json(pm.content);
  if (!pm.reasoning_content.empty()) m["reasoning_content"] = pm.reasoning_content;
  if (!pm.tool_calls.empty()) {
    json calls = json::array();
    for (size_t k = 0; k < pm.tool_calls.size(); ++k)
      calls.push_back({{"id", k < c.tool_call_ids.size() ? c.tool_call_ids[k] : std::string()},
                       {"type", "function"},
                       {"function", {{"name", pm.tool_calls[k].name}, {"arguments", pm.tool_calls[k].arguments}}}});
    m["tool_calls"] = std::move(calls);
  }
  return m;
}

json ResponseBuilder::Full(const std::vector<ChoiceOutput>& choices, const UsageCounts& usage) {
  json r = Base(endpoint_ == ApiEndpoint::kChat ? "chat.completion" : "text_completion");
  json list = json::array();
  for (uint32_t i = 0; i < choices.size(); ++i) {
    const ChoiceOutput& c = choices[i];
    if (endpoint_ == ApiEndpoint::kChat) {
      list.push_back({{"index", i},
                      {"message", Message(c)},
                      {"logprobs", Logprobs(i, c.tokens)},
                      {"finish_reason", c.finish_reason}});
    } else {
      list.push_back(
          {{"index", i}, {"text", c.text}, {"logprobs", Logprobs(i, c.tokens)}, {"finish_reason", c.finish_reason}});
      if (return_token_ids_) list.back()["prompt_token_ids"] = prompt_token_ids_;
    }
    if (return_token_ids_) list.back()["token_ids"] = c.token_ids;
  }
  if (return_token_ids_ && endpoint_ == ApiEndpoint::kChat) r["prompt_token_ids"] = prompt_token_ids_;
  r["choices"] = std::move(list);
  r["usage"] = UsageJson(usage);
  return r;
}

json ResponseBuilder::RoleChunk(uint32_t index) const {
  json c = Base("chat.completion.chunk");
  c["choices"] = json::array({{{"index", index},
                               {"delta", {{"role", "assistant"}, {"content", ""}}},
                               {"logprobs", nullptr},
                               {"finish_reason", nullptr}}});
  if (return_token_ids_) {
    c["choices"][0]["token_ids"] = json::array();
    if (index == 0) c["prompt_token_ids"] = prompt_token_ids_;
  }
  if (include_usage_) c["usage"] = nullptr;
  return c;
}

bool ResponseBuilder::HasOutput(const SessionStep& step) const {
  if (logprobs_ && !step.tokens.empty()) return true;
  if (return_token_ids_ && !step.token_ids.empty()) return true;
  if (endpoint_ == ApiEndpoint::kChat && !step.text.empty() && step.chat.empty()) {
    // Text the parser holds back (a possible marker) shows up in a later step.
    return false;
  }
  return !step.text.empty() || !step.chat.empty();
}

json ResponseBuilder::Chunk(uint32_t index, const SessionStep& step, const std::vector<std::string>& tool_call_ids,
                            const std::optional<std::string>& finish_reason) {
  json c;
  json fr = finish_reason ? json(*finish_reason) : json(nullptr);
  json lp = step.tokens.empty() ? json(nullptr) : Logprobs(index, step.tokens);
  if (endpoint_ == ApiEndpoint::kChat) {
    c = Base("chat.completion.chunk");
    const tokenizer::ChatDelta& d = step.chat;
    json delta = json::object();
    if (!d.reasoning_content.empty()) delta["reasoning_content"] = d.reasoning_content;
    if (!d.content.empty() || (!finish_reason && d.reasoning_content.empty() && d.tool_calls.empty()))
      delta["content"] = d.content;
    if (!d.tool_calls.empty()) {
      json calls = json::array();
      for (const auto& t : d.tool_calls) {
        json call = {{"index", t.index}};
        json function = json::object();
        if (t.name) {
          const auto k = static_cast<size_t>(t.index);
          call["id"] = k < tool_call_ids.size() ? tool_call_ids[k] : std::string();
          call["type"] = "function";
          function["name"] = *t.name;
        }
        function["arguments"] = t.arguments;
        call["function"] = std::move(function);
        calls.push_back(std::move(call));
      }
      delta["tool_calls"] = std::move(calls);
    }
    c["choices"] = json::array({{{"index", index}, {"delta", delta}, {"logprobs", lp}, {"finish_reason", fr}}});
  } else {
    c = Base("text_completion");
    c["choices"] = json::array({{{"index", index}, {"text", step.text}, {"logprobs", lp}, {"finish_reason", fr}}});
    if (return_token_ids_ && !sent_prompt_ids_[index]) c["choices"][0]["prompt_token_ids"] = prompt_token_ids_;
    sent_prompt_ids_[index] = true;
  }
  if (return_token_ids_) c["choices"][0]["token_ids"] = step.token_ids;
  if (include_usage_) c["usage"] = nullptr;
  return c;
}

json ResponseBuilder::UsageChunk(const UsageCounts& usage) const {
  json c = Base(endpoint_ == ApiEndpoint::kChat ? "chat.completion.chunk" : "text_completion");
  c["choices"] = json::array();
  c["usage"] = UsageJson(usage);
  return c;
}

}  // namespace pdserve::router
