// ChatOutputParser: splits DeepSeek-V3.1 / V3.2-Exp model output, as it streams, into the
// OpenAI message fields: reasoning_content, content and tool_calls.
//
//   [reasoning]</think> content <｜tool▁calls▁begin｜>
//       <｜tool▁call▁begin｜>NAME<｜tool▁sep｜>ARGUMENTS<｜tool▁call▁end｜> ...
//   <｜tool▁calls▁end｜>
//
// The output starts in reasoning when the prompt ended with <think> (thinking mode,
// ChatTemplate::OpensReasoning); reasoning ends at the first </think>. With parse_tool_calls
// off (no tools, tool_choice none) tool markers are ordinary content. Text between calls is
// dropped; text after <｜tool▁calls▁end｜> is content again.
//
// Streaming: Push(text) returns what the new text adds, as the peers stream it: reasoning and
// content pieces, and per tool call a first delta carrying its index and name (once the name is
// complete) followed by argument pieces as they arrive. Text that may be the start of a marker
// is held back until the next Push shows what it is; Finish() flushes it. Concatenating every
// delta gives exactly the one-shot parse (message()), however the text was split.
// Feed it detokenized text (tokenizer/stream_detokenizer.h): markers are matched as text.
//
// Thread-safety: not thread-safe; one parser per generated sequence.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace pdserve::tokenizer {

struct ToolCallDelta {
  int32_t index = 0;                // the call's position in the message, from 0
  std::optional<std::string> name;  // set on the call's first delta only
  std::string arguments;            // the next piece of the arguments' JSON text
};

struct ChatDelta {
  std::string reasoning_content;
  std::string content;
  std::vector<ToolCallDelta> tool_calls;
  bool empty() const { return reasoning_content.empty() && content.empty() && tool_calls.empty(); }
};

struct ParsedToolCall {
  std::string name;
  std::string arguments;
};

struct ParsedMessage {
  std::string reasoning_content;
  std::string content;
  std::vector<ParsedToolCall> tool_calls;
};

struct ChatOutputParserOptions {
  bool starts_in_reasoning = false;
  bool parse_tool_calls = true;
};

class ChatOutputParser {
 public:
  explicit ChatOutputParser(const ChatOutputParserOptions& options);

  ChatDelta Push(std::string_view text);
  // End of output: held-back text goes where the state says (an unterminated call keeps the
  // name and arguments that arrived, e.g. when max_tokens cut it).
  ChatDelta Finish();

  const ParsedMessage& message() const { return message_; }
  // Whether the next text would be reasoning: count a token as a reasoning token when this is
  // true before its text is pushed.
  bool in_reasoning() const { return state_ == State::kReasoning; }

 private:
  enum class State : uint8_t { kReasoning, kContent, kCalls, kName, kArguments, kAfterCalls };

  // Emits `text` as the current state's output into *delta.
  void Emit(std::string_view text, ChatDelta* delta);
  void EmitArguments(std::string_view text, ChatDelta* delta);
  // The markers that end the current state (empty: none).
  std::vector<std::string_view> Markers() const;
  // Consumes `marker` (found) and moves to the next state.
  void Transition(std::string_view marker, ChatDelta* delta);

  ChatOutputParserOptions options_;
  State state_;
  std::string pending_;  // text not yet emitted (a possible marker prefix)
  std::string name_;     // the call name being read
  bool name_sent_ = false;
  ParsedMessage message_;
};

}  // namespace pdserve::tokenizer
