// tool_choice "required" / a named function over the real vocabulary: the tool-call grammar
// (tokenizer/tool_call_grammar.h) compiled as an EBNF constraint; replies sampled under the
// mask parse with ChatOutputParser into calls of offered functions whose arguments parse and
// validate against the function's parameters; thinking mode keeps free reasoning first.
// To add a case: a tool to kTools or a ToolChoice to the loops below.
#include <cstdio>
#include <cstdlib>
#include <random>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "grammar/bitmask.h"
#include "grammar/constraint.h"
#include "grammar/json_schema.h"
#include "grammar/matcher.h"
#include "tests/grammar/deepseek_vocabulary.h"
#include "tests/grammar/schema_validator.h"
#include "tokenizer/chat_output_parser.h"
#include "tokenizer/tool_call_grammar.h"

namespace pdserve::grammar {
namespace {

using Json = nlohmann::ordered_json;
using tokenizer::ToolChoice;
using tokenizer::ToolChoiceMode;
using tokenizer::ToolFunction;

const std::vector<ToolFunction> kTools = {
    {"get_weather", "Weather now",
     R"({"type": "object", "properties": {"city": {"type": "string", "maxLength": 20},
         "unit": {"enum": ["c", "f"]}}, "required": ["city"], "additionalProperties": false})"},
    {"search", "Web search",
     R"({"type": "object", "properties": {"q": {"type": "string", "minLength": 1, "maxLength": 30},
         "top_k": {"type": "integer", "minimum": 1, "maximum": 10}}, "required": ["q", "top_k"]})"},
    {"ping", "No arguments", ""},
};

// Samples one reply under the mask: random allowed tokens, preferring punctuation and markers
// later so the reply ends. With `thinking`, 10 random reasoning tokens come first and then the
// tokens of "</think>" (each must be allowed). Returns the text (without the stop token).
std::string Sample(const std::shared_ptr<const CompiledGrammar>& g, uint64_t seed, bool thinking) {
  const Vocabulary& v = g->vocabulary();
  GrammarMatcher m(g);
  std::mt19937_64 rng(seed);
  std::vector<uint32_t> mask(static_cast<size_t>(v.mask_words()));
  std::string text;
  std::vector<int32_t> end_reasoning;
  if (thinking) end_reasoning = testing::DeepSeekTokenizer()->Encode("</think>").value();
  for (int step = 0; step < 3000 && !m.IsTerminated(); ++step) {
    EXPECT_TRUE(m.FillNextTokenBitmask(mask.data()));
    if (thinking && step >= 10 && step < 10 + static_cast<int>(end_reasoning.size())) {
      const int32_t id = end_reasoning[static_cast<size_t>(step - 10)];
      EXPECT_TRUE(MaskAllows(mask.data(), id));
      EXPECT_TRUE(m.AcceptToken(id).ok());
      text += v.bytes(id);
      continue;
    }
    std::vector<int32_t> allowed, preferred;
    for (int32_t id = 0; id < v.size(); ++id) {
      if (!MaskAllows(mask.data(), id)) continue;
      allowed.push_back(id);
      const std::string_view b = v.bytes(id);
      if (v.is_stop(id) || b.find_first_of("\"}]<") != std::string_view::npos || b.find("｜") != std::string_view::npos)
        preferred.push_back(id);
    }
    const bool prefer = !preferred.empty() && (!thinking || step >= 10) &&
                        rng() % 100 < static_cast<uint64_t>(step < 40 ? 30 : 90);
    const std::vector<int32_t>& from = prefer ? preferred : allowed;
    const int32_t id = from[rng() % from.size()];
    EXPECT_TRUE(m.AcceptToken(id).ok());
    if (!v.is_stop(id)) text += v.bytes(id);
  }
  EXPECT_TRUE(m.IsTerminated()) << text;
  return text;
}

void CheckCalls(const tokenizer::ParsedMessage& msg, const ToolChoice& choice, const std::string& text) {
  ASSERT_FALSE(msg.tool_calls.empty()) << text;
  if (choice.mode == ToolChoiceMode::kFunction || !choice.parallel) {
    ASSERT_EQ(msg.tool_calls.size(), 1u) << text;
  }
  EXPECT_TRUE(msg.content.empty()) << text;
  for (const tokenizer::ParsedToolCall& call : msg.tool_calls) {
    auto tool = std::find_if(kTools.begin(), kTools.end(), [&](const ToolFunction& t) { return t.name == call.name; });
    ASSERT_NE(tool, kTools.end()) << call.name;
    if (choice.mode == ToolChoiceMode::kFunction) {
      EXPECT_EQ(call.name, choice.function);
    }
    Json args;
    ASSERT_NO_THROW(args = Json::parse(call.arguments)) << call.arguments;
    const Json schema = Json::parse(tool->parameters.empty() ? std::string(R"({"type": "object", "properties": {}})")
                                                             : tool->parameters);
    EXPECT_EQ(testing::ValidateJson(args, schema), "") << call.arguments;
  }
}

TEST(ToolCallGrammar, RequiredAndNamedRepliesAreValidCalls) {
  auto vocab = testing::DeepSeekVocabulary();
  ASSERT_NE(vocab, nullptr);
  GrammarCache cache(vocab);
  const std::vector<ToolChoice> choices = {{ToolChoiceMode::kRequired, ""},
                                           {ToolChoiceMode::kRequired, "", /*parallel=*/false},
                                           {ToolChoiceMode::kFunction, "search"},
                                           {ToolChoiceMode::kFunction, "ping"}};
  for (const ToolChoice& choice : choices) {
    for (bool thinking : {false, true}) {
      auto text = tokenizer::ToolCallGrammar(kTools, choice);
      ASSERT_TRUE(text.ok()) << text.status().ToString();
      Constraint c{.kind = ConstraintKind::kEbnf, .text = *text, .free_text_until = thinking ? "</think>" : ""};
      auto g = cache.Get(c);
      ASSERT_TRUE(g.ok()) << g.status().ToString() << "\n" << *text;
      for (uint64_t seed = 0; seed < 6; ++seed) {
        const std::string reply = Sample(*g, seed, thinking);
        tokenizer::ChatOutputParser parser({.starts_in_reasoning = thinking});
        (void)parser.Push(reply);
        (void)parser.Finish();
        CheckCalls(parser.message(), choice, reply);
        if (seed == 0 && std::getenv("PDSERVE_SHOW_REPLIES")) std::printf("%s\n\n", reply.c_str());
        if (HasFatalFailure()) return;
      }
    }
  }
}

TEST(ToolCallGrammar, Errors) {
  EXPECT_FALSE(tokenizer::ToolCallGrammar(kTools, {ToolChoiceMode::kAuto, ""}).ok());
  EXPECT_FALSE(tokenizer::ToolCallGrammar({}, {ToolChoiceMode::kRequired, ""}).ok());
  EXPECT_FALSE(tokenizer::ToolCallGrammar(kTools, {ToolChoiceMode::kFunction, "nope"}).ok());
  // A parameters schema the grammar cannot honour is reported against its tool.
  const Status s = ValidateJsonSchema(R"({"type": "object", "properties": {"x": {"type": "string", "format": "ipv6"}}})",
                                      "tools[3].function.parameters");
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("tools[3].function.parameters: json_schema: unsupported format 'ipv6' at #/properties/x/format"),
            std::string::npos)
      << s.ToString();
}

}  // namespace
}  // namespace pdserve::grammar
