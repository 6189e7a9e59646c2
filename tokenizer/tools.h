// Tools a chat request offers the model (OpenAI "tools" / "tool_choice"), and the system-prompt
// text DeepSeek-V3.1 / V3.2-Exp are trained to read them from (their model card's "ToolCall"
// format):
//
//   ## Tools
//   You have access to the following tools:
//
//   ### get_weather
//   Description: Get the weather
//
//   Parameters: {"type": "object", "properties": {"city": {"type": "string"}}}
//
//   IMPORTANT: ALWAYS adhere to this exact format for tool use:
//   <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>tool_call_name<｜tool▁sep｜>tool_call_arguments<｜tool▁call▁end｜>{{additional_tool_calls}}<｜tool▁calls▁end｜>
//
//   Where:
//
//   - `tool_call_name` must be an exact match to one of the available tools
//   - `tool_call_arguments` must be valid JSON that strictly follows the tool's Parameters Schema
//   - For multiple tool calls, chain them directly without separators or spaces
//
// Parameters are written as Python's json.dumps writes them (", " and ": " separators, ASCII
// with \uXXXX escapes, keys in the request's order), which is how the model saw them in training.
//
// Thread-safety: pure functions over values.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "common/status.h"

namespace pdserve::tokenizer {

struct ToolFunction {
  std::string name;         // [A-Za-z0-9_-]{1,64}, as OpenAI requires
  std::string description;  // may be empty
  std::string parameters;   // a JSON Schema, as JSON text ("" means an object with no properties)
};

enum class ToolChoiceMode : uint8_t {
  kAuto,      // the model may answer or call tools (default when tools are given)
  kNone,      // no tool calls: tools are left out of the prompt, markers in the output are text
  kRequired,  // one or more calls, constrained by the tool-call grammar (tool_call_grammar.h)
  kFunction,  // exactly one call of `function`, constrained likewise
};

struct ToolChoice {
  ToolChoiceMode mode = ToolChoiceMode::kAuto;
  std::string function;  // kFunction
  // OpenAI's parallel_tool_calls: false makes kRequired exactly one call (ToolCallGrammar).
  bool parallel = true;
};

// OpenAI request fields, from an ordered_json parse (a schema's property order is the order
// the grammar writes properties in, and the prompt shows them in). Errors: InvalidArgument
// naming the field ("tools[1].function.name").
Result<std::vector<ToolFunction>> ParseTools(const nlohmann::ordered_json& tools);
// "auto" | "none" | "required" | {"type": "function", "function": {"name": ...}}; a named
// function must be one of `tools`, and "required" needs at least one tool.
Result<ToolChoice> ParseToolChoice(const nlohmann::ordered_json& choice, const std::vector<ToolFunction>& tools);

// The "## Tools" block above (without a leading separator).
Result<std::string> RenderToolsPrompt(const std::vector<ToolFunction>& tools);

// JSON text re-serialized as Python's json.dumps(value) (ensure_ascii, default separators).
// Errors: InvalidArgument when `json_text` is not JSON.
Result<std::string> PythonJsonDumps(std::string_view json_text);

}  // namespace pdserve::tokenizer
