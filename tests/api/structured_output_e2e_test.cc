// The OpenAI API's structured output, tools, thinking, n and seed end to end: a real
// pdserve-router and real engine workers (pdserve-colocated, or pdserve-prefill +
// pdserve-decode over UCX tcp) on loopback with the random tiny model over DeepSeek's
// vocabulary (services/testing/worker_test_cluster.h). A random model writes anything it may,
// so every valid reply here is the constraint's doing:
//   - 200 generated JSON Schemas (nested objects, enums, const, bounded arrays and tuples,
//     anyOf, $ref to $defs, patterns, formats, integer bounds), greedy and sampled, streamed
//     and not: every reply ends with finish_reason "stop", parses, repeats no key and
//     validates (tests/grammar/schema_validator.h, written apart from the grammar);
//   - json_object, stop strings and max_tokens: a truncated JSON reports "length";
//   - tool_choice "required" and a named function, with and without thinking: every reply is
//     tool calls whose arguments validate against the function's parameters;
//   - thinking: the reasoning goes to reasoning_content and is counted in usage;
//   - n choices with a seed are reproducible, streamed or not; a seeded request gives the same
//     text on a colocated and on a disaggregated cluster, constrained or not;
//   - malformed schemas and unsupported keywords: 400 naming the field.
// To add a case: a request body and what every reply must satisfy.
#include <atomic>
#include <map>
#include <mutex>
#include <set>
#include <thread>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "services/client/request_client.h"
#include "services/testing/cluster_fixture.h"
#include "services/testing/worker_test_cluster.h"
#include "tests/api/api_cluster.h"
#include "tests/grammar/bounded_schema_gen.h"
#include "tests/grammar/schema_validator.h"

namespace pdserve::api_e2e {
namespace {

using namespace std::chrono_literals;
using Json = nlohmann::ordered_json;
using grammar::testing::BoundedSchemaGen;
using grammar::testing::HasDuplicateKeys;
using grammar::testing::ValidateJson;
using router::testing::TestCluster;
using services::testing::HttpPost;
using services::testing::HttpPostSse;
using services::worker::e2e::Tok;
using services::worker::e2e::UcxTcpUsable;
using testing::ApiCluster;

// One choice of a reply, whole or assembled from its stream.
struct Choice {
  std::string content;
  std::string reasoning;
  struct Call {
    std::string id, name, arguments;
  };
  std::vector<Call> calls;
  std::string finish_reason;
};

struct Reply {
  int status = 0;
  std::string error;  // the body of a non-200, or the stream's error event
  std::vector<Choice> choices;
  Json usage;
};

Reply FromWhole(const services::testing::HttpReply& r) {
  Reply out;
  out.status = r.status;
  if (r.status != 200) {
    out.error = r.body + r.error;
    return out;
  }
  const Json j = Json::parse(r.body);
  out.usage = j["usage"];
  for (const Json& c : j["choices"]) {
    Choice ch;
    const Json& m = c["message"];
    if (m["content"].is_string()) ch.content = m["content"].get<std::string>();
    if (m.contains("reasoning_content")) ch.reasoning = m["reasoning_content"].get<std::string>();
    if (m.contains("tool_calls"))
      for (const Json& t : m["tool_calls"])
        ch.calls.push_back({t["id"].get<std::string>(), t["function"]["name"].get<std::string>(),
                            t["function"]["arguments"].get<std::string>()});
    ch.finish_reason = c["finish_reason"].get<std::string>();
    out.choices.push_back(std::move(ch));
  }
  return out;
}

Reply FromStream(const services::testing::SseReply& r) {
  Reply out;
  out.status = r.status;
  if (r.status != 200) {
    out.error = r.raw + r.error;
    return out;
  }
  for (const std::string& e : r.events) {
    const Json j = Json::parse(e);
    if (j.contains("error")) {
      out.error = e;
      continue;
    }
    if (j.contains("usage") && !j["usage"].is_null()) out.usage = j["usage"];
    for (const Json& c : j["choices"]) {
      const size_t i = c["index"].get<size_t>();
      if (out.choices.size() <= i) out.choices.resize(i + 1);
      Choice& ch = out.choices[i];
      const Json& d = c["delta"];
      if (d.contains("content") && d["content"].is_string()) ch.content += d["content"].get<std::string>();
      if (d.contains("reasoning_content")) ch.reasoning += d["reasoning_content"].get<std::string>();
      if (d.contains("tool_calls"))
        for (const Json& t : d["tool_calls"]) {
          const size_t k = t["index"].get<size_t>();
          if (ch.calls.size() <= k) ch.calls.resize(k + 1);
          if (t.contains("id")) ch.calls[k].id = t["id"].get<std::string>();
          if (t["function"].contains("name")) ch.calls[k].name = t["function"]["name"].get<std::string>();
          ch.calls[k].arguments += t["function"]["arguments"].get<std::string>();
        }
      if (!c["finish_reason"].is_null()) ch.finish_reason = c["finish_reason"].get<std::string>();
    }
  }
  if (!r.done && out.error.empty()) out.error = "the stream did not end with [DONE]";
  return out;
}

Reply Chat(int port, Json body, bool stream) {
  if (stream) {
    body["stream"] = true;
    body["stream_options"] = {{"include_usage", true}};
    return FromStream(HttpPostSse(port, "/v1/chat/completions", body.dump(), 300s));
  }
  return FromWhole(HttpPost(port, "/v1/chat/completions", body.dump(), 300s));
}

Json ChatBody(const std::string& user, int max_tokens) {
  return {{"model", "pdserve"},
          {"messages", Json::array({{{"role", "user"}, {"content", user}}})},
          {"max_tokens", max_tokens}};
}

// "" when `text` is a document that validates against `schema`; else why not.
std::string CheckDocument(const std::string& text, const Json& schema) {
  const Json doc = Json::parse(text, nullptr, false);
  if (doc.is_discarded()) return "not JSON";
  if (HasDuplicateKeys(text)) return "a repeated key";
  return ValidateJson(doc, schema);
}

// Runs fn(i) for i in [0, n) on `threads` threads (the engine batches what arrives together).
void ParallelFor(int n, int threads, const std::function<void(int)>& fn) {
  std::atomic<int> next{0};
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t)
    pool.emplace_back([&] {
      for (int i = next++; i < n; i = next++) fn(i);
    });
  for (auto& t : pool) t.join();
}

// Sends each schema as response_format json_schema (greedy for even i, sampled with seed i
// for odd ones; every third streamed) and checks every reply. Returns the failures.
std::vector<std::string> RunSchemas(int port, const std::vector<Json>& schemas, int threads) {
  std::mutex mu;
  std::vector<std::string> failures;
  ParallelFor(static_cast<int>(schemas.size()), threads, [&](int i) {
    Json body = ChatBody("Answer in JSON #" + std::to_string(i), 1000);
    body["response_format"] = {{"type", "json_schema"},
                               {"json_schema", {{"name", "answer"}, {"strict", true}, {"schema", schemas[i]}}}};
    body["temperature"] = i % 2 == 0 ? 0.0 : 1.0;
    if (i % 2 == 1) body["seed"] = i;
    const Reply r = Chat(port, body, i % 3 == 0);
    std::string why;
    if (r.status != 200 || !r.error.empty()) {
      why = "HTTP " + std::to_string(r.status) + ": " + r.error;
    } else if (r.choices.size() != 1) {
      why = "not one choice";
    } else if (r.choices[0].finish_reason != "stop") {
      why = "finish_reason " + r.choices[0].finish_reason;
    } else {
      why = CheckDocument(r.choices[0].content, schemas[i]);
    }
    if (!why.empty()) {
      std::lock_guard<std::mutex> lock(mu);
      failures.push_back("schema " + std::to_string(i) + " " + schemas[i].dump() + ": " + why + "\n  reply: " +
                         (r.choices.empty() ? std::string() : r.choices[0].content));
    }
  });
  return failures;
}

std::vector<Json> Schemas(uint64_t seed, int n) {
  BoundedSchemaGen gen(seed);
  std::vector<Json> out;
  // Hand-written first: nesting, enums, arrays with bounds, $ref.
  out.push_back(Json::parse(R"({"type": "object", "properties": {
      "order": {"type": "object", "properties": {
          "id": {"type": "integer", "minimum": 1, "maximum": 9999},
          "status": {"enum": ["pending", "paid", "shipped"]},
          "lines": {"type": "array", "minItems": 1, "maxItems": 3, "items": {"$ref": "#/$defs/line"}}},
        "required": ["id", "status", "lines"], "additionalProperties": false}},
      "required": ["order"], "additionalProperties": false,
      "$defs": {"line": {"type": "object", "properties": {
          "sku": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{2}$"},
          "qty": {"type": "integer", "minimum": 1, "maximum": 50}},
        "required": ["sku", "qty"], "additionalProperties": false}}})"));
  out.push_back(Json::parse(R"({"type": "array", "minItems": 2, "maxItems": 4,
      "items": {"anyOf": [{"type": "boolean"}, {"enum": ["x", 1, null]}]}})"));
  while (static_cast<int>(out.size()) < n) out.push_back(gen.Make());
  return out;
}

std::string Joined(const std::vector<std::string>& lines, size_t max = 10) {
  std::string out;
  for (size_t i = 0; i < lines.size() && i < max; ++i) out += lines[i] + "\n";
  return out;
}

TEST(StructuredOutputE2eTest, TwoHundredJsonSchemasValidateGreedyAndSampled) {
  ApiCluster c("api-schemas", false);
  ASSERT_TRUE(c.ok());
  const std::vector<Json> schemas = Schemas(20260, 204);
  const auto failures = RunSchemas(c.port(), schemas, 8);
  EXPECT_TRUE(failures.empty()) << failures.size() << " of " << schemas.size() << " replies failed:\n"
                                << Joined(failures) << c.Logs();
}

// A bias towards the tokens that close strings, objects and arrays: under json_object a random
// model would otherwise write one string for ever (nearly every token of the vocabulary may
// continue a string).
Json ClosingBias() {
  Json bias = Json::object();
  for (const char* piece : {"\"", "\",", "\":", "}", "]", "\"}", "},"}) {
    const auto ids = Tok().Encode(piece, {false, true}).value();
    if (ids.size() == 1) bias[std::to_string(ids[0])] = 12;
  }
  return bias;
}

TEST(StructuredOutputE2eTest, JsonObjectStopStringsAndTruncation) {
  ApiCluster c("api-json-object", false);
  ASSERT_TRUE(c.ok());
  for (int i = 0; i < 6; ++i) {
    SCOPED_TRACE(i);
    Json body = ChatBody("Any JSON object", 600);
    body["response_format"] = {{"type", "json_object"}};
    body["logit_bias"] = ClosingBias();
    body["temperature"] = i % 2 == 0 ? 0.0 : 1.0;
    body["seed"] = i;
    const Reply r = Chat(c.port(), body, i >= 3);
    ASSERT_EQ(r.status, 200) << r.error;
    ASSERT_EQ(r.choices.size(), 1u);
    EXPECT_EQ(r.choices[0].finish_reason, "stop");
    const Json doc = Json::parse(r.choices[0].content, nullptr, false);
    EXPECT_TRUE(doc.is_object()) << r.choices[0].content;
  }
  // max_tokens cuts the document: "length", and the text is a prefix, not a document.
  for (bool stream : {false, true}) {
    // At most 20 bytes of whitespace may lead, then the object; its string needs more than
    // 24 tokens of the vocabulary.
    Json body = ChatBody("A long JSON object", 24);
    body["response_format"] = {{"type", "json_schema"},
                               {"json_schema", {{"schema", {{"type", "object"},
                                                            {"properties", {{"name", {{"type", "string"},
                                                                                      {"minLength", 400},
                                                                                      {"maxLength", 500}}}}},
                                                            {"required", {"name"}}}}}}};
    const Reply r = Chat(c.port(), body, stream);
    ASSERT_EQ(r.status, 200) << r.error;
    EXPECT_EQ(r.choices[0].finish_reason, "length");
    const std::string& text = r.choices[0].content;
    EXPECT_TRUE(Json::parse(text, nullptr, false).is_discarded()) << text;
    const size_t first = text.find_first_not_of(" \t\n\r");
    ASSERT_NE(first, std::string::npos) << "only whitespace: " << text;
    EXPECT_EQ(text[first], '{') << text;
    EXPECT_EQ(r.usage["completion_tokens"], 24);
  }
  // A stop string the client asked for ends the document where it appears: "stop", and the
  // text holds everything before it.
  Json body = ChatBody("JSON with a list", 400);
  body["response_format"] = {{"type", "json_schema"},
                             {"json_schema", {{"schema", {{"type", "object"},
                                                          {"properties", {{"a", {{"enum", {"x", "y"}}}},
                                                                          {"b", {{"enum", {"p", "q"}}}}}},
                                                          {"required", {"a", "b"}}}}}}};
  body["stop"] = ",";
  const Reply r = Chat(c.port(), body, false);
  ASSERT_EQ(r.status, 200) << r.error;
  EXPECT_EQ(r.choices[0].finish_reason, "stop");
  EXPECT_EQ(r.choices[0].content.find(','), std::string::npos);
  EXPECT_NE(r.choices[0].content.find("\"a\""), std::string::npos) << r.choices[0].content;
  EXPECT_EQ(r.choices[0].content.find("\"b\""), std::string::npos) << r.choices[0].content;
}

// The model's tools: enums, bounded strings and arrays, a nested object; one without
// parameters.
const char* kTools = R"([
  {"type": "function", "function": {"name": "get_weather", "description": "Current weather",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "minLength": 1, "maxLength": 12},
        "unit": {"enum": ["celsius", "fahrenheit"]}},
      "required": ["city"], "additionalProperties": false}}},
  {"type": "function", "function": {"name": "book_table", "description": "Book a table",
    "parameters": {"type": "object", "properties": {
        "guests": {"type": "integer", "minimum": 1, "maximum": 12},
        "when": {"type": "object", "properties": {"date": {"type": "string", "format": "date"},
                                                  "time": {"type": "string", "pattern": "^[0-2][0-9]:[0-5][0-9]$"}},
                 "required": ["date"], "additionalProperties": false},
        "notes": {"type": "array", "maxItems": 2, "items": {"enum": ["window", "quiet", "vegan"]}}},
      "required": ["guests", "when"], "additionalProperties": false}}},
  {"type": "function", "function": {"name": "ping"}}])";

// "" when every call names a tool and its arguments validate against that tool's parameters.
std::string CheckCalls(const Choice& ch, const Json& tools, const std::string& only = "") {
  if (ch.calls.empty())
    return "no tool calls (finish_reason " + ch.finish_reason + ", content '" + ch.content + "', reasoning '" +
           ch.reasoning.substr(0, 300) + "')";
  if (ch.finish_reason != "tool_calls") return "finish_reason " + ch.finish_reason;
  std::set<std::string> ids;
  for (const Choice::Call& call : ch.calls) {
    if (call.id.rfind("call_", 0) != 0) return "call id '" + call.id + "'";
    ids.insert(call.id);
    if (!only.empty() && call.name != only) return "called " + call.name + ", not " + only;
    const Json* params = nullptr;
    for (const Json& t : tools)
      if (t["function"]["name"] == call.name)
        params = t["function"].contains("parameters") ? &t["function"]["parameters"] : nullptr;
    const Json none = {{"type", "object"}, {"additionalProperties", false}};
    const std::string why = CheckDocument(call.arguments, params ? *params : none);
    if (!why.empty()) return call.name + "(" + call.arguments + "): " + why;
  }
  if (ids.size() != ch.calls.size()) return "repeated call ids";
  if (!only.empty() && ch.calls.size() != 1) return "a named function is called once";
  return "";
}

// The ids of the tokens that spell "</think>", biased up; with a frequency penalty (which
// makes the model take the three in turn) a random model ends its reasoning after a few dozen
// tokens (EndReasoningSoon).
Json EndReasoningBias() {
  Json bias = Json::object();
  const std::vector<int32_t> ids = Tok().Encode("</think>", {false, true}).value();
  for (int32_t id : ids) bias[std::to_string(id)] = 100;
  return bias;
}

void EndReasoningSoon(Json* body) {
  (*body)["logit_bias"] = EndReasoningBias();
  (*body)["frequency_penalty"] = 2.0;
}

TEST(StructuredOutputE2eTest, RequiredAndNamedToolChoicesGiveValidCalls) {
  ApiCluster c("api-tools", false);
  ASSERT_TRUE(c.ok());
  const Json tools = Json::parse(kTools);
  std::mutex mu;
  std::vector<std::string> failures;
  std::atomic<int> thinking_called{0};
  // 4 kinds (required, each named function) x thinking off/on x greedy/sampled x whole/stream.
  const std::vector<Json> choices = {"required",
                                     {{"type", "function"}, {"function", {{"name", "get_weather"}}}},
                                     {{"type", "function"}, {"function", {{"name", "book_table"}}}},
                                     {{"type", "function"}, {"function", {{"name", "ping"}}}}};
  ParallelFor(32, 8, [&](int i) {
    const Json& choice = choices[i % 4];
    const bool thinking = (i / 4) % 2 == 1;
    Json body = ChatBody("What's the weather in Paris, and book a table for two", 600);
    body["tools"] = tools;
    body["tool_choice"] = choice;
    body["temperature"] = (i / 8) % 2 == 0 ? 0.0 : 1.0;
    body["seed"] = i;
    if (thinking) {
      body["chat_template_kwargs"] = {{"thinking", true}};
      EndReasoningSoon(&body);
      // Greedy, the penalized "</", "think", ">" may cycle in an order that never spells
      // "</think>": the reasoning of a thinking request is sampled.
      body["temperature"] = 1.0;
    }
    const Reply r = Chat(c.port(), body, i >= 16);
    std::string why;
    if (r.status != 200 || !r.error.empty()) {
      why = "HTTP " + std::to_string(r.status) + ": " + r.error;
    } else if (thinking && r.choices[0].finish_reason == "length" && r.choices[0].calls.empty()) {
      // The reasoning is free text: a random model may not close it within max_tokens. Then
      // nothing else may have been written.
      if (!r.choices[0].content.empty() || r.choices[0].reasoning.empty()) why = "a cut reasoning with content";
    } else {
      why = CheckCalls(r.choices[0], tools, choice.is_string() ? "" : choice["function"]["name"].get<std::string>());
      if (why.empty() && thinking) ++thinking_called;
      // The reasoning may be just "</think>" (no reasoning_content), but its tokens count.
      const int reasoning_tokens = r.usage["completion_tokens_details"]["reasoning_tokens"].get<int>();
      if (why.empty() && thinking && reasoning_tokens == 0) why = "no reasoning tokens in thinking mode";
      if (why.empty() && !thinking && (!r.choices[0].reasoning.empty() || reasoning_tokens != 0))
        why = "reasoning without thinking";
    }
    if (!why.empty()) {
      std::lock_guard<std::mutex> lock(mu);
      failures.push_back("request " + std::to_string(i) + " (" + choice.dump() + (thinking ? ", thinking" : "") +
                         "): " + why);
    }
  });
  EXPECT_TRUE(failures.empty()) << Joined(failures) << c.Logs();
  // Most thinking replies close their reasoning (the bias) and then call.
  EXPECT_GE(thinking_called.load(), 8) << "of 16 thinking requests";

  // The next turn: the call and its result go back through the template; auto leaves the
  // model free (a random model rarely calls, but whatever it writes parses).
  Json body = ChatBody("What's the weather in Paris?", 16);
  body["messages"].push_back({{"role", "assistant"},
                              {"content", nullptr},
                              {"tool_calls", Json::array({{{"id", "call_1"},
                                                           {"type", "function"},
                                                           {"function", {{"name", "get_weather"},
                                                                         {"arguments", R"({"city": "Paris"})"}}}}})}});
  body["messages"].push_back({{"role", "tool"}, {"tool_call_id", "call_1"}, {"content", "18 C and sunny"}});
  body["tools"] = tools;
  const Reply r = Chat(c.port(), body, false);
  ASSERT_EQ(r.status, 200) << r.error;
  EXPECT_EQ(r.usage["completion_tokens"].get<int>() > 0, true);
}

TEST(StructuredOutputE2eTest, ThinkingGoesToReasoningContent) {
  ApiCluster c("api-thinking", false);
  ASSERT_TRUE(c.ok());
  for (bool stream : {false, true}) {
    SCOPED_TRACE(stream ? "stream" : "whole");
    // A random model never closes its reasoning on its own: all of it is reasoning.
    Json body = ChatBody("Think first", 12);
    body["chat_template_kwargs"] = {{"thinking", true}};
    body["ignore_eos"] = true;
    Reply r = Chat(c.port(), body, stream);
    ASSERT_EQ(r.status, 200) << r.error;
    EXPECT_FALSE(r.choices[0].reasoning.empty());
    EXPECT_EQ(r.choices[0].content, "");
    EXPECT_EQ(r.choices[0].finish_reason, "length");
    EXPECT_EQ(r.usage["completion_tokens_details"]["reasoning_tokens"], 12);
    // Biased towards "</think>": the reasoning ends and the answer follows it.
    body["max_tokens"] = 200;
    EndReasoningSoon(&body);
    body["temperature"] = 1.0;
    body["seed"] = 3;
    r = Chat(c.port(), body, stream);
    ASSERT_EQ(r.status, 200) << r.error;
    EXPECT_EQ(r.choices[0].reasoning.find("</think>"), std::string::npos);
    EXPECT_FALSE(r.choices[0].content.empty()) << r.choices[0].reasoning;
    const int reasoning = r.usage["completion_tokens_details"]["reasoning_tokens"].get<int>();
    EXPECT_GT(reasoning, 0);
    EXPECT_LT(reasoning, r.usage["completion_tokens"].get<int>());
  }
}

TEST(StructuredOutputE2eTest, NChoicesWithASeedAreReproducible) {
  ApiCluster c("api-n", false);
  ASSERT_TRUE(c.ok());
  Json body = ChatBody("Three answers", 10);
  body["n"] = 3;
  body["seed"] = 1234;
  body["temperature"] = 1.0;
  body["ignore_eos"] = true;
  const Reply whole = Chat(c.port(), body, false);
  ASSERT_EQ(whole.status, 200) << whole.error;
  ASSERT_EQ(whole.choices.size(), 3u);
  std::set<std::string> distinct;
  for (const Choice& ch : whole.choices) {
    EXPECT_EQ(ch.finish_reason, "length");
    distinct.insert(ch.content);
  }
  EXPECT_GT(distinct.size(), 1u) << "choice i samples with seed + i";
  EXPECT_EQ(whole.usage["completion_tokens"], 30);
  const Reply again = Chat(c.port(), body, false);
  const Reply streamed = Chat(c.port(), body, true);
  ASSERT_EQ(streamed.status, 200) << streamed.error;
  ASSERT_EQ(streamed.choices.size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(again.choices[i].content, whole.choices[i].content) << i;
    EXPECT_EQ(streamed.choices[i].content, whole.choices[i].content) << i;
  }
  EXPECT_EQ(streamed.usage["completion_tokens"], 30);
  // n constrained: every choice validates.
  const std::vector<Json> one = Schemas(77, 3);
  body["n"] = 4;
  body["max_tokens"] = 1000;
  body.erase("ignore_eos");
  body["response_format"] = {{"type", "json_schema"}, {"json_schema", {{"schema", one[0]}}}};
  const Reply constrained = Chat(c.port(), body, true);
  ASSERT_EQ(constrained.status, 200) << constrained.error;
  ASSERT_EQ(constrained.choices.size(), 4u);
  for (const Choice& ch : constrained.choices) {
    EXPECT_EQ(ch.finish_reason, "stop");
    EXPECT_EQ(CheckDocument(ch.content, one[0]), "") << ch.content;
  }
}

TEST(StructuredOutputE2eTest, SeedAndConstraintsAgreeAcrossColocatedAndDisaggregated) {
  if (!UcxTcpUsable()) GTEST_SKIP() << "no /sys/class/net here: UCX's tcp transport has no device to use";
  ApiCluster colocated("api-seed-c", false);
  ApiCluster pd("api-seed-pd", true);
  ASSERT_TRUE(colocated.ok() && pd.ok());
  // Seeded sampling draws from (seed, token index): the same text on both.
  const std::vector<Json> schemas = Schemas(99, 24);
  for (int i = 0; i < 4; ++i) {
    SCOPED_TRACE(i);
    Json body = ChatBody("Same on both #" + std::to_string(i), 24);
    body["temperature"] = 0.8;
    body["top_p"] = 0.9;
    body["seed"] = 4242 + i;
    body["ignore_eos"] = true;
    if (i >= 2) {
      body["max_tokens"] = 1000;
      body.erase("ignore_eos");
      body["response_format"] = {{"type", "json_schema"}, {"json_schema", {{"schema", schemas[i]}}}};
    }
    const Reply a = Chat(colocated.port(), body, false);
    const Reply b = Chat(pd.port(), body, i % 2 == 1);
    ASSERT_EQ(a.status, 200) << a.error;
    ASSERT_EQ(b.status, 200) << b.error << pd.Logs();
    EXPECT_EQ(a.choices[0].content, b.choices[0].content);
    EXPECT_EQ(a.choices[0].finish_reason, b.choices[0].finish_reason);
  }
  // JSON Schemas on the disaggregated cluster: the first token comes from prefill, the grammar
  // state travels to decode with it.
  const auto failures = RunSchemas(pd.port(), schemas, 8);
  EXPECT_TRUE(failures.empty()) << failures.size() << " of " << schemas.size() << " failed:\n"
                                << Joined(failures) << pd.Logs();
}

TEST(StructuredOutputE2eTest, MalformedSchemasAndUnsupportedKeywordsAre400) {
  ApiCluster c("api-400", false);
  ASSERT_TRUE(c.ok());
  struct Case {
    Json fields;
    const char* param;
    const char* says;
  };
  const std::vector<Case> cases = {
      {{{"response_format",
         {{"type", "json_schema"},
          {"json_schema", {{"schema", {{"type", "object"}, {"properties", {{"a", {{"minProperties", 1}}}}}}}}}}}},
       "response_format", "'minProperties' at #/properties/a"},
      {{{"response_format", {{"type", "json_schema"}, {"json_schema", {{"schema", {{"oneOf", Json::array()}}}}}}}},
       "response_format", "oneOf"},
      {{{"guided_json", "{\"type\": "}}, "guided_json", "not valid JSON"},
      {{{"response_format", {{"type", "regex"}, {"regex", "(a"}}}}, "response_format", "response_format.regex"},
      {{{"tools", Json::parse(R"([{"type":"function","function":{"name":"f","parameters":
            {"type":"object","properties":{"x":{"type":"string","format":"ipv6"}}}}}])")}},
       "tools", "tools[0].function.parameters"},
      {{{"tools", Json::parse(kTools)}, {"tool_choice", {{"type", "function"}, {"function", {{"name", "nope"}}}}}},
       "tool_choice", "nope"},
  };
  for (const Case& k : cases) {
    Json body = ChatBody("x", 5);
    for (const auto& [key, value] : k.fields.items()) body[key] = value;
    SCOPED_TRACE(body.dump());
    const auto r = HttpPost(c.port(), "/v1/chat/completions", body.dump());
    ASSERT_EQ(r.status, 400) << r.body;
    const Json e = Json::parse(r.body)["error"];
    EXPECT_EQ(e["param"], k.param);
    EXPECT_NE(e["message"].get<std::string>().find(k.says), std::string::npos) << e["message"];
  }
}

// The ZeroMQ request API carries the same options: a JSON Schema, required tool calls, n.
TEST(StructuredOutputE2eTest, RequestApiCarriesTheSameOptions) {
  ApiCluster c("api-zmq", false, {"--request-endpoint", "tcp://127.0.0.1:*"});
  ASSERT_TRUE(c.ok());
  auto client = client::RequestClient::Connect(c.request_endpoint()).value();
  namespace api = services::api;
  const std::vector<Json> schemas = Schemas(5150, 6);
  for (size_t i = 0; i < schemas.size(); ++i) {
    SCOPED_TRACE(i);
    api::Submit s;
    s.kind = api::PromptKind::kChat;
    s.messages = {{"user", "JSON please", {}}};
    s.sampling.max_tokens = 1000;
    s.sampling.temperature = i % 2 == 0 ? 0.0 : 1.0;
    s.sampling.seed = static_cast<int64_t>(i);
    s.response_format = {api::ResponseFormatType::kJsonSchema, schemas[i].dump(), true};
    s.n = i == 0 ? 3 : 1;
    auto done = client->Generate(s);
    ASSERT_TRUE(done.ok()) << done.status().ToString();
    ASSERT_EQ(done->choices.size(), s.n);
    for (const auto& ch : done->choices) {
      EXPECT_EQ(ch.finish, FinishReason::kStop);
      EXPECT_EQ(CheckDocument(ch.text, schemas[i]), "") << ch.text;
    }
  }
  const Json tools = Json::parse(kTools);
  api::Submit s;
  s.kind = api::PromptKind::kChat;
  s.messages = {{"user", "Weather?", {}}};
  s.sampling.max_tokens = 600;
  s.thinking = true;
  const Json end_reasoning = EndReasoningBias();
  for (const auto& [id, bias] : end_reasoning.items()) s.logit_bias.push_back({std::stoi(id), bias.get<float>()});
  s.sampling.frequency_penalty = 2.0;
  for (const Json& t : tools) {
    const Json& f = t["function"];
    s.tools.push_back({f["name"].get<std::string>(), f.value("description", std::string()),
                       f.contains("parameters") ? f["parameters"].dump() : std::string()});
  }
  s.tool_choice = {api::ToolChoiceMode::kRequired, ""};
  // A random model may not close its reasoning within max_tokens (then it reports length and
  // nothing else): a few seeds, until one does.
  Result<client::Completion> done = Status::Internal("no attempt");
  for (int64_t seed = 1; seed <= 6; ++seed) {
    s.sampling.seed = seed;
    done = client->Generate(s);
    ASSERT_TRUE(done.ok()) << done.status().ToString();
    if (done->choices[0].finish != FinishReason::kLength) break;
    EXPECT_TRUE(done->choices[0].tool_calls.empty());
    EXPECT_EQ(done->choices[0].text, "");
  }
  const auto& ch = done->choices[0];
  EXPECT_TRUE(ch.tool_calls_finish);
  EXPECT_GT(ch.reasoning_tokens, 0u);
  Choice as_http;
  as_http.finish_reason = ch.tool_calls_finish ? "tool_calls" : FinishReasonName(ch.finish);
  for (const auto& call : ch.tool_calls) as_http.calls.push_back({call.id, call.name, call.arguments});
  EXPECT_EQ(CheckCalls(as_http, tools), "");
}

}  // namespace
}  // namespace pdserve::api_e2e
