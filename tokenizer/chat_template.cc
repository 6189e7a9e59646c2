#include "tokenizer/chat_template.h"

#include <cstdio>

#include "tokenizer/deepseek_markers.h"

namespace pdserve::tokenizer {

namespace {

// FNV-1a 64 of the chat_template shipped in DeepSeek-V3's tokenizer_config.json.
constexpr uint64_t kDeepSeekV3Fingerprint = 0xebe3604156dc466aULL;

using namespace markers;  // NOLINT: the marker names read as the template does

// An earlier assistant turn keeps only its answer: the text after its last </think>.
std::string_view DropReasoning(std::string_view content) {
  const size_t at = content.rfind(kThinkClose);
  return at == std::string_view::npos ? content : content.substr(at + kThinkClose.size());
}

void AppendToolCall(const ToolCall& call, std::string* out) {
  out->append(call.type).append(kToolSep).append(call.name);
  out->append("\n```json\n").append(call.arguments).append("\n```");
  out->append(kToolCallEnd);
}

std::string Where(size_t index) { return "messages[" + std::to_string(index) + "]"; }

}  // namespace

uint64_t ChatTemplate::Fingerprint(std::string_view template_text) {
  uint64_t h = 0xcbf29ce484222325ULL;
  for (char c : template_text) {
    h ^= static_cast<uint8_t>(c);
    h *= 0x100000001b3ULL;
  }
  return h;
}

Result<ChatTemplate> ChatTemplate::FromConfig(const TokenizerConfig& config) {
  if (config.chat_template) {
    const uint64_t fp = Fingerprint(*config.chat_template);
    if (fp != kDeepSeekV3Fingerprint) {
      char hex[24];
      std::snprintf(hex, sizeof(hex), "%016llx", static_cast<unsigned long long>(fp));
      return Status::FailedPrecondition(
          "tokenizer_config.json holds a chat_template pdserve does not implement (fingerprint " +
          std::string(hex) + "); only the DeepSeek-V3 template is built in");
    }
  }
  return ChatTemplate(config.bos_token);
}

bool ChatTemplate::OpensReasoning(std::string_view prompt) {
  return prompt.size() >= kThinkOpen.size() && prompt.substr(prompt.size() - kThinkOpen.size()) == kThinkOpen;
}

Result<std::string> ChatTemplate::Render(const std::vector<ChatMessage>& messages,
                                         const ChatTemplateOptions& options) const {
  if (options.format == ChatFormat::kDeepSeekV31) return RenderV31(messages, options);
  if (!options.tools.empty())
    return Status::InvalidArgument("tools need the DeepSeek-V3.1 chat format (the V3 template does not render them)");
  return RenderV3(messages, options);
}

Result<std::string> ChatTemplate::RenderV31(const std::vector<ChatMessage>& messages,
                                            const ChatTemplateOptions& options) const {
  std::string out = bos_token_;
  bool first_system = true;
  for (size_t i = 0; i < messages.size(); ++i) {
    const ChatMessage& m = messages[i];
    if (m.role != "system") continue;
    if (!m.content) return Status::InvalidArgument("system message needs string content", Where(i));
    if (!first_system) out += "\n\n";
    out += *m.content;
    first_system = false;
  }
  if (!options.tools.empty() && options.tool_choice.mode != ToolChoiceMode::kNone) {
    PDSERVE_ASSIGN_OR_RETURN(const std::string tools, RenderToolsPrompt(options.tools));
    out.append("\n\n").append(tools);
  }
  bool is_last_user = false;  // the previous turn was the user's: an assistant turn opens
  bool is_tool = false;       // the previous turn was a tool result
  for (size_t i = 0; i < messages.size(); ++i) {
    const ChatMessage& m = messages[i];
    if (m.role == "user") {
      if (!m.content) return Status::InvalidArgument("user message needs string content", Where(i));
      is_tool = false;
      is_last_user = true;
      out.append(kUser).append(*m.content);
    } else if (m.role == "assistant" && !m.tool_calls.empty()) {
      if (is_last_user) out.append(kAssistant).append(kThinkClose);
      is_last_user = false;
      is_tool = false;
      for (size_t k = 0; k < m.tool_calls.size(); ++k) {
        const ToolCall& call = m.tool_calls[k];
        if (k == 0) out.append(m.content.value_or("")).append(kToolCallsBegin);
        out.append(kToolCallBegin).append(call.name).append(kToolSep).append(call.arguments).append(kToolCallEnd);
      }
      out.append(kToolCallsEnd).append(kEos);
    } else if (m.role == "assistant") {
      if (!m.content) return Status::InvalidArgument("assistant message needs content or tool_calls", Where(i));
      if (is_last_user) out.append(kAssistant).append(kThinkClose);
      is_last_user = false;
      if (is_tool) {
        out.append(*m.content);
        is_tool = false;
      } else {
        // Only the answer after the first </think> stays in the history.
        std::string_view answer = *m.content;
        if (const size_t at = answer.find(kThinkClose); at != std::string_view::npos)
          answer = answer.substr(at + kThinkClose.size());
        out.append(answer);
      }
      out.append(kEos);
    } else if (m.role == "tool") {
      if (!m.content) return Status::InvalidArgument("tool message needs string content", Where(i));
      is_last_user = false;
      is_tool = true;
      out.append(kToolOutputBegin).append(*m.content).append(kToolOutputEnd);
    }
  }
  if (options.add_generation_prompt && is_last_user && !is_tool)
    out.append(kAssistant).append(options.thinking.value_or(false) ? kThinkOpen : kThinkClose);
  return out;
}

Result<std::string> ChatTemplate::RenderV3(const std::vector<ChatMessage>& messages,
                                           const ChatTemplateOptions& options) const {
  const bool thinking_mode = options.thinking.has_value();
  std::string out;
  // Pass 1: system prompts, joined by blank lines, right after BOS.
  out.append(bos_token_);
  bool first_system = true;
  for (size_t i = 0; i < messages.size(); ++i) {
    const ChatMessage& m = messages[i];
    if (m.role != "system") continue;
    if (!m.content) return Status::InvalidArgument("system message needs string content", Where(i));
    if (!first_system) out.append("\n\n");
    out.append(*m.content);
    first_system = false;
  }

  // Pass 2: the turns. The state mirrors the Jinja template's namespace variables.
  bool is_first_tool_call = false;  // ns.is_first: set by the first tool call, never reset
  bool is_tool = false;             // the previous turn was a tool output
  bool is_output_first = true;      // no tool output rendered yet
  for (size_t i = 0; i < messages.size(); ++i) {
    const ChatMessage& m = messages[i];
    if (m.role == "user") {
      if (!m.content) return Status::InvalidArgument("user message needs string content", Where(i));
      is_tool = false;
      out.append(kUser).append(*m.content);
    } else if (m.role == "assistant" && !m.content) {
      if (m.tool_calls.empty())
        return Status::InvalidArgument("assistant message needs content or tool_calls", Where(i));
      is_tool = false;
      for (const ToolCall& call : m.tool_calls) {
        if (!is_first_tool_call) {
          out.append(kAssistant);
          if (thinking_mode) out.append(kThinkClose);
          out.append(kToolCallsBegin).append(kToolCallBegin);
          AppendToolCall(call, &out);
          is_first_tool_call = true;
        } else {
          out.append("\n").append(kToolCallBegin);
          AppendToolCall(call, &out);
          out.append(kToolCallsEnd).append(kEos);
        }
      }
    } else if (m.role == "assistant") {
      const std::string_view answer = thinking_mode ? DropReasoning(*m.content) : *m.content;
      if (is_tool) {
        out.append(kToolOutputsEnd).append(answer).append(kEos);
        is_tool = false;
      } else {
        out.append(kAssistant);
        if (thinking_mode) out.append(kThinkClose);
        out.append(answer).append(kEos);
      }
    } else if (m.role == "tool") {
      if (!m.content) return Status::InvalidArgument("tool message needs string content", Where(i));
      is_tool = true;
      if (is_output_first) {
        out.append(kToolOutputsBegin).append(kToolOutputBegin).append(*m.content).append(kToolOutputEnd);
        is_output_first = false;
      } else {
        out.append("\n").append(kToolOutputBegin).append(*m.content).append(kToolOutputEnd);
      }
    }
    // Other roles (and "system", handled above) render nothing here, as in the template.
  }
  if (is_tool) out.append(kToolOutputsEnd);
  if (options.add_generation_prompt && !is_tool) {
    out.append(kAssistant);
    if (thinking_mode) out.append(*options.thinking ? kThinkOpen : kThinkClose);
  }
  return out;
}

}  // namespace pdserve::tokenizer
