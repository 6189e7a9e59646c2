// The router's use of the chat output parser: a GenerationSession fed token events the way a
// worker sends them, the model's V3.1 markers split at every token boundary into two events and
// token by token, and the OpenAI chunks and message the ResponseBuilder makes of the steps.
// (ChatOutputParser's own splits are tested in tokenizer/; this checks what the router adds:
// detokenization and stop strings before the parser, call ids, reasoning-token counts, finish
// reasons, and the JSON shapes.) To add a case: a model text and what the client must see.
#include <gtest/gtest.h>
#include <prometheus/registry.h>

#include "services/router/generation_session.h"
#include "services/router/openai_response.h"
#include "tokenizer/tokenizer_paths.h"

namespace pdserve::router {
namespace {

using nlohmann::json;

const tokenizer::Tokenizer& Tok() {
  static const auto* tok = tokenizer::Tokenizer::Load(tokenizer::DefaultTokenizerDir()).value().release();
  return *tok;
}

const std::string kReply =
    "Let me check the weather.</think>Sure.<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>"
    "{\"city\": \"Paris\", \"unit\": \"c\"}<｜tool▁call▁end｜><｜tool▁call▁begin｜>noop<｜tool▁sep｜>{}"
    "<｜tool▁call▁end｜><｜tool▁calls▁end｜>";

std::vector<int32_t> Encode(const std::string& text) { return Tok().Encode(text, {false, true}).value(); }

// What the client saw: the steps' deltas joined, with checks on the stream's invariants.
struct Seen {
  tokenizer::ChatDelta all;
  std::vector<int> name_deltas;  // per call: deltas that carried its name (must be 1)
  std::string finish_reason;
  Status error;
  uint32_t reasoning_tokens = 0;
  uint32_t completion_tokens = 0;
  std::vector<std::string> ids;
  std::vector<json> chunks;  // the ResponseBuilder's chunks
  json full;                 // and its whole reply
};

class ChatStreamTest : public ::testing::Test {
 protected:
  // Feeds `events` (token lists; the last one finishes with `finish`) to a session and collects
  // what it gives out. `stop`: stop strings. The stop token (EOS) is appended when `finish` is
  // kStop, as a worker sends it.
  Seen Run(const std::vector<std::vector<int32_t>>& events, FinishReason finish, bool starts_in_reasoning = true,
           std::vector<std::string> stop = {}, uint32_t max_tokens = 1000) {
    auto req = std::make_shared<ActiveRequest>(1, "req", 10, max_tokens, std::chrono::steady_clock::now());
    GenerationSession::Options o;
    o.stop_strings = std::move(stop);
    o.stop_token_ids = {*Tok().eos_id()};
    o.chat = tokenizer::ChatOutputParserOptions{starts_in_reasoning, true};
    GenerationSession session(core_.get(), req, Tok(), o, &metrics_);
    for (size_t i = 0; i < events.size(); ++i) {
      RequestEvent ev;
      ev.tokens = events[i];
      if (i + 1 == events.size()) {
        ev.finish = finish;
        if (finish == FinishReason::kStop) ev.tokens.push_back(*Tok().eos_id());
      }
      req->Push(std::move(ev));
    }
    Seen seen;
    ResponseBuilder builder(ApiEndpoint::kChat, "chatcmpl-1", "m", true, false, Tok());
    SessionStep all;
    while (!session.finished()) {
      auto step = session.Next(std::chrono::steady_clock::now());
      if (!step) continue;
      for (const auto& d : step->chat.tool_calls) {
        if (seen.name_deltas.size() <= static_cast<size_t>(d.index)) seen.name_deltas.resize(d.index + 1);
        if (d.name) ++seen.name_deltas[d.index];
      }
      if (builder.HasOutput(*step)) seen.chunks.push_back(builder.Chunk(0, *step, session.tool_call_ids(), std::nullopt));
      if (step->finished) seen.chunks.push_back(builder.Chunk(0, SessionStep{}, {}, step->finish_reason));
      AppendStep(&all, SessionStep(*step));
      AppendChatDelta(&seen.all, std::move(step->chat));
      seen.finish_reason = step->finish_reason;
      seen.error = step->error;
    }
    seen.reasoning_tokens = session.reasoning_tokens();
    seen.completion_tokens = session.completion_tokens();
    seen.ids = session.tool_call_ids();
    ChoiceOutput out;
    out.text = all.text;
    out.finish_reason = all.finish_reason;
    out.message = session.message();
    out.tool_call_ids = session.tool_call_ids();
    seen.full = builder.Full({out}, {10, session.completion_tokens(), session.reasoning_tokens()});
    return seen;
  }

  // Tokens before the one whose text completes "</think>", plus that one: the reasoning tokens.
  static uint32_t ReasoningTokens(const std::vector<int32_t>& tokens) {
    uint32_t n = 0;
    for (size_t i = 0; i < tokens.size(); ++i) {
      const std::vector<int32_t> head(tokens.begin(), tokens.begin() + static_cast<std::ptrdiff_t>(i));
      if (Tok().Decode(head, {true}).value().find("</think>") != std::string::npos) break;
      ++n;
    }
    return n;
  }

  void ExpectWholeReply(const Seen& s, const std::vector<int32_t>& tokens) {
    EXPECT_TRUE(s.error.ok()) << s.error.ToString();
    EXPECT_EQ(s.all.reasoning_content, "Let me check the weather.");
    EXPECT_EQ(s.all.content, "Sure.");
    ASSERT_EQ(s.all.tool_calls.size(), 2u);
    EXPECT_EQ(s.all.tool_calls[0].index, 0);
    EXPECT_EQ(*s.all.tool_calls[0].name, "get_weather");
    EXPECT_EQ(s.all.tool_calls[0].arguments, R"({"city": "Paris", "unit": "c"})");
    EXPECT_EQ(s.all.tool_calls[1].index, 1);
    EXPECT_EQ(*s.all.tool_calls[1].name, "noop");
    EXPECT_EQ(s.all.tool_calls[1].arguments, "{}");
    EXPECT_EQ(s.name_deltas, (std::vector<int>{1, 1}));
    EXPECT_EQ(s.finish_reason, "tool_calls");
    EXPECT_EQ(s.reasoning_tokens, ReasoningTokens(tokens));
    EXPECT_EQ(s.completion_tokens, tokens.size() + 1);  // the hidden EOS counts
    ASSERT_EQ(s.ids.size(), 2u);
    EXPECT_EQ(s.ids[0].rfind("call_", 0), 0u);
    EXPECT_NE(s.ids[0], s.ids[1]);

    // The chunks: each call's first piece has its id, type and name; joined arguments parse.
    std::vector<std::string> args(2);
    std::string reasoning, content;
    int firsts = 0;
    for (const json& c : s.chunks) {
      const json& d = c["choices"][0]["delta"];
      if (d.contains("reasoning_content")) reasoning += d["reasoning_content"].get<std::string>();
      if (d.contains("content")) content += d["content"].get<std::string>();
      if (!d.contains("tool_calls")) continue;
      for (const json& t : d["tool_calls"]) {
        const int i = t["index"].get<int>();
        if (t.contains("id")) {
          ++firsts;
          EXPECT_EQ(t["id"], s.ids[i]);
          EXPECT_EQ(t["type"], "function");
          EXPECT_TRUE(t["function"]["name"].is_string());
        }
        args[i] += t["function"]["arguments"].get<std::string>();
      }
    }
    EXPECT_EQ(firsts, 2);
    EXPECT_EQ(reasoning, "Let me check the weather.");
    EXPECT_EQ(content, "Sure.");
    EXPECT_EQ(json::parse(args[0]), json({{"city", "Paris"}, {"unit", "c"}}));
    EXPECT_EQ(s.chunks.back()["choices"][0]["finish_reason"], "tool_calls");

    // The whole reply's message and usage.
    const json& m = s.full["choices"][0]["message"];
    EXPECT_EQ(m["content"], "Sure.");
    EXPECT_EQ(m["reasoning_content"], "Let me check the weather.");
    ASSERT_EQ(m["tool_calls"].size(), 2u);
    EXPECT_EQ(m["tool_calls"][0]["id"], s.ids[0]);
    EXPECT_EQ(m["tool_calls"][0]["function"]["name"], "get_weather");
    EXPECT_EQ(m["tool_calls"][1]["function"]["arguments"], "{}");
    EXPECT_EQ(s.full["choices"][0]["finish_reason"], "tool_calls");
    EXPECT_EQ(s.full["usage"]["completion_tokens_details"]["reasoning_tokens"], s.reasoning_tokens);
  }

  RouterMetrics metrics_{std::make_shared<prometheus::Registry>()};
  std::unique_ptr<RouterCore> core_ =
      RouterCore::CreateDetached({}, &metrics_, [](const std::string&, const services::ControlMessage&) {});
};

TEST_F(ChatStreamTest, ReasoningContentAndCallsSplitAtEveryTokenBoundary) {
  const std::vector<int32_t> tokens = Encode(kReply);
  ASSERT_GT(tokens.size(), 20u);
  for (size_t k = 0; k <= tokens.size(); ++k) {
    SCOPED_TRACE("split at token " + std::to_string(k));
    const std::vector<int32_t> a(tokens.begin(), tokens.begin() + static_cast<std::ptrdiff_t>(k));
    const std::vector<int32_t> b(tokens.begin() + static_cast<std::ptrdiff_t>(k), tokens.end());
    ExpectWholeReply(Run({a, b}, FinishReason::kStop), tokens);
  }
  std::vector<std::vector<int32_t>> one_by_one;
  for (int32_t t : tokens) one_by_one.push_back({t});
  ExpectWholeReply(Run(one_by_one, FinishReason::kStop), tokens);
}

TEST_F(ChatStreamTest, MaxTokensCutsACallAndReportsLength) {
  const std::vector<int32_t> tokens = Encode(kReply);
  // Cut inside the first call's arguments, after `{"city`.
  size_t cut = 0;
  std::string head;
  while (head.find("{\"city") == std::string::npos) {
    ++cut;
    head = Tok().Decode(std::vector<int32_t>(tokens.begin(), tokens.begin() + static_cast<std::ptrdiff_t>(cut)), {true})
               .value();
  }
  const std::string args = head.substr(head.find("<｜tool▁sep｜>") + std::string("<｜tool▁sep｜>").size());
  std::vector<std::vector<int32_t>> events;
  for (size_t i = 0; i < cut; ++i) events.push_back({tokens[i]});
  Seen s = Run(events, FinishReason::kLength);
  EXPECT_EQ(s.finish_reason, "length");  // a truncated call is not a tool_calls finish
  ASSERT_EQ(s.all.tool_calls.size(), 1u);
  EXPECT_EQ(*s.all.tool_calls[0].name, "get_weather");
  EXPECT_EQ(s.all.tool_calls[0].arguments, args);
  EXPECT_EQ(s.full["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(s.full["choices"][0]["message"]["content"], "Sure.");
}

TEST_F(ChatStreamTest, PlainContentAndStopStringsBeforeTheParser) {
  // Not in reasoning, no calls: everything is content; a stop string ends it before the parser
  // sees the rest (the markers after it never reach the client).
  const std::vector<int32_t> tokens = Encode("Sure. Calling now<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>noop");
  std::vector<std::vector<int32_t>> events;
  for (int32_t t : tokens) events.push_back({t});
  Seen s = Run(events, FinishReason::kNone, false, {"now"});
  EXPECT_EQ(s.all.content, "Sure. Calling ");
  EXPECT_TRUE(s.all.tool_calls.empty());
  EXPECT_TRUE(s.all.reasoning_content.empty());
  EXPECT_EQ(s.finish_reason, "stop");
  EXPECT_EQ(s.reasoning_tokens, 0u);
  const json& m = s.full["choices"][0]["message"];
  EXPECT_EQ(m["content"], "Sure. Calling ");
  EXPECT_FALSE(m.contains("tool_calls"));
  EXPECT_FALSE(m.contains("reasoning_content"));
}

TEST_F(ChatStreamTest, OnlyCallsGiveNullContentAndChunkShapes) {
  const std::vector<int32_t> tokens =
      Encode("<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>noop<｜tool▁sep｜>{}<｜tool▁call▁end｜><｜tool▁calls▁end｜>");
  Seen s = Run({tokens}, FinishReason::kStop, false);
  EXPECT_EQ(s.finish_reason, "tool_calls");
  EXPECT_TRUE(s.full["choices"][0]["message"]["content"].is_null());
  ASSERT_GE(s.chunks.size(), 2u);
  const json& first = s.chunks[0]["choices"][0]["delta"];
  EXPECT_FALSE(first.contains("content"));
  EXPECT_EQ(first["tool_calls"][0]["id"], s.ids[0]);
  EXPECT_EQ(first["tool_calls"][0]["function"]["name"], "noop");
  EXPECT_TRUE(s.chunks[0]["usage"].is_null());  // include_usage: every chunk has usage null
  EXPECT_EQ(s.chunks.back()["choices"][0]["delta"], json::object());
}

TEST(ResponseBuilderTest, ChoicesUsageAndRoleChunks) {
  ResponseBuilder b(ApiEndpoint::kCompletions, "cmpl-1", "m", false, false, Tok(), 3);
  std::vector<ChoiceOutput> outs(3);
  for (int i = 0; i < 3; ++i) {
    outs[i].text = "t" + std::to_string(i);
    outs[i].finish_reason = i == 2 ? "stop" : "length";
  }
  json full = b.Full(outs, {5, 9, std::nullopt, 3});
  ASSERT_EQ(full["choices"].size(), 3u);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(full["choices"][i]["index"], i);
    EXPECT_EQ(full["choices"][i]["text"], "t" + std::to_string(i));
  }
  EXPECT_EQ(full["usage"], json({{"prompt_tokens", 5},
                                 {"completion_tokens", 9},
                                 {"total_tokens", 14},
                                 {"prompt_tokens_details", {{"cached_tokens", 3}}}}));
  ResponseBuilder chat(ApiEndpoint::kChat, "chatcmpl-1", "m", true, false, Tok(), 2);
  EXPECT_EQ(chat.RoleChunk(1)["choices"][0]["index"], 1);
  EXPECT_EQ(chat.UsageChunk({5, 9, 4})["usage"]["completion_tokens_details"]["reasoning_tokens"], 4);
}

// return_token_ids: streamed token by token (text held back at markers, a hidden EOS), the
// chunks' token_ids joined are every generated id, the EOS too, and so is the whole reply's.
TEST(ResponseBuilderTest, TokenIdsCoverEveryGeneratedIdInStreamsAndWholeReplies) {
  RouterMetrics metrics(std::make_shared<prometheus::Registry>());
  auto core = RouterCore::CreateDetached({}, &metrics, [](const std::string&, const services::ControlMessage&) {});
  const std::vector<int32_t> tokens = Encode(kReply);
  const std::vector<int32_t> prompt = {11, 22, 33};
  for (const ApiEndpoint endpoint : {ApiEndpoint::kChat, ApiEndpoint::kCompletions}) {
    const bool chat = endpoint == ApiEndpoint::kChat;
    auto req = std::make_shared<ActiveRequest>(1, "req", 3, 1000, std::chrono::steady_clock::now());
    GenerationSession::Options o;
    o.stop_token_ids = {*Tok().eos_id()};
    if (chat) o.chat = tokenizer::ChatOutputParserOptions{true, true};
    GenerationSession session(core.get(), req, Tok(), o, &metrics);
    for (size_t i = 0; i < tokens.size(); ++i) {
      RequestEvent ev;
      ev.tokens = {tokens[i]};
      if (i + 1 == tokens.size()) {
        ev.finish = FinishReason::kStop;
        ev.tokens.push_back(*Tok().eos_id());
      }
      req->Push(std::move(ev));
    }
    ResponseBuilder b(endpoint, "x-1", "m", false, false, Tok());
    b.ReturnTokenIds(prompt);
    std::vector<json> chunks;
    if (chat) chunks.push_back(b.RoleChunk(0));
    SessionStep all;
    while (!session.finished()) {
      auto step = session.Next(std::chrono::steady_clock::now());
      if (!step) continue;
      if (b.HasOutput(*step)) chunks.push_back(b.Chunk(0, *step, session.tool_call_ids(), std::nullopt));
      if (step->finished) chunks.push_back(b.Chunk(0, SessionStep{}, {}, step->finish_reason));
      AppendStep(&all, std::move(*step));
    }
    std::vector<int32_t> expected = tokens;
    expected.push_back(*Tok().eos_id());
    std::vector<int32_t> streamed;
    int prompt_ids_seen = 0;
    for (const json& c : chunks) {
      ASSERT_TRUE(c["choices"][0].contains("token_ids")) << c.dump();
      for (const json& t : c["choices"][0]["token_ids"]) streamed.push_back(t.get<int32_t>());
      const json& holder = chat ? c : c["choices"][0];
      if (holder.contains("prompt_token_ids")) {
        ++prompt_ids_seen;
        EXPECT_EQ(holder["prompt_token_ids"].get<std::vector<int32_t>>(), prompt);
      }
    }
    EXPECT_EQ(streamed, expected) << (chat ? "chat" : "completions");
    EXPECT_EQ(prompt_ids_seen, 1);
    ChoiceOutput out;
    out.text = all.text;
    out.finish_reason = all.finish_reason;
    out.message = session.message();
    out.token_ids = all.token_ids;
    const json full = b.Full({out}, {3, session.completion_tokens(), std::nullopt});
    EXPECT_EQ(full["choices"][0]["token_ids"].get<std::vector<int32_t>>(), expected);
    EXPECT_EQ((chat ? full : full["choices"][0])["prompt_token_ids"].get<std::vector<int32_t>>(), prompt);
  }
}

}  // namespace
}  // namespace pdserve::router
