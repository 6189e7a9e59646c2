#include "services/router/openai_request.h"

#include <gtest/gtest.h>

namespace pdserve::router {
namespace {

std::optional<ApiError> ParseC(const std::string& body, ParsedRequest* out) {
  return ParseRequest(ApiEndpoint::kCompletions, body, out);
}
std::optional<ApiError> ParseChat(const std::string& body, ParsedRequest* out) {
  return ParseRequest(ApiEndpoint::kChat, body, out);
}

TEST(OpenAiRequestTest, CompletionFields) {
  ParsedRequest r;
  auto e = ParseC(R"({"model":"m","prompt":"hi","max_tokens":5,"temperature":0,"top_p":0.5,"top_k":-1,
                      "seed":-3,"stop":["a","b"],"stop_token_ids":[7],"logprobs":2,"stream":true,
                      "stream_options":{"include_usage":true},"user":"u","n":1,"best_of":1,"unknown":{"x":1}})",
                  &r);
  ASSERT_FALSE(e) << e->message;
  EXPECT_EQ(r.model, "m");
  EXPECT_EQ(*r.prompt_text, "hi");
  EXPECT_EQ(*r.max_tokens, 5u);
  EXPECT_EQ(r.sampling.temperature, 0.0f);
  EXPECT_EQ(r.sampling.top_p, 0.5f);
  EXPECT_EQ(r.sampling.top_k, 0);
  EXPECT_EQ(*r.sampling.seed, static_cast<uint64_t>(-3));
  EXPECT_EQ(r.stop, (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(r.stop_token_ids, std::vector<int32_t>{7});
  EXPECT_TRUE(r.logprobs);
  EXPECT_EQ(r.top_logprobs, 2u);
  EXPECT_TRUE(r.stream);
  EXPECT_TRUE(r.include_usage);
  EXPECT_EQ(r.user, "u");
}

TEST(OpenAiRequestTest, PromptShapes) {
  ParsedRequest r;
  ASSERT_FALSE(ParseC(R"({"model":"m","prompt":[1,2,3]})", &r));
  EXPECT_EQ(r.prompt_ids, (std::vector<int32_t>{1, 2, 3}));
  ASSERT_FALSE(ParseC(R"({"model":"m","prompt":[[4,5]]})", &r));
  EXPECT_EQ(r.prompt_ids, (std::vector<int32_t>{4, 5}));
  ASSERT_FALSE(ParseC(R"({"model":"m","prompt":["x"]})", &r));
  EXPECT_EQ(*r.prompt_text, "x");
  auto e = ParseC(R"({"model":"m","prompt":["x","y"]})", &r);
  ASSERT_TRUE(e);
  EXPECT_EQ(e->param, "prompt");
  EXPECT_TRUE(ParseC(R"({"model":"m","prompt":[1,-2]})", &r));
  EXPECT_TRUE(ParseC(R"({"model":"m","prompt":5})", &r));
  EXPECT_TRUE(ParseC(R"({"model":"m","prompt":[]})", &r));
  EXPECT_TRUE(ParseC(R"({"model":"m"})", &r));
}

TEST(OpenAiRequestTest, ChatFields) {
  ParsedRequest r;
  auto e = ParseChat(R"({"model":"m","messages":[{"role":"system","content":"s"},{"role":"user","content":[{"type":"text","text":"hi"}]}],
                         "max_completion_tokens":9,"max_tokens":3,"logprobs":true,"top_logprobs":4,
                         "chat_template_kwargs":{"thinking":true}})",
                     &r);
  ASSERT_FALSE(e) << e->message;
  ASSERT_EQ(r.messages.size(), 2u);
  EXPECT_EQ(*r.messages[1].content, "hi");
  EXPECT_EQ(*r.max_tokens, 9u);  // max_completion_tokens wins
  EXPECT_TRUE(r.logprobs);
  EXPECT_EQ(r.top_logprobs, 4u);
  EXPECT_TRUE(r.chat_options.add_generation_prompt);
  EXPECT_EQ(r.chat_options.thinking, true);
}

struct BadCase {
  ApiEndpoint endpoint;
  const char* body;
  const char* param;  // expected param ("" for null)
};

TEST(OpenAiRequestTest, BadRequestsName400AndParam) {
  const BadCase cases[] = {
      {ApiEndpoint::kChat, "{not json", ""},
      {ApiEndpoint::kChat, "[1,2]", ""},
      {ApiEndpoint::kChat, R"({"messages":[{"role":"user","content":"x"}]})", "model"},
      {ApiEndpoint::kChat, R"({"model":7,"messages":[]})", "model"},
      {ApiEndpoint::kChat, R"({"model":"m"})", "messages"},
      {ApiEndpoint::kChat, R"({"model":"m","messages":[]})", "messages"},
      {ApiEndpoint::kChat, R"({"model":"m","messages":"hi"})", "messages"},
      {ApiEndpoint::kChat, R"({"model":"m","messages":[{"content":"x"}]})", "messages"},
      {ApiEndpoint::kChat, R"({"model":"m","messages":[{"role":"user","content":"x"}],"max_tokens":"5"})", "max_tokens"},
      {ApiEndpoint::kChat, R"({"model":"m","messages":[{"role":"user","content":"x"}],"max_tokens":0})", "max_tokens"},
      {ApiEndpoint::kChat, R"({"model":"m","messages":[{"role":"user","content":"x"}],"max_tokens":2.5})", "max_tokens"},
      {ApiEndpoint::kChat, R"({"model":"m","messages":[{"role":"user","content":"x"}],"temperature":"hot"})", "temperature"},
      {ApiEndpoint::kChat, R"({"model":"m","messages":[{"role":"user","content":"x"}],"temperature":3})", "temperature"},
      {ApiEndpoint::kChat, R"({"model":"m","messages":[{"role":"user","content":"x"}],"top_p":0})", "top_p"},
      {ApiEndpoint::kChat, R"({"model":"m","messages":[{"role":"user","content":"x"}],"n":17})", "n"},
      {ApiEndpoint::kChat, R"({"model":"m","messages":[{"role":"user","content":"x"}],"n":0})", "n"},
      {ApiEndpoint::kChat, R"({"model":"m","messages":[{"role":"user","content":"x"}],"n":"2"})", "n"},
      {ApiEndpoint::kChat, R"({"model":"m","messages":[{"role":"user","content":"x"}],"stream":"yes"})", "stream"},
      {ApiEndpoint::kChat, R"({"model":"m","messages":[{"role":"user","content":"x"}],"stream_options":{"include_usage":true}})", "stream_options"},
      {ApiEndpoint::kChat, R"({"model":"m","messages":[{"role":"user","content":"x"}],"stop":[1]})", "stop"},
      {ApiEndpoint::kChat, R"({"model":"m","messages":[{"role":"user","content":"x"}],"stop":""})", "stop"},
      {ApiEndpoint::kChat, R"({"model":"m","messages":[{"role":"user","content":"x"}],"top_logprobs":3})", "top_logprobs"},
      {ApiEndpoint::kChat, R"({"model":"m","messages":[{"role":"user","content":"x"}],"logit_bias":{"x":5}})", "logit_bias"},
      {ApiEndpoint::kChat, R"({"model":"m","messages":[{"role":"user","content":"x"}],"logit_bias":{"-1":5}})", "logit_bias"},
      {ApiEndpoint::kChat, R"({"model":"m","messages":[{"role":"user","content":"x"}],"logit_bias":{"1":101}})", "logit_bias"},
      {ApiEndpoint::kChat, R"({"model":"m","messages":[{"role":"user","content":"x"}],"logit_bias":{"1":"5"}})", "logit_bias"},
      {ApiEndpoint::kChat, R"({"model":"m","messages":[{"role":"user","content":"x"}],"logit_bias":[1]})", "logit_bias"},
      {ApiEndpoint::kChat, R"({"model":"m","messages":[{"role":"user","content":"x"}],"logit_bias":{"99999999999":1}})", "logit_bias"},
      {ApiEndpoint::kChat, R"({"model":"m","messages":[{"role":"user","content":"x"}],"tools":[{"type":"function"}]})", "tools"},
      {ApiEndpoint::kChat, R"({"model":"m","messages":[{"role":"user","content":"x"}],"user":5})", "user"},
      {ApiEndpoint::kCompletions, R"({"model":"m","prompt":"x","echo":true})", "echo"},
      {ApiEndpoint::kCompletions, R"({"model":"m","prompt":"x","logprobs":21})", "logprobs"},
      {ApiEndpoint::kCompletions, R"({"model":"m","prompt":"x","best_of":3})", "best_of"},
      {ApiEndpoint::kCompletions, R"({"model":"m","prompt":"x","best_of":3,"n":2})", "best_of"},
      {ApiEndpoint::kCompletions, R"({"model":"m","prompt":"x","tools":[]})", "tools"},
      {ApiEndpoint::kCompletions, R"({"model":"m","prompt":"x","tool_choice":"auto"})", "tool_choice"},
      {ApiEndpoint::kCompletions, R"({"model":"m","prompt":"x","seed":"1"})", "seed"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.body);
    ParsedRequest r;
    auto e = ParseRequest(c.endpoint, c.body, &r);
    ASSERT_TRUE(e.has_value());
    EXPECT_EQ(e->http_status, 400);
    EXPECT_EQ(e->type, "invalid_request_error");
    EXPECT_EQ(e->param, c.param);
    const auto j = e->ToJson();
    EXPECT_TRUE(j["error"]["message"].is_string());
    EXPECT_EQ(j["error"]["param"].is_null(), std::string(c.param).empty());
  }
}

TEST(OpenAiRequestTest, NullMeansAbsent) {
  ParsedRequest r;
  ASSERT_FALSE(ParseChat(R"({"model":"m","messages":[{"role":"user","content":"x"}],"max_tokens":null,
                            "temperature":null,"stop":null,"stream_options":null,"n":null})",
                         &r));
  EXPECT_FALSE(r.max_tokens.has_value());
}

}  // namespace
}  // namespace pdserve::router
