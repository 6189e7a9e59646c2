// Request API codec: every message round-trips; hostile bytes give a Status, never a crash.
#include "services/request_api/request_api_codec.h"

#include <random>

#include <capnp/message.h>
#include <capnp/serialize.h>
#include <gtest/gtest.h>

#include "proto/request_api.capnp.h"

namespace pdserve::services::api {
namespace {

std::vector<Message> Samples() {
  Submit ids;
  ids.request_id = 7;
  ids.model = "pdserve";
  ids.prompt_ids = {1, 2, 3, -1};
  ids.sampling.max_tokens = 0;  // carried as given: validation is the router's
  ids.sampling.temperature = 0.25;
  ids.sampling.seed = -3;
  ids.stop = {"a", "bc"};
  ids.stop_token_ids = {9};
  ids.logprobs = true;
  ids.top_logprobs = 2;
  ids.skip_special_tokens = false;
  Submit text;
  text.kind = PromptKind::kText;
  text.prompt_text = "hello \xe4\xb8\x96";
  text.user = "u";
  text.api_key = "sk-test-\x01key";  // carried byte for byte: checking it is the router's
  Submit chat;
  chat.kind = PromptKind::kChat;
  chat.messages = {{"system", "be brief", {}}, {"assistant", std::nullopt, {{"f", "{\"x\":1}"}}}, {"user", "", {}}};
  chat.thinking = false;
  chat.sampling.top_k = -1;
  chat.sampling.top_p = 0.5;
  chat.sampling.min_p = 0.1;
  chat.sampling.presence_penalty = -2;
  chat.sampling.frequency_penalty = 2;
  chat.sampling.repetition_penalty = 1.1;
  Output out;
  out.request_id = 5;
  out.tokens = {4, 5};
  out.text = "xy";
  out.logprobs = {{-0.5f, {{4, -0.5f}, {6, -1.5f}}}, {-1.0f, {}}};
  out.finish = FinishReason::kLength;
  out.prompt_tokens = 3;
  out.completion_tokens = 2;
  // The structured-output fields: a constrained chat with tools and n choices, and a chat
  // choice's reasoning and tool-call deltas ending with tool_calls.
  Submit tools = chat;
  tools.n = 3;
  tools.logit_bias = {{5, -100.0f}, {7, 2.5f}};
  tools.tools = {{"get_weather", "the weather", R"({"type":"object","properties":{"city":{"type":"string"}}})"},
                 {"noop", "", ""}};
  tools.tool_choice = {ToolChoiceMode::kFunction, "get_weather"};
  Submit schema = ids;
  schema.response_format = {ResponseFormatType::kJsonSchema, R"({"type":"object","properties":{"b":{},"a":{}}})", false};
  Output calls;
  calls.request_id = 5;
  calls.index = 2;
  calls.tokens = {9};
  calls.text = "ok";
  calls.reasoning_text = "hmm";
  calls.tool_calls = {{0, "call_1", "get_weather", "{\"city\""}, {1, "", "", "}"}};
  calls.finish = FinishReason::kStop;
  calls.tool_calls_finish = true;
  calls.reasoning_tokens = 4;
  return {ids, text, chat, tools, schema, Abort{7, "bye"}, Ping{99}, Accepted{7, "cmpl-1", 4, 16}, out, calls,
          Error{7, 404, "invalid_request_error", "model_not_found", "", "no such model"}, Pong{99}, Keepalive{}};
}

TEST(RequestApiCodecTest, EveryMessageRoundTrips) {
  for (const Message& m : Samples()) {
    SCOPED_TRACE(MessageName(m));
    auto bytes = EncodeMessage(m);
    ASSERT_TRUE(bytes.ok()) << bytes.status().ToString();
    auto back = DecodeMessage(bytes.value());
    ASSERT_TRUE(back.ok()) << back.status().ToString();
    EXPECT_TRUE(back.value() == m);
  }
}

TEST(RequestApiCodecTest, HostileBytesGiveErrors) {
  EXPECT_EQ(DecodeMessage("").status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(DecodeMessage("abc").status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(DecodeMessage(std::string(64, '\0')).status().code(), StatusCode::kInvalidArgument);  // version 0
  // Truncations and bit flips of real messages, and random bytes: never a crash.
  std::mt19937 rng(1);
  for (const Message& m : Samples()) {
    const std::string bytes = EncodeMessage(m).value();
    for (size_t cut = 8; cut < bytes.size(); cut += 8) (void)DecodeMessage(bytes.substr(0, cut));
    for (int i = 0; i < 200; ++i) {
      std::string b = bytes;
      b[rng() % b.size()] ^= static_cast<char>(1 << (rng() % 8));
      (void)DecodeMessage(b);
    }
  }
  for (int i = 0; i < 200; ++i) {
    std::string b((rng() % 32 + 1) * 8, '\0');
    for (auto& c : b) c = static_cast<char>(rng());
    (void)DecodeMessage(b);
  }
  // A wrong protocol version is named.
  capnp::MallocMessageBuilder builder;
  auto root = builder.initRoot<proto::request_api::RequestApiMessage>();
  root.setProtocolVersion(2);
  root.setPing(1);
  auto words = capnp::messageToFlatArray(builder);
  auto bytes = words.asBytes();
  auto r = DecodeMessage(std::string(reinterpret_cast<const char*>(bytes.begin()), bytes.size()));
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("protocol version 2"), std::string::npos) << r.status().ToString();
}

TEST(RequestApiCodecTest, ApiKeyIsOptionalOnTheWireAndBounded) {
  // A submit from a client built before the field existed (apiKey never set) decodes with an
  // empty key: the router then answers 401 when it requires keys, never a decode error.
  capnp::MallocMessageBuilder builder;
  auto root = builder.initRoot<proto::request_api::RequestApiMessage>();
  root.setProtocolVersion(kRequestApiProtocolVersion);
  auto submit = root.initSubmit();
  submit.setRequestId(3);
  submit.setModel("pdserve");
  submit.getPrompt().setText("hi");
  auto words = capnp::messageToFlatArray(builder);
  auto bytes = words.asBytes();
  auto old = DecodeMessage(std::string(reinterpret_cast<const char*>(bytes.begin()), bytes.size()));
  ASSERT_TRUE(old.ok()) << old.status().ToString();
  ASSERT_TRUE(std::holds_alternative<Submit>(old.value()));
  EXPECT_EQ(std::get<Submit>(old.value()).api_key, "");
  EXPECT_EQ(std::get<Submit>(old.value()).request_id, 3u);
  // ... as are the structured-output fields: one choice, free text, no tools.
  EXPECT_EQ(std::get<Submit>(old.value()).n, 1u);
  EXPECT_EQ(std::get<Submit>(old.value()).response_format, ResponseFormat{});
  EXPECT_EQ(std::get<Submit>(old.value()).tool_choice.mode, ToolChoiceMode::kAuto);

  // A key set survives the trip; an absurdly long one is refused by name.
  Submit s;
  s.api_key = "sk-one";
  auto back = DecodeMessage(EncodeMessage(s).value());
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(std::get<Submit>(back.value()).api_key, "sk-one");
  s.api_key.assign(size_t{1} << 20, 'k');
  auto big = DecodeMessage(EncodeMessage(s).value());
  ASSERT_FALSE(big.ok());
  EXPECT_NE(big.status().message().find("submit.apiKey"), std::string::npos) << big.status().ToString();
}

TEST(RequestApiCodecTest, LimitsAreEnforcedOnEncode) {
  Submit s;
  s.stop.assign(Limits::kMaxListItems + 1, "x");
  EXPECT_EQ(EncodeMessage(s).status().code(), StatusCode::kInvalidArgument);
  Output o;
  o.tokens = {1, 2};
  o.logprobs.resize(1);
  EXPECT_EQ(EncodeMessage(o).status().code(), StatusCode::kInvalidArgument);
  Output calls;
  calls.finish = FinishReason::kLength;
  calls.tool_calls_finish = true;  // only a stop can be a tool-calls finish
  EXPECT_EQ(EncodeMessage(calls).status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace pdserve::services::api
