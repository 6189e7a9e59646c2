// The DeepSeek chat markers, spelled once for the chat template, the output parser and the
// tool-call grammar. All are added tokens of the DeepSeek-V3 vocabulary; <think> / </think>
// are added tokens in V3.1 / V3.2's tokenizer and plain text in V3's.
#pragma once

#include <string_view>

namespace pdserve::tokenizer::markers {

inline constexpr std::string_view kUser = "<｜User｜>";
inline constexpr std::string_view kAssistant = "<｜Assistant｜>";
inline constexpr std::string_view kEos = "<｜end▁of▁sentence｜>";
inline constexpr std::string_view kThinkOpen = "<think>";
inline constexpr std::string_view kThinkClose = "</think>";
inline constexpr std::string_view kToolCallsBegin = "<｜tool▁calls▁begin｜>";
inline constexpr std::string_view kToolCallsEnd = "<｜tool▁calls▁end｜>";
inline constexpr std::string_view kToolCallBegin = "<｜tool▁call▁begin｜>";
inline constexpr std::string_view kToolCallEnd = "<｜tool▁call▁end｜>";
inline constexpr std::string_view kToolSep = "<｜tool▁sep｜>";
inline constexpr std::string_view kToolOutputsBegin = "<｜tool▁outputs▁begin｜>";
inline constexpr std::string_view kToolOutputsEnd = "<｜tool▁outputs▁end｜>";
inline constexpr std::string_view kToolOutputBegin = "<｜tool▁output▁begin｜>";
inline constexpr std::string_view kToolOutputEnd = "<｜tool▁output▁end｜>";

}  // namespace pdserve::tokenizer::markers
