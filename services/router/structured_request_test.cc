// The OpenAI fields of structured output, tools, thinking and n: parsing (openai_request.h),
// every refusal naming its field, and preparation (request_prep.h) with the real tokenizer and
// chat template: the chat format, the constraint each request gets (response_format, the
// tool-call grammar, the reasoning prefix), the output parser's options, logit_bias ids.
// To add a case: a body and what ParsedRequest / PreparedRequest must hold, or a body and the
// `param` its 400 names.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "grammar/constraint.h"
#include "services/router/openai_request.h"
#include "services/router/request_prep.h"
#include "tokenizer/tokenizer_paths.h"

namespace pdserve::router {
namespace {

using grammar::ConstraintKind;
using nlohmann::json;

const std::string kUser = R"("messages":[{"role":"user","content":"Weather in Paris?"}])";

ParsedRequest MustParse(ApiEndpoint endpoint, const std::string& body) {
  ParsedRequest r;
  auto e = ParseRequest(endpoint, body, &r);
  EXPECT_FALSE(e) << body << " -> " << (e ? e->message : "");
  return r;
}
ParsedRequest Chat(const std::string& fields) {
  return MustParse(ApiEndpoint::kChat, R"({"model":"m",)" + kUser + (fields.empty() ? "" : "," + fields) + "}");
}

const char* kWeatherTool = R"({"type":"function","function":{"name":"get_weather","description":"Weather now",
  "parameters":{"type":"object","properties":{"unit":{"enum":["c","f"]},"city":{"type":"string"}},
                "required":["city"]}}})";

TEST(StructuredRequestTest, ResponseFormatKinds) {
  EXPECT_FALSE(Chat(R"("response_format":{"type":"text"})").constraint.active());
  auto obj = Chat(R"("response_format":{"type":"json_object"})");
  EXPECT_EQ(obj.constraint.kind, ConstraintKind::kJsonObject);
  EXPECT_EQ(obj.constraint_param, "response_format");

  // The schema keeps the request's property order ("zeta" before "alpha"); strict as given.
  auto schema = Chat(R"("response_format":{"type":"json_schema","json_schema":{"name":"answer","strict":false,
      "schema":{"type":"object","properties":{"zeta":{"type":"integer"},"alpha":{"type":"string"}}}}})");
  EXPECT_EQ(schema.constraint.kind, ConstraintKind::kJsonSchema);
  EXPECT_LT(schema.constraint.text.find("zeta"), schema.constraint.text.find("alpha")) << schema.constraint.text;
  EXPECT_FALSE(schema.constraint.json.strict);
  EXPECT_TRUE(Chat(R"("response_format":{"type":"json_schema","json_schema":{"schema":{"type":"object"}}})")
                  .constraint.json.strict);

  auto re = MustParse(ApiEndpoint::kCompletions,
                      R"({"model":"m","prompt":"x","response_format":{"type":"regex","regex":"[0-9]{3}"}})");
  EXPECT_EQ(re.constraint.kind, ConstraintKind::kRegex);
  EXPECT_EQ(re.constraint.text, "[0-9]{3}");
  auto g = Chat(R"("response_format":{"type":"grammar","grammar":"root ::= \"yes\" | \"no\""})");
  EXPECT_EQ(g.constraint.kind, ConstraintKind::kEbnf);

  // vLLM's spellings: a schema as an object or as text, regex, grammar, choice.
  auto gj = Chat(R"("guided_json":{"type":"object","properties":{"b":{},"a":{}}})");
  EXPECT_EQ(gj.constraint.kind, ConstraintKind::kJsonSchema);
  EXPECT_EQ(gj.constraint_param, "guided_json");
  EXPECT_LT(gj.constraint.text.find("\"b\""), gj.constraint.text.find("\"a\""));
  EXPECT_EQ(Chat(R"("guided_json":"{\"type\":\"integer\"}")").constraint.text, R"({"type":"integer"})");
  EXPECT_EQ(Chat(R"("guided_regex":"a+")").constraint.kind, ConstraintKind::kRegex);
  EXPECT_EQ(Chat(R"("guided_grammar":"root ::= \"a\"")").constraint.kind, ConstraintKind::kEbnf);
  auto choice = Chat(R"J("guided_choice":["yes","no (maybe)","a.b"])J");
  EXPECT_EQ(choice.constraint.kind, ConstraintKind::kRegex);
  EXPECT_EQ(choice.constraint.text, R"((?:yes|no \(maybe\)|a\.b))");
  EXPECT_TRUE(grammar::BuildGrammar(choice.constraint).ok());
}

TEST(StructuredRequestTest, ToolsChoiceThinkingBiasAndN) {
  auto r = Chat(std::string(R"("tools":[)") + kWeatherTool +
                R"(,{"type":"function","function":{"name":"noop"}}],"tool_choice":"required",
                    "chat_template_kwargs":{"enable_thinking":true},"logit_bias":{"5":-100,"128":2.5},"n":3,
                    "seed":11,"parallel_tool_calls":true)");
  ASSERT_EQ(r.chat_options.tools.size(), 2u);
  EXPECT_EQ(r.chat_options.tools[0].name, "get_weather");
  // Parameters keep the request's order: "unit" before "city".
  EXPECT_LT(r.chat_options.tools[0].parameters.find("unit"), r.chat_options.tools[0].parameters.find("city"));
  EXPECT_EQ(r.chat_options.tool_choice.mode, tokenizer::ToolChoiceMode::kRequired);
  EXPECT_TRUE(r.chat_options.tool_choice.parallel);
  EXPECT_FALSE(Chat(std::string(R"("tools":[)") + kWeatherTool + R"(],"tool_choice":"required","parallel_tool_calls":false)")
                   .chat_options.tool_choice.parallel);
  EXPECT_EQ(r.chat_options.thinking, true);
  ASSERT_EQ(r.sampling.logit_bias.size(), 2u);
  EXPECT_EQ(r.sampling.logit_bias[0], (LogitBias{5, -100.0f}));
  EXPECT_EQ(r.sampling.logit_bias[1], (LogitBias{128, 2.5f}));
  EXPECT_EQ(r.n, 3u);
  EXPECT_EQ(*r.sampling.seed, 11u);
  auto named = Chat(std::string(R"("tools":[)") + kWeatherTool +
                    R"(],"tool_choice":{"type":"function","function":{"name":"get_weather"}})");
  EXPECT_EQ(named.chat_options.tool_choice.mode, tokenizer::ToolChoiceMode::kFunction);
  EXPECT_EQ(named.chat_options.tool_choice.function, "get_weather");
  EXPECT_EQ(Chat(R"("n":2,"best_of":2)").n, 2u);
  EXPECT_EQ(Chat(R"("chat_template_kwargs":{"thinking":false})").chat_options.thinking, false);
}

struct Refusal {
  const char* fields;  // added to a chat body
  const char* param;
  const char* says;    // the message contains this
};

TEST(StructuredRequestTest, RefusalsName400TheFieldAndTheKeyword) {
  const std::string tool = kWeatherTool;
  const Refusal cases[] = {
      {R"("response_format":"json")", "response_format", "response_format"},
      {R"("response_format":{"type":"xml"})", "response_format", "xml"},
      {R"("response_format":{"type":"json_schema"})", "response_format", "json_schema"},
      {R"("response_format":{"type":"json_schema","json_schema":{"name":"a b","schema":{}}})", "response_format",
       "name"},
      {R"("response_format":{"type":"json_schema","json_schema":{"schema":{},"strict":"yes"}})", "response_format",
       "strict"},
      {R"("response_format":{"type":"json_schema","json_schema":{"schema":5}})", "response_format", "schema"},
      // Unsupported keywords and malformed schemas: the field, the keyword and its pointer.
      {R"("response_format":{"type":"json_schema","json_schema":{"schema":{"type":"object","properties":
          {"tags":{"type":"object","minProperties":1}}}}})",
       "response_format", "'minProperties' at #/properties/tags"},
      {R"("response_format":{"type":"json_schema","json_schema":{"schema":{"oneOf":[{"type":"string"}]}}})",
       "response_format", "oneOf"},
      {R"("response_format":{"type":"json_schema","json_schema":{"schema":{"type":"array","minItems":3,
          "maxItems":1}}})",
       "response_format", "response_format.json_schema.schema"},
      {R"("response_format":{"type":"json_schema","json_schema":{"schema":{"$ref":"#/$defs/nope"}}})",
       "response_format", "nope"},
      {R"("response_format":{"type":"json_schema","json_schema":{"schema":{"type":"strnig"}}})", "response_format",
       "at #/type"},
      {R"("guided_json":{"type":"object","patternProperties":{}})", "guided_json", "patternProperties"},
      {R"("guided_json":"{not json")", "guided_json", "not valid JSON"},
      {R"("guided_json":[1])", "guided_json", "guided_json"},
      {R"("response_format":{"type":"regex","regex":"(a)\\1"})", "response_format", "response_format.regex"},
      {R"("response_format":{"type":"regex"})", "response_format", "regex"},
      {R"("response_format":{"type":"grammar","grammar":"root ::= ("})", "response_format",
       "response_format.grammar"},
      {R"("guided_regex":"(?<=a)b")", "guided_regex", "guided_regex"},
      {R"("guided_grammar":"root ::= undefined_rule")", "guided_grammar", "guided_grammar"},
      {R"("guided_choice":[])", "guided_choice", "guided_choice"},
      {R"("guided_choice":["a",""])", "guided_choice", "guided_choice"},
      // One constraint per request.
      {R"("response_format":{"type":"json_object"},"guided_regex":"a")", "guided_regex", "response_format"},
      // Tools: the tool and field named, a schema keyword with its pointer.
      {R"("tools":{"a":1})", "tools", "list"},
      {R"("tools":[{"type":"function","function":{"name":"bad name"}}])", "tools", "tools[0].function.name"},
      {R"("tools":[{"type":"function","function":{"name":"f"}},{"type":"function","function":{"name":"f"}}])",
       "tools", "repeated"},
      {R"("tools":[{"type":"function","function":{"name":"f"}},{"type":"function","function":{"name":"g",
          "parameters":{"type":"object","properties":{"x":{"not":{}}}}}}])",
       "tools", "tools[1].function.parameters: json_schema: unsupported keyword 'not' at #/properties/x"},
      {R"("tool_choice":"required")", "tool_choice", "tool"},
      {R"("tool_choice":"sometimes")", "tool_choice", "tool_choice"},
      {R"("tools":[{"type":"function","function":{"name":"f"}}],"tool_choice":{"type":"function",
          "function":{"name":"g"}})",
       "tool_choice", "g"},
      {R"("tools":[{"type":"function","function":{"name":"f"}}],"tool_choice":"required",
          "response_format":{"type":"json_object"})",
       "tool_choice", "response_format"},
      {R"("tools":[{"type":"function","function":{"name":"f"}}],"parallel_tool_calls":"no")", "parallel_tool_calls",
       "boolean"},
      {R"("chat_template_kwargs":{"enable_thinking":"yes"})", "chat_template_kwargs", "enable_thinking"},
  };
  for (const Refusal& c : cases) {
    const std::string body = R"({"model":"m",)" + kUser + "," + c.fields + "}";
    SCOPED_TRACE(body);
    ParsedRequest r;
    auto e = ParseRequest(ApiEndpoint::kChat, body, &r);
    ASSERT_TRUE(e.has_value());
    EXPECT_EQ(e->http_status, 400);
    EXPECT_EQ(e->param, c.param);
    EXPECT_NE(e->message.find(c.says), std::string::npos) << e->message;
  }
  (void)tool;
}

class PrepareTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    tokenizer_ = tokenizer::Tokenizer::Load(tokenizer::DefaultTokenizerDir()).value().release();
    template_ = new tokenizer::ChatTemplate(tokenizer::ChatTemplate::FromConfig(tokenizer_->config()).value());
  }

  // Parses and prepares; the 400 (or nullopt) in *error.
  PreparedRequest Prepare(ApiEndpoint endpoint, const std::string& body, std::optional<ApiError>* error = nullptr,
                          const std::string& chat_format = "auto") {
    RouterConfig config;
    config.model_name = "m";
    config.chat_format = chat_format;
    ParsedRequest pr = MustParse(endpoint, body);
    PreparedRequest out;
    auto e = PrepareRequest(config, *tokenizer_, *template_, pr, "req", std::chrono::steady_clock::now(), &out);
    if (error) {
      *error = e;
    } else {
      EXPECT_FALSE(e) << body << " -> " << (e ? e->message : "");
    }
    prompt_text_ = tokenizer_->Decode(out.spec.prompt, {false}).value();
    return out;
  }
  PreparedRequest PrepareChat(const std::string& fields, std::optional<ApiError>* error = nullptr,
                              const std::string& chat_format = "auto") {
    return Prepare(ApiEndpoint::kChat, R"({"model":"m",)" + kUser + (fields.empty() ? "" : "," + fields) + "}",
                   error, chat_format);
  }

  static tokenizer::Tokenizer* tokenizer_;
  static tokenizer::ChatTemplate* template_;
  std::string prompt_text_;
};
tokenizer::Tokenizer* PrepareTest::tokenizer_ = nullptr;
tokenizer::ChatTemplate* PrepareTest::template_ = nullptr;

TEST_F(PrepareTest, PlainChatIsUnconstrainedAndParsedAsContent) {
  auto p = PrepareChat("");
  EXPECT_FALSE(p.spec.constraint.active());
  ASSERT_TRUE(p.session.chat.has_value());
  EXPECT_FALSE(p.session.chat->starts_in_reasoning);
  EXPECT_FALSE(p.session.chat->parse_tool_calls);
  EXPECT_EQ(p.n, 1u);
  // auto: the package template without tools (its generation prompt has no </think>).
  EXPECT_EQ(prompt_text_.find("</think>"), std::string::npos) << prompt_text_;
  // Completions get no parser.
  auto c = Prepare(ApiEndpoint::kCompletions, R"({"model":"m","prompt":"x","guided_regex":"[ab]+"})");
  EXPECT_FALSE(c.session.chat.has_value());
  EXPECT_EQ(c.spec.constraint.kind, ConstraintKind::kRegex);
  EXPECT_TRUE(c.spec.constraint.free_text_until.empty());
}

TEST_F(PrepareTest, ThinkingOpensReasoningAndTheConstraintFollowsIt) {
  auto p = PrepareChat(R"("chat_template_kwargs":{"thinking":true},"response_format":{"type":"json_object"})");
  EXPECT_TRUE(p.session.chat->starts_in_reasoning);
  EXPECT_EQ(p.spec.constraint.kind, ConstraintKind::kJsonObject);
  EXPECT_EQ(p.spec.constraint.free_text_until, "</think>");
  EXPECT_EQ(prompt_text_.substr(prompt_text_.size() - 7), "<think>");
  auto off = PrepareChat(R"("chat_template_kwargs":{"thinking":false},"response_format":{"type":"json_object"})");
  EXPECT_FALSE(off.session.chat->starts_in_reasoning);
  EXPECT_TRUE(off.spec.constraint.free_text_until.empty());
}

TEST_F(PrepareTest, RequiredAndNamedToolChoicesAreConstrainedByTheCallGrammar) {
  const std::string tools = std::string(R"("tools":[)") + kWeatherTool + "]";
  auto required = PrepareChat(tools + R"(,"tool_choice":"required")");
  EXPECT_EQ(required.spec.constraint.kind, ConstraintKind::kEbnf);
  EXPECT_NE(required.spec.constraint.text.find("get_weather"), std::string::npos);
  EXPECT_TRUE(required.session.chat->parse_tool_calls);
  EXPECT_TRUE(grammar::BuildGrammar(required.spec.constraint).ok());
  // auto with tools: V3.1's format, the tools block in the prompt.
  EXPECT_NE(prompt_text_.find("## Tools"), std::string::npos) << prompt_text_;
  EXPECT_NE(prompt_text_.find("### get_weather"), std::string::npos);
  auto thinking = PrepareChat(tools + R"(,"tool_choice":{"type":"function","function":{"name":"get_weather"}},
                                         "thinking":true)");
  EXPECT_EQ(thinking.spec.constraint.kind, ConstraintKind::kEbnf);
  EXPECT_EQ(thinking.spec.constraint.free_text_until, "</think>");
  EXPECT_TRUE(thinking.session.chat->starts_in_reasoning);
  // auto: the model chooses; nothing constrains it; the parser reads the calls.
  auto free = PrepareChat(tools);
  EXPECT_FALSE(free.spec.constraint.active());
  EXPECT_TRUE(free.session.chat->parse_tool_calls);
  // none: no calls, no parsing of markers.
  auto none = PrepareChat(tools + R"(,"tool_choice":"none")");
  EXPECT_FALSE(none.spec.constraint.active());
  EXPECT_FALSE(none.session.chat->parse_tool_calls);
  EXPECT_EQ(prompt_text_.find("## Tools"), std::string::npos);
  // The package format has no tools block: refused, naming the field.
  std::optional<ApiError> e;
  PrepareChat(tools, &e, "deepseek_v3");
  ASSERT_TRUE(e);
  EXPECT_EQ(e->param, "tools");
  // deepseek_v31 everywhere: even a plain chat gets V3.1's generation prompt.
  PrepareChat("", nullptr, "deepseek_v31");
  EXPECT_EQ(prompt_text_.substr(prompt_text_.size() - 8), "</think>");
}

TEST_F(PrepareTest, ToolResultsAndEarlierCallsGoThroughTheTemplate) {
  const std::string body = std::string(R"({"model":"m","tools":[)") + kWeatherTool + R"(],"messages":[
      {"role":"user","content":"Weather in Paris?"},
      {"role":"assistant","content":null,"tool_calls":[{"id":"call_1","type":"function",
          "function":{"name":"get_weather","arguments":"{\"city\": \"Paris\"}"}}]},
      {"role":"tool","tool_call_id":"call_1","content":"18 C, sunny"}]})";
  Prepare(ApiEndpoint::kChat, body);
  EXPECT_NE(prompt_text_.find("<｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{\"city\": \"Paris\"}<｜tool▁call▁end｜>"),
            std::string::npos)
      << prompt_text_;
  EXPECT_NE(prompt_text_.find("<｜tool▁output▁begin｜>18 C, sunny<｜tool▁output▁end｜>"), std::string::npos)
      << prompt_text_;
}

TEST_F(PrepareTest, LogitBiasIdsAndTheStopTokenOfConstrainedOutput) {
  std::optional<ApiError> e;
  PrepareChat(R"("logit_bias":{"99999999":1})", &e);
  ASSERT_TRUE(e);
  EXPECT_EQ(e->param, "logit_bias");
  auto ok = PrepareChat(R"("logit_bias":{"100":-100})");
  ASSERT_EQ(ok.spec.sampling.logit_bias.size(), 1u);
  EXPECT_EQ(ok.spec.sampling.logit_bias[0].token, 100);
  // ignore_eos: the workers do not stop at EOS, but a constrained output ends with it, and it
  // is never shown.
  const int32_t eos = *tokenizer_->eos_id();
  auto c = PrepareChat(R"("ignore_eos":true,"response_format":{"type":"json_object"},"n":4)");
  EXPECT_EQ(std::count(c.spec.sampling.stop_token_ids.begin(), c.spec.sampling.stop_token_ids.end(), eos), 0);
  EXPECT_EQ(std::count(c.session.stop_token_ids.begin(), c.session.stop_token_ids.end(), eos), 1);
  EXPECT_EQ(c.n, 4u);
}

}  // namespace
}  // namespace pdserve::router
