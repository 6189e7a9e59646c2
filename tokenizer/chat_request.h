// ChatRequest: the JSON form of a chat-template request, as the CLI and the router receive it:
//   {"messages": [{"role": "user", "content": "Hi"}, ...],
//    "add_generation_prompt": true, "thinking": false,
//    "format": "deepseek_v31", "tools": [...], "tool_choice": "auto"}
// Message fields: role (string), content (string, null, or OpenAI text parts
// [{"type": "text", "text": ...}] which are concatenated), tool_calls
// ([{"type": "function", "function": {"name": ..., "arguments": "<json text>"}}]).
// "thinking" may be true, false, null or absent. "format" is "deepseek_v3" (the default) or
// "deepseek_v31"; "tools" / "tool_choice" are OpenAI's (tools.h) and need deepseek_v31.
// Unknown keys are ignored. ParseChatRequest keeps the text's key order (tool parameters).
//
// Thread-safety: pure functions.
#pragma once

#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "common/status.h"
#include "tokenizer/chat_template.h"

namespace pdserve::tokenizer {

struct ChatRequest {
  std::vector<ChatMessage> messages;
  ChatTemplateOptions options;
};

// Errors: InvalidArgument naming the offending field (e.g. "messages[2].content").
Result<ChatRequest> ParseChatRequest(std::string_view json_text);
Result<ChatRequest> ParseChatRequestJson(const nlohmann::json& request);
Result<ChatRequest> ParseChatRequestJson(const nlohmann::ordered_json& request);
Result<std::vector<ChatMessage>> ParseChatMessages(const nlohmann::json& messages);
Result<std::vector<ChatMessage>> ParseChatMessages(const nlohmann::ordered_json& messages);

}  // namespace pdserve::tokenizer
