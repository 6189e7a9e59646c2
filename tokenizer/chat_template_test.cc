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

namespace pdserve::tokenizer {
namespace {

// DeepSeek-V3.1 / V3.2-Exp format. Expected texts written from V3.1's template, case by case.
TEST(ChatTemplateV31, ThinkingSwitchAndHistory) {
  const std::string history = R"({"format": "deepseek_v31", "messages": [
      {"role": "system", "content": "S1"}, {"role": "system", "content": "S2"},
      {"role": "user", "content": "hello"},
      {"role": "assistant", "content": "<think>hmm</think>Hi! <think>x</think>y"},
      {"role": "user", "content": "1+1=?"}], "add_generation_prompt": true)";
  const std::string base = "<｜begin▁of▁sentence｜>S1\n\nS2<｜User｜>hello<｜Assistant｜></think>Hi! <think>x</think>y"
                           "<｜end▁of▁sentence｜><｜User｜>1+1=?<｜Assistant｜>";
  EXPECT_EQ(Render(history + R"(, "thinking": true})"), base + "<think>");
  EXPECT_EQ(Render(history + R"(, "thinking": false})"), base + "</think>");
  EXPECT_EQ(Render(history + "}"), base + "</think>");  // unset: non-thinking
  EXPECT_TRUE(ChatTemplate::OpensReasoning(base + "<think>"));
  EXPECT_FALSE(ChatTemplate::OpensReasoning(base + "</think>"));
}

TEST(ChatTemplateV31, ToolsCallsAndResults) {
  const std::string request = R"({"format": "deepseek_v31", "add_generation_prompt": true,
      "tools": [{"type": "function", "function": {"name": "get_weather", "description": "Weather now",
                 "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "Städte"}},
                                "required": ["city"]}}},
                {"type": "function", "function": {"name": "noop"}}],
      "messages": [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Paris and Rome?"},
        {"role": "assistant", "content": "Checking.", "tool_calls": [
           {"type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}},
           {"type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Rome\"}"}}]},
        {"role": "tool", "tool_call_id": "a", "content": "18C"}, {"role": "tool", "content": "25C"},
        {"role": "assistant", "content": "Paris 18C, Rome 25C."},
        {"role": "user", "content": "Thanks"}]})";
  const std::string tools =
      "## Tools\nYou have access to the following tools:\n"
      "\n### get_weather\nDescription: Weather now\n\nParameters: {\"type\": \"object\", \"properties\": "
      "{\"city\": {\"type\": \"string\", \"description\": \"St\\u00e4dte\"}}, \"required\": [\"city\"]}\n"
      "\n### noop\nDescription: \n\nParameters: {}\n"
      "\nIMPORTANT: ALWAYS adhere to this exact format for tool use:\n"
      "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>tool_call_name<｜tool▁sep｜>tool_call_arguments<｜tool▁call▁end｜>"
      "{{additional_tool_calls}}<｜tool▁calls▁end｜>\n\nWhere:\n\n"
      "- `tool_call_name` must be an exact match to one of the available tools\n"
      "- `tool_call_arguments` must be valid JSON that strictly follows the tool's Parameters Schema\n"
      "- For multiple tool calls, chain them directly without separators or spaces\n";
  EXPECT_EQ(Render(request),
            "<｜begin▁of▁sentence｜>Be brief.\n\n" + tools +
                "<｜User｜>Paris and Rome?<｜Assistant｜></think>Checking.<｜tool▁calls▁begin｜>"
                "<｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{\"city\": \"Paris\"}<｜tool▁call▁end｜>"
                "<｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{\"city\": \"Rome\"}<｜tool▁call▁end｜>"
                "<｜tool▁calls▁end｜><｜end▁of▁sentence｜>"
                "<｜tool▁output▁begin｜>18C<｜tool▁output▁end｜><｜tool▁output▁begin｜>25C<｜tool▁output▁end｜>"
                "Paris 18C, Rome 25C.<｜end▁of▁sentence｜><｜User｜>Thanks<｜Assistant｜></think>");
  // After a tool result the model answers directly: no generation prompt; tool_choice none
  // leaves the tools out.
  const std::string after_tool = R"({"format": "deepseek_v31", "add_generation_prompt": true, "tool_choice": "none",
      "tools": [{"type": "function", "function": {"name": "f"}}],
      "messages": [{"role": "user", "content": "q"},
                   {"role": "assistant", "content": null, "tool_calls": [{"function": {"name": "f", "arguments": "{}"}}]},
                   {"role": "tool", "content": "r"}]})";
  EXPECT_EQ(Render(after_tool),
            "<｜begin▁of▁sentence｜><｜User｜>q<｜Assistant｜></think><｜tool▁calls▁begin｜><｜tool▁call▁begin｜>f"
            "<｜tool▁sep｜>{}<｜tool▁call▁end｜><｜tool▁calls▁end｜><｜end▁of▁sentence｜>"
            "<｜tool▁output▁begin｜>r<｜tool▁output▁end｜>");
}

TEST(ChatTemplateV31, ToolErrors) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {R"({"messages": [], "tools": {}})", "\"tools\" must be a list"},
      {R"({"messages": [], "tools": [{"type": "function", "function": {"name": "bad name"}}]})", "tools[0].function.name"},
      {R"({"messages": [], "tools": [{"function": {"name": "a"}}, {"function": {"name": "a"}}]})", "repeated"},
      {R"({"messages": [], "tools": [{"function": {"name": "a", "parameters": 3}}]})", "tools[0].function.parameters"},
      {R"({"messages": [], "tool_choice": "required"})", "needs \"tools\""},
      {R"({"messages": [], "tools": [{"function": {"name": "a"}}], "tool_choice": {"type": "function", "function": {"name": "b"}}})",
       "names function 'b'"},
      {R"({"messages": [], "tool_choice": "sometimes"})", "\"tool_choice\" must be"},
      {R"({"messages": [], "format": "llama"})", "\"format\" must be"},
  };
  for (const auto& [json, needle] : cases) {
    auto r = ParseChatRequest(json);
    ASSERT_FALSE(r.ok()) << json;
    EXPECT_NE(r.status().message().find(needle), std::string::npos) << r.status().ToString();
  }
  // Tools with the V3 format are refused rather than dropped.
  auto r = ParseChatRequest(R"({"messages": [{"role": "user", "content": "x"}], "tools": [{"function": {"name": "a"}}]})");
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(ChatTemplate(kBos).Render(r->messages, r->options).status().code(), StatusCode::kInvalidArgument);
}

TEST(Tools, PythonJsonDumps) {
  EXPECT_EQ(PythonJsonDumps(R"({"b": [1, 2.5, true, null], "a": {"x": "é😀\n\"\u0001"}})").value(),
            R"({"b": [1, 2.5, true, null], "a": {"x": "\u00e9\ud83d\ude00\n\"\u0001"}})");
  EXPECT_FALSE(PythonJsonDumps("{").ok());
}

}  // namespace
}  // namespace pdserve::tokenizer
