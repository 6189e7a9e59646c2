#include "tokenizer/chat_template.h"

#include <cstdio>

namespace pdserve::tokenizer {

namespace {

// FNV-1a 64 of the chat_template shipped in DeepSeek-V3's tokenizer_config.json.
constexpr uint64_t kDeepSeekV3Fingerprint = 0xebe3604156dc466aULL;

constexpr std::string_view kUser = "<｜User｜>";
constexpr std::string_view kAssistant = "<｜Assistant｜>";
constexpr std::string_view kEos = "<｜end▁of▁sentence｜>";
constexpr std::string_view kThinkOpen = "<think>";
constexpr std::string_view kThinkClose = "</think>";
constexpr std::string_view kToolCallsBegin = "<｜tool▁calls▁begin｜>";
constexpr std::string_view kToolCallsEnd = "<｜tool▁calls▁end｜>";
constexpr std::string_view kToolCallBegin = "<｜tool▁call▁begin｜>";
constexpr std::string_view kToolCallEnd = "<｜tool▁call▁end｜>";
constexpr std::string_view kToolSep = "<｜tool▁sep｜>";
constexpr std::string_view kToolOutputsBegin = "<｜tool▁outputs▁begin｜>";
constexpr std::string_view kToolOutputsEnd = "<｜tool▁outputs▁end｜>";
constexpr std::string_view kToolOutputBegin = "<｜tool▁output▁begin｜>";
constexpr std::string_view kToolOutputEnd = "<｜tool▁output▁end｜>";

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

Result<std::string> ChatTemplate::Render(const std::vector<ChatMessage>& messages,
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
