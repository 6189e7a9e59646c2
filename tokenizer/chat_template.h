// ChatTemplate: renders a conversation into the prompt text DeepSeek-V3 / V3.2 expect.
//
// With `thinking` unset the output is exactly what the DeepSeek-V3 tokenizer_config.json Jinja
// template renders (checked against a JS Jinja engine by tests/tokenizer): the system prompts
// joined by blank lines after BOS, <｜User｜>/<｜Assistant｜> turns closed by
// <｜end▁of▁sentence｜>, tool calls and tool outputs in DeepSeek's markers, and <｜Assistant｜>
// appended when add_generation_prompt is set (unless the last turn is a tool output). The
// template's quirks are kept on purpose (e.g. "is_first" is never reset, so only the first
// tool-call block in a conversation opens with <｜tool▁calls▁begin｜>).
//
// With `thinking` set, DeepSeek-V3.2's thinking / non-thinking prompts are produced:
//   - the generation prompt is <｜Assistant｜><think> (true) or <｜Assistant｜></think> (false);
//   - every earlier assistant turn drops its reasoning: it is rendered as
//     <｜Assistant｜></think>ANSWER<｜end▁of▁sentence｜>, where ANSWER is the content after its
//     last "</think>" (tool-call turns likewise get </think> after <｜Assistant｜>).
// For plain system/user/assistant conversations this matches V3.2's own encoder.
//
// ChatFormat::kDeepSeekV31 renders DeepSeek-V3.1's template, which DeepSeek-V3.2-Exp ships too:
//   - BOS, the system prompts joined by blank lines, then (with tools, unless tool_choice is
//     none) a blank line and the tools block (tools.h);
//   - <｜User｜>TEXT; the first assistant turn after a user turn opens with <｜Assistant｜></think>;
//     earlier answers keep only the text after their first </think>;
//   - tool calls: CONTENT<｜tool▁calls▁begin｜> then <｜tool▁call▁begin｜>NAME<｜tool▁sep｜>ARGS
//     <｜tool▁call▁end｜> per call, then <｜tool▁calls▁end｜><｜end▁of▁sentence｜>;
//   - tool results: <｜tool▁output▁begin｜>RESULT<｜tool▁output▁end｜> each; the assistant's
//     answer follows them directly (no <｜Assistant｜>), as does generation (no prompt is added
//     after a tool result);
//   - the generation prompt after a user turn: <｜Assistant｜><think> in thinking mode,
//     <｜Assistant｜></think> otherwise (thinking unset means off).
//
// The template itself is built in (pdserve does not run Jinja). FromConfig() accepts a
// tokenizer_config.json whose chat_template is the known DeepSeek-V3 one or absent (V3.2 ships
// none) and refuses any other, so a different model's template is never silently replaced.
//
// Thread-safety: immutable; Render() may be called from any thread.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "tokenizer/tokenizer_config.h"
#include "tokenizer/tools.h"

namespace pdserve::tokenizer {

struct ToolCall {
  std::string type = "function";
  std::string name;
  std::string arguments;  // the JSON text, as OpenAI sends it
};

struct ChatMessage {
  std::string role;                    // system | user | assistant | tool (others are ignored)
  std::optional<std::string> content;  // nullopt: JSON null / absent
  std::vector<ToolCall> tool_calls;
};

enum class ChatFormat : uint8_t {
  kDeepSeekV3,   // the tokenizer package's template (+ V3.2 thinking when `thinking` is set)
  kDeepSeekV31,  // DeepSeek-V3.1 / V3.2-Exp: tools, V3.1 tool-call markers, thinking switch
};

struct ChatTemplateOptions {
  bool add_generation_prompt = false;
  std::optional<bool> thinking;  // kDeepSeekV3: unset gives the package template's output exactly
  ChatFormat format = ChatFormat::kDeepSeekV3;
  std::vector<ToolFunction> tools;  // kDeepSeekV31 only
  ToolChoice tool_choice;
};

class ChatTemplate {
 public:
  // Errors: FailedPrecondition when config.chat_template is present but is not the DeepSeek-V3
  // template (its fingerprint is in the message).
  static Result<ChatTemplate> FromConfig(const TokenizerConfig& config);
  // A template with the given BOS text, skipping the config check (for tests and tools).
  explicit ChatTemplate(std::string bos_token) : bos_token_(std::move(bos_token)) {}

  // Errors: InvalidArgument when a message lacks what its role needs (system/user/tool content,
  // assistant content or tool_calls), for tools with the kDeepSeekV3 format, or for tool
  // parameters that are not JSON.
  Result<std::string> Render(const std::vector<ChatMessage>& messages,
                             const ChatTemplateOptions& options) const;

  // FNV-1a 64 of a template's text, used to recognise the DeepSeek-V3 template.
  static uint64_t Fingerprint(std::string_view template_text);
  const std::string& bos_token() const { return bos_token_; }

  // Whether a prompt leaves the model inside its reasoning (it ends with <think>): the output
  // parser then starts in reasoning_content (chat_output_parser.h).
  static bool OpensReasoning(std::string_view prompt);

 private:
  Result<std::string> RenderV3(const std::vector<ChatMessage>& messages, const ChatTemplateOptions& options) const;
  Result<std::string> RenderV31(const std::vector<ChatMessage>& messages, const ChatTemplateOptions& options) const;

  std::string bos_token_;
};

}  // namespace pdserve::tokenizer
