// The grammar that makes a reply a tool call in DeepSeek-V3.1's format, for tool_choice
// "required" (one or more calls of any offered function; exactly one with parallel false) or a
// named function (exactly one call of it), written in pdserve's EBNF (grammar/ebnf_parser.h) with each function's parameters
// embedded as a JSON Schema (%json), so the arguments always parse and validate:
//
//   root ::= "<｜tool▁calls▁begin｜>" call+ "<｜tool▁calls▁end｜>"
//   call ::= "<｜tool▁call▁begin｜>" (fn_0 | fn_1 | ...) "<｜tool▁call▁end｜>"
//   fn_0 ::= "get_weather" "<｜tool▁sep｜>" %json {...parameters...}
//
// The text goes into a grammar::Constraint of kind kEbnf (with free_text_until "</think>" when
// the prompt opened reasoning). Functions without parameters take `{}`. The schemas themselves
// are checked when the constraint compiles: the router should validate each tool's parameters
// on their own first (grammar::ValidateJsonSchema with where = "tools[i].function.parameters")
// so a 400 names the tool.
//
// Thread-safety: pure function.
#pragma once

#include <string>
#include <vector>

#include "common/status.h"
#include "tokenizer/tools.h"

namespace pdserve::tokenizer {

// Errors: InvalidArgument for mode auto / none (nothing to constrain), no tools, or a named
// function that is not among the tools.
Result<std::string> ToolCallGrammar(const std::vector<ToolFunction>& tools, const ToolChoice& choice);

}  // namespace pdserve::tokenizer
