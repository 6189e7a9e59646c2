#include "tokenizer/tool_call_grammar.h"

#include "tokenizer/deepseek_markers.h"

namespace pdserve::tokenizer {

namespace {
// An EBNF string literal of `s` (markers and names are printable; escape what the syntax needs).
std::string Literal(std::string_view s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return out + "\"";
}
}  // namespace

Result<std::string> ToolCallGrammar(const std::vector<ToolFunction>& tools, const ToolChoice& choice) {
  if (choice.mode != ToolChoiceMode::kRequired && choice.mode != ToolChoiceMode::kFunction)
    return Status::InvalidArgument("a tool-call grammar needs tool_choice \"required\" or a named function");
  if (tools.empty()) return Status::InvalidArgument("a tool-call grammar needs tools");
  std::string functions, alternatives;
  int n = 0;
  for (const ToolFunction& t : tools) {
    if (choice.mode == ToolChoiceMode::kFunction && t.name != choice.function) continue;
    const std::string rule = "fn_" + std::to_string(n);
    alternatives += (n ? " | " : "") + rule;
    functions += rule + " ::= " + Literal(t.name) + " " + Literal(markers::kToolSep) + " %json " +
                 (t.parameters.empty() ? std::string(R"({"type": "object", "properties": {}})") : t.parameters) + "\n";
    ++n;
  }
  if (n == 0) return Status::InvalidArgument("tool_choice names function '" + choice.function + "', which is not in tools");
  std::string out = "root ::= " + Literal(markers::kToolCallsBegin) + " call" +
                    (choice.mode == ToolChoiceMode::kRequired && choice.parallel ? "+" : "") + " " + Literal(markers::kToolCallsEnd) + "\n";
  out += "call ::= " + Literal(markers::kToolCallBegin) + " (" + alternatives + ") " + Literal(markers::kToolCallEnd) + "\n";
  return out + functions;
}

}  // namespace pdserve::tokenizer
