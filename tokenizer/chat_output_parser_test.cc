// ChatOutputParser over DeepSeek-V3.1-format outputs: every case is parsed in one piece, token
// by token through the real tokenizer and StreamDetokenizer, byte by byte, and split in two at
// every byte; the deltas must always add up to the expected message, names arrive once, and
// no marker text leaks into content.
// To add a case: a row to Cases() with the model text and the message it must give.
#include "tokenizer/chat_output_parser.h"

#include <gtest/gtest.h>

#include "tokenizer/stream_detokenizer.h"
#include "tokenizer/testing_util.h"

namespace pdserve::tokenizer {
namespace {

struct Case {
  std::string name;
  ChatOutputParserOptions options;
  std::string text;
  ParsedMessage want;
};

std::vector<Case> Cases() {
  const std::string calls =
      "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{\"city\": \"Paris\"}<｜tool▁call▁end｜>"
      "<｜tool▁call▁begin｜>search<｜tool▁sep｜>{\"q\": \"a < b <｜ c\", \"n\": [1, 2]}<｜tool▁call▁end｜>"
      "<｜tool▁calls▁end｜>";
  std::vector<ParsedToolCall> two = {{"get_weather", "{\"city\": \"Paris\"}"},
                                     {"search", "{\"q\": \"a < b <｜ c\", \"n\": [1, 2]}"}};
  return {
      {"reasoning then answer", {.starts_in_reasoning = true},
       "Let me think: is <b> < </thin? No.\nOK</think>The answer is 42 </think> — 好的。",
       {"Let me think: is <b> < </thin? No.\nOK", "The answer is 42 </think> — 好的。", {}}},
      {"content then calls", {}, "Sure, checking both.\n" + calls,
       {"", "Sure, checking both.\n", two}},
      {"reasoning, calls, nothing else", {.starts_in_reasoning = true}, "need weather</think>" + calls, {"need weather", "", two}},
      {"calls then trailing text", {}, calls + "Done.", {"", "Done.", two}},
      {"marker-like content", {}, "a <｜tool▁call x <｜tool▁calls▁begin <｜User｜> < <<", {"", "a <｜tool▁call x <｜tool▁calls▁begin <｜User｜> < <<", {}}},
      {"tools off: markers are content", {.starts_in_reasoning = false, .parse_tool_calls = false}, "x" + calls,
       {"", "x" + calls, {}}},
      {"no arguments, whitespace between calls", {},
       "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>ping<｜tool▁sep｜>{}<｜tool▁call▁end｜>\n"
       "<｜tool▁call▁begin｜>ping<｜tool▁sep｜><｜tool▁call▁end｜><｜tool▁calls▁end｜>",
       {"", "", {{"ping", "{}"}, {"ping", ""}}}},
      {"cut mid-arguments (max_tokens)", {}, "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>f<｜tool▁sep｜>{\"a\": [1, 2",
       {"", "", {{"f", "{\"a\": [1, 2"}}}},
      {"cut mid-name", {}, "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_wea", {"", "", {{"get_wea", ""}}}},
      {"cut mid-reasoning", {.starts_in_reasoning = true}, "thinking about </th", {"thinking about </th", "", {}}},
      {"empty", {.starts_in_reasoning = true}, "", {"", "", {}}},
  };
}

// Adds up deltas; checks names arrive once and indexes in order.
struct Accumulator {
  ParsedMessage got;
  std::vector<bool> named;
  void Add(const ChatDelta& d) {
    got.reasoning_content += d.reasoning_content;
    got.content += d.content;
    for (const ToolCallDelta& t : d.tool_calls) {
      ASSERT_GE(t.index, 0);
      ASSERT_LE(t.index, static_cast<int32_t>(got.tool_calls.size()));
      if (t.index == static_cast<int32_t>(got.tool_calls.size())) {
        ASSERT_TRUE(t.name.has_value()) << "a call's first delta carries its name";
        got.tool_calls.push_back({*t.name, ""});
      } else {
        ASSERT_FALSE(t.name.has_value()) << "the name is sent once";
      }
      got.tool_calls[static_cast<size_t>(t.index)].arguments += t.arguments;
    }
  }
};

void ExpectEqual(const ParsedMessage& got, const ParsedMessage& want, const std::string& where) {
  EXPECT_EQ(got.reasoning_content, want.reasoning_content) << where;
  EXPECT_EQ(got.content, want.content) << where;
  ASSERT_EQ(got.tool_calls.size(), want.tool_calls.size()) << where;
  for (size_t i = 0; i < got.tool_calls.size(); ++i) {
    EXPECT_EQ(got.tool_calls[i].name, want.tool_calls[i].name) << where;
    EXPECT_EQ(got.tool_calls[i].arguments, want.tool_calls[i].arguments) << where;
  }
}

void RunPieces(const Case& c, const std::vector<std::string>& pieces, const std::string& how) {
  ChatOutputParser p(c.options);
  Accumulator acc;
  for (const std::string& piece : pieces) {
    acc.Add(p.Push(piece));
    if (::testing::Test::HasFatalFailure()) return;
  }
  acc.Add(p.Finish());
  ExpectEqual(acc.got, c.want, c.name + " / " + how);
  ExpectEqual(p.message(), c.want, c.name + " / " + how + " (message)");
}

TEST(ChatOutputParser, WholeAndByteSplits) {
  for (const Case& c : Cases()) {
    RunPieces(c, {c.text}, "whole");
    std::vector<std::string> bytes;
    for (char ch : c.text) bytes.push_back(std::string(1, ch));
    RunPieces(c, bytes, "byte by byte");
    for (size_t cut = 0; cut <= c.text.size(); ++cut)
      RunPieces(c, {c.text.substr(0, cut), c.text.substr(cut)}, "split at " + std::to_string(cut));
  }
}

TEST(ChatOutputParser, TokenByTokenThroughTheDetokenizer) {
  PDSERVE_DEEPSEEK_OR_FAIL(tok);
  for (const Case& c : Cases()) {
    const std::vector<int32_t> ids = tok->Encode(c.text).value();
    StreamDetokenizer stream(*tok, {});
    std::vector<std::string> pieces;
    for (int32_t id : ids) pieces.push_back(stream.Push(id).value());
    pieces.push_back(stream.Finish());
    RunPieces(c, pieces, "tokens");
  }
  // The markers are single tokens of the vocabulary.
  EXPECT_EQ(tok->Encode("<｜tool▁sep｜>").value().size(), 1u);
}

TEST(ChatOutputParser, ReasoningStateForTokenCounts) {
  ChatOutputParser p({.starts_in_reasoning = true});
  EXPECT_TRUE(p.in_reasoning());
  (void)p.Push("abc</th");
  EXPECT_TRUE(p.in_reasoning());
  (void)p.Push("ink>x");
  EXPECT_FALSE(p.in_reasoning());
}

}  // namespace
}  // namespace pdserve::tokenizer
