#include "tokenizer/chat_template.h"

#include <gtest/gtest.h>

#include "tokenizer/chat_request.h"
#include "tokenizer/testing_util.h"

namespace pdserve::tokenizer {
namespace {

const char kBos[] = "<｜begin▁of▁sentence｜>";

std::string Render(std::string_view request_json) {
  auto request = ParseChatRequest(request_json);
  EXPECT_TRUE(request.ok()) << request.status().ToString();
  if (!request.ok()) return "<error>";
  auto text = ChatTemplate(kBos).Render(request->messages, request->options);
  EXPECT_TRUE(text.ok()) << text.status().ToString();
  return text.ok() ? *text : "<error>";
}

constexpr std::string_view kConversation = R"("messages": [
  {"role": "system", "content": "You are helpful."},
  {"role": "user", "content": "Hi there"},
  {"role": "assistant", "content": "Hello!"},
  {"role": "user", "content": "2+2?"}])";

TEST(ChatTemplate, MatchesThePackageTemplate) {
  EXPECT_EQ(Render("{" + std::string(kConversation) + R"(, "add_generation_prompt": true})"),
            "<｜begin▁of▁sentence｜>You are helpful.<｜User｜>Hi there<｜Assistant｜>Hello!"
            "<｜end▁of▁sentence｜><｜User｜>2+2?<｜Assistant｜>");
  EXPECT_EQ(Render("{" + std::string(kConversation) + "}"),
            "<｜begin▁of▁sentence｜>You are helpful.<｜User｜>Hi there<｜Assistant｜>Hello!"
            "<｜end▁of▁sentence｜><｜User｜>2+2?");
}

TEST(ChatTemplate, ThinkingModes) {
  const std::string history = R"({"messages": [
      {"role": "user", "content": "hello"},
      {"role": "assistant", "content": "<think>hmm</think>Hello! I am DeepSeek."},
      {"role": "user", "content": "1+1=?"}], "add_generation_prompt": true, )";
  EXPECT_EQ(Render(history + R"("thinking": true})"),
            "<｜begin▁of▁sentence｜><｜User｜>hello<｜Assistant｜></think>Hello! I am DeepSeek."
            "<｜end▁of▁sentence｜><｜User｜>1+1=?<｜Assistant｜><think>");
  EXPECT_EQ(Render(history + R"("thinking": false})"),
            "<｜begin▁of▁sentence｜><｜User｜>hello<｜Assistant｜></think>Hello! I am DeepSeek."
            "<｜end▁of▁sentence｜><｜User｜>1+1=?<｜Assistant｜></think>");
  // Absent / null thinking: the package template, reasoning text untouched.
  EXPECT_EQ(Render(history + R"("thinking": null})"),
            "<｜begin▁of▁sentence｜><｜User｜>hello<｜Assistant｜><think>hmm</think>Hello! I am DeepSeek."
            "<｜end▁of▁sentence｜><｜User｜>1+1=?<｜Assistant｜>");
}

TEST(ChatTemplate, ToolCallsAndOutputs) {
  const std::string text = Render(R"({"messages": [
      {"role": "system", "content": "A"}, {"role": "system", "content": "B"},
      {"role": "user", "content": "weather?"},
      {"role": "assistant", "content": null, "tool_calls": [
         {"type": "function", "function": {"name": "get", "arguments": "{\"city\":\"Paris\"}"}},
         {"type": "function", "function": {"name": "get", "arguments": "{}"}}]},
      {"role": "tool", "content": "sunny"}, {"role": "tool", "content": "rain"},
      {"role": "assistant", "content": "Sunny and rain."}], "add_generation_prompt": true})");
  EXPECT_EQ(text,
            "<｜begin▁of▁sentence｜>A\n\nB<｜User｜>weather?<｜Assistant｜><｜tool▁calls▁begin｜>"
            "<｜tool▁call▁begin｜>function<｜tool▁sep｜>get\n```json\n{\"city\":\"Paris\"}\n```"
            "<｜tool▁call▁end｜>\n<｜tool▁call▁begin｜>function<｜tool▁sep｜>get\n```json\n{}\n```"
            "<｜tool▁call▁end｜><｜tool▁calls▁end｜><｜end▁of▁sentence｜><｜tool▁outputs▁begin｜>"
            "<｜tool▁output▁begin｜>sunny<｜tool▁output▁end｜>\n<｜tool▁output▁begin｜>rain"
            "<｜tool▁output▁end｜><｜tool▁outputs▁end｜>Sunny and rain.<｜end▁of▁sentence｜>"
            "<｜Assistant｜>");
  // A trailing tool output closes the outputs block and suppresses the generation prompt.
  EXPECT_EQ(Render(R"({"messages": [{"role": "tool", "content": "x"}], "add_generation_prompt": true})"),
            std::string(kBos) + "<｜tool▁outputs▁begin｜><｜tool▁output▁begin｜>x<｜tool▁output▁end｜>"
                                "<｜tool▁outputs▁end｜>");
}

TEST(ChatTemplate, ContentPartsAreConcatenated) {
  EXPECT_EQ(Render(R"({"messages": [{"role": "user", "content": [{"type": "text", "text": "a"},
                      {"type": "text", "text": "b"}]}]})"),
            std::string(kBos) + "<｜User｜>ab");
}

TEST(ChatTemplate, BadRequestsGiveClearErrors) {
  struct Case {
    const char* json;
    const char* needle;
  };
  const Case cases[] = {
      {"not json", "not valid JSON"},
      {"[]", "object"},
      {R"({"msgs": []})", "messages"},
      {R"({"messages": [{"content": "x"}]})", "messages[0].role"},
      {R"({"messages": [{"role": "user", "content": 5}]})", "messages[0].content"},
      {R"({"messages": [], "thinking": "yes"})", "thinking"},
      {R"({"messages": [{"role": "user", "content": [{"type": 5, "text": "x"}]}]})", "content[0]"},
      {R"({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]})", "content[0]"},
      {R"({"messages": {"role": "user"}})", "list"},
      {R"({"messages": [{"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": {}}}]}]})",
       "arguments"},
  };
  for (const Case& c : cases) {
    auto r = ParseChatRequest(c.json);
    ASSERT_FALSE(r.ok()) << c.json;
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(r.status().message().find(c.needle), std::string::npos) << r.status().ToString();
  }
  ChatTemplate t(kBos);
  auto no_content = t.Render({ChatMessage{"user", std::nullopt, {}}}, {});
  EXPECT_EQ(no_content.status().code(), StatusCode::kInvalidArgument);
  auto empty_assistant = t.Render({ChatMessage{"assistant", std::nullopt, {}}}, {});
  EXPECT_EQ(empty_assistant.status().code(), StatusCode::kInvalidArgument);
}

TEST(ChatTemplate, AcceptsOnlyTheKnownTemplate) {
  PDSERVE_DEEPSEEK_OR_FAIL(tok);
  auto ok = ChatTemplate::FromConfig(tok->config());
  ASSERT_TRUE(ok.ok()) << ok.status().ToString();
  EXPECT_EQ(ok->bos_token(), kBos);
  TokenizerConfig other = tok->config();
  other.chat_template = "{{ messages }}";
  EXPECT_EQ(ChatTemplate::FromConfig(other).status().code(), StatusCode::kFailedPrecondition);
  other.chat_template.reset();
  EXPECT_TRUE(ChatTemplate::FromConfig(other).ok());
}

}  // namespace
}  // namespace pdserve::tokenizer
