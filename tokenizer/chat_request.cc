#include "tokenizer/chat_request.h"

#include <nlohmann/json.hpp>

namespace pdserve::tokenizer {

namespace {

// The parsers work on either nlohmann::json (sorted keys, what most callers hold) or
// ordered_json (the text's key order, which tool parameters need).
template <typename Json>
Result<std::optional<std::string>> ParseContent(const Json& m, const std::string& where) {
  auto it = m.find("content");
  if (it == m.end() || it->is_null()) return std::optional<std::string>();
  if (it->is_string()) return std::optional<std::string>(it->template get<std::string>());
  if (it->is_array()) {
    std::string text;
    for (size_t k = 0; k < it->size(); ++k) {
      const Json& part = (*it)[k];
      if (!part.is_object() || !part.contains("type") || part["type"] != "text" || !part.contains("text") ||
          !part["text"].is_string())
        return Status::InvalidArgument(where + ".content[" + std::to_string(k) +
                                       "] must be {\"type\": \"text\", \"text\": string}");
      text += part["text"].template get<std::string>();
    }
    return std::optional<std::string>(std::move(text));
  }
  return Status::InvalidArgument(where + ".content must be a string, null or a list of text parts");
}

template <typename Json>
Result<std::vector<ToolCall>> ParseToolCalls(const Json& m, const std::string& where) {
  std::vector<ToolCall> calls;
  auto it = m.find("tool_calls");
  if (it == m.end() || it->is_null()) return calls;
  if (!it->is_array()) return Status::InvalidArgument(where + ".tool_calls must be a list");
  for (size_t k = 0; k < it->size(); ++k) {
    const Json& c = (*it)[k];
    const std::string at = where + ".tool_calls[" + std::to_string(k) + "]";
    if (!c.is_object() || !c.contains("function") || !c["function"].is_object())
      return Status::InvalidArgument(at + " must be an object with a \"function\" object");
    const Json& f = c["function"];
    ToolCall call;
    if (c.contains("type")) {
      if (!c["type"].is_string()) return Status::InvalidArgument(at + ".type must be a string");
      call.type = c["type"].template get<std::string>();
    }
    if (!f.contains("name") || !f["name"].is_string())
      return Status::InvalidArgument(at + ".function.name must be a string");
    if (!f.contains("arguments") || !f["arguments"].is_string())
      return Status::InvalidArgument(at + ".function.arguments must be a string (JSON text)");
    call.name = f["name"].template get<std::string>();
    call.arguments = f["arguments"].template get<std::string>();
    calls.push_back(std::move(call));
  }
  return calls;
}

template <typename Json>
Result<std::vector<ChatMessage>> ParseMessages(const Json& messages) {
  if (!messages.is_array()) return Status::InvalidArgument("\"messages\" must be a list");
  std::vector<ChatMessage> out;
  out.reserve(messages.size());
  for (size_t i = 0; i < messages.size(); ++i) {
    const Json& m = messages[i];
    const std::string where = "messages[" + std::to_string(i) + "]";
    if (!m.is_object()) return Status::InvalidArgument(where + " must be an object");
    if (!m.contains("role") || !m["role"].is_string())
      return Status::InvalidArgument(where + ".role must be a string");
    ChatMessage msg;
    msg.role = m["role"].template get<std::string>();
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

template <typename Json>
Result<std::vector<ChatMessage>> ParseMessagesCatching(const Json& messages) {
  try {
    return ParseMessages(messages);
  } catch (const nlohmann::json::exception& e) {
    return Status::InvalidArgument(std::string("malformed chat messages: ") + e.what());
  }
}

template <typename Json>
Result<ChatRequest> ParseRequest(const Json& request) {
  if (!request.is_object()) return Status::InvalidArgument("chat request must be a JSON object");
  if (!request.contains("messages")) return Status::InvalidArgument("chat request has no \"messages\"");
  ChatRequest out;
  PDSERVE_ASSIGN_OR_RETURN(out.messages, ParseMessagesCatching(request["messages"]));
  if (auto it = request.find("add_generation_prompt"); it != request.end() && !it->is_null()) {
    if (!it->is_boolean()) return Status::InvalidArgument("\"add_generation_prompt\" must be a boolean");
    out.options.add_generation_prompt = it->template get<bool>();
  }
  if (auto it = request.find("thinking"); it != request.end() && !it->is_null()) {
    if (!it->is_boolean()) return Status::InvalidArgument("\"thinking\" must be a boolean or null");
    out.options.thinking = it->template get<bool>();
  }
  if (auto it = request.find("format"); it != request.end() && !it->is_null()) {
    if (*it == "deepseek_v3") out.options.format = ChatFormat::kDeepSeekV3;
    else if (*it == "deepseek_v31") out.options.format = ChatFormat::kDeepSeekV31;
    else return Status::InvalidArgument("\"format\" must be \"deepseek_v3\" or \"deepseek_v31\"");
  }
  try {
    const nlohmann::ordered_json tools = request.contains("tools") ? nlohmann::ordered_json(request["tools"]) : nullptr;
    PDSERVE_ASSIGN_OR_RETURN(out.options.tools, ParseTools(tools));
    const nlohmann::ordered_json choice =
        request.contains("tool_choice") ? nlohmann::ordered_json(request["tool_choice"]) : nullptr;
    PDSERVE_ASSIGN_OR_RETURN(out.options.tool_choice, ParseToolChoice(choice, out.options.tools));
  } catch (const nlohmann::json::exception& e) {
    return Status::InvalidArgument(std::string("malformed tools: ") + e.what());
  }
  return out;
}

}  // namespace

Result<std::vector<ChatMessage>> ParseChatMessages(const nlohmann::json& messages) {
  return ParseMessagesCatching(messages);
}
Result<std::vector<ChatMessage>> ParseChatMessages(const nlohmann::ordered_json& messages) {
  return ParseMessagesCatching(messages);
}
Result<ChatRequest> ParseChatRequestJson(const nlohmann::json& request) { return ParseRequest(request); }
Result<ChatRequest> ParseChatRequestJson(const nlohmann::ordered_json& request) { return ParseRequest(request); }

Result<ChatRequest> ParseChatRequest(std::string_view json_text) {
  nlohmann::ordered_json request;
  try {
    request = nlohmann::ordered_json::parse(json_text);
  } catch (const nlohmann::json::exception& e) {
    return Status::InvalidArgument(std::string("chat request is not valid JSON: ") + e.what());
  }
  return ParseChatRequestJson(request);
}

}  // namespace pdserve::tokenizer
