#include "tokenizer/chat_request.h"

#include <nlohmann/json.hpp>

namespace pdserve::tokenizer {

namespace {
using nlohmann::json;

Result<std::optional<std::string>> ParseContent(const json& m, const std::string& where) {
  auto it = m.find("content");
  if (it == m.end() || it->is_null()) return std::optional<std::string>();
  if (it->is_string()) return std::optional<std::string>(it->get<std::string>());
  if (it->is_array()) {
    std::string text;
    for (size_t k = 0; k < it->size(); ++k) {
      const json& part = (*it)[k];
      if (!part.is_object() || !part.contains("type") || part["type"] != "text" || !part.contains("text") ||
          !part["text"].is_string())
        return Status::InvalidArgument(where + ".content[" + std::to_string(k) +
                                       "] must be {\"type\": \"text\", \"text\": string}");
      text += part["text"].get<std::string>();
    }
    return std::optional<std::string>(std::move(text));
  }
  return Status::InvalidArgument(where + ".content must be a string, null or a list of text parts");
}

Result<std::vector<ToolCall>> ParseToolCalls(const json& m, const std::string& where) {
  std::vector<ToolCall> calls;
  auto it = m.find("tool_calls");
  if (it == m.end() || it->is_null()) return calls;
  if (!it->is_array()) return Status::InvalidArgument(where + ".tool_calls must be a list");
  for (size_t k = 0; k < it->size(); ++k) {
    const json& c = (*it)[k];
    const std::string at = where + ".tool_calls[" + std::to_string(k) + "]";
    if (!c.is_object() || !c.contains("function") || !c["function"].is_object())
      return Status::InvalidArgument(at + " must be an object with a \"function\" object");
    const json& f = c["function"];
    ToolCall call;
    if (c.contains("type")) {
      if (!c["type"].is_string()) return Status::InvalidArgument(at + ".type must be a string");
      call.type = c["type"].get<std::string>();
    }
    if (!f.contains("name") || !f["name"].is_string())
      return Status::InvalidArgument(at + ".function.name must be a string");
    if (!f.contains("arguments") || !f["arguments"].is_string())
      return Status::InvalidArgument(at + ".function.arguments must be a string (JSON text)");
    call.name = f["name"].get<std::string>();
    call.arguments = f["arguments"].get<std::string>();
    calls.push_back(std::move(call));
  }
  return calls;
}
Result<std::vector<ChatMessage>> ParseMessages(const json& messages);

}  // namespace

Result<std::vector<ChatMessage>> ParseChatMessages(const json& messages) {
  try {
    return ParseMessages(messages);
  } catch (const json::exception& e) {
    return Status::InvalidArgument(std::string("malformed chat messages: ") + e.what());
  }
}

namespace {
Result<std::vector<ChatMessage>> ParseMessages(const json& messages) {
  if (!messages.is_array()) return Status::InvalidArgument("\"messages\" must be a list");
  std::vector<ChatMessage> out;
  out.reserve(messages.size());
  for (size_t i = 0; i < messages.size(); ++i) {
    const json& m = messages[i];
    const std::string where = "messages[" + std::to_string(i) + "]";
    if (!m.is_object()) return Status::InvalidArgument(where + " must be an object");
    if (!m.contains("role") || !m["role"].is_string())
      return Status::InvalidArgument(where + ".role must be a string");
    ChatMessage msg;
    msg.role = m["role"].get<std::string>();
    // OpenAI's newer spelling of the system role.
    if (msg.role == "developer") msg.role = "system";
    if (msg.role != "system" && msg.role != "user" && msg.role != "assistant" && msg.role != "tool")
      return Status::InvalidArgument(where + ".role '" + msg.role +
                                     "' is not a chat role (system, developer, user, assistant or tool)");
    PDSERVE_ASSIGN_OR_RETURN(msg.content, ParseContent(m, where));
    PDSERVE_ASSIGN_OR_RETURN(msg.tool_calls, ParseToolCalls(m, where));
    out.push_back(std::move(msg));
  }
  return out;
}
}  // namespace

Result<ChatRequest> ParseChatRequestJson(const json& request) {
  if (!request.is_object()) return Status::InvalidArgument("chat request must be a JSON object");
  if (!request.contains("messages")) return Status::InvalidArgument("chat request has no \"messages\"");
  ChatRequest out;
  PDSERVE_ASSIGN_OR_RETURN(out.messages, ParseChatMessages(request["messages"]));
  if (auto it = request.find("add_generation_prompt"); it != request.end() && !it->is_null()) {
    if (!it->is_boolean()) return Status::InvalidArgument("\"add_generation_prompt\" must be a boolean");
    out.options.add_generation_prompt = it->get<bool>();
  }
  if (auto it = request.find("thinking"); it != request.end() && !it->is_null()) {
    if (!it->is_boolean()) return Status::InvalidArgument("\"thinking\" must be a boolean or null");
    out.options.thinking = it->get<bool>();
  }
  return out;
}

Result<ChatRequest> ParseChatRequest(std::string_view json_text) {
  json request;
  try {
    request = json::parse(json_text);
  } catch (const json::exception& e) {
    return Status::InvalidArgument(std::string("chat request is not valid JSON: ") + e.what());
  }
  return ParseChatRequestJson(request);
}

}  // namespace pdserve::tokenizer
