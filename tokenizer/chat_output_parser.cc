#include "tokenizer/chat_output_parser.h"

#include <algorithm>

#include "tokenizer/deepseek_markers.h"

namespace pdserve::tokenizer {

using namespace markers;  // NOLINT

ChatOutputParser::ChatOutputParser(const ChatOutputParserOptions& options)
    : options_(options), state_(options.starts_in_reasoning ? State::kReasoning : State::kContent) {}

std::vector<std::string_view> ChatOutputParser::Markers() const {
  switch (state_) {
    case State::kReasoning: return {kThinkClose};
    case State::kContent:
    case State::kAfterCalls:
      if (options_.parse_tool_calls) return {kToolCallsBegin};
      return {};
    case State::kCalls: return {kToolCallBegin, kToolCallsEnd};
    case State::kName: return {kToolSep};
    case State::kArguments: return {kToolCallEnd, kToolCallsEnd};
  }
  return {};
}

void ChatOutputParser::EmitArguments(std::string_view text, ChatDelta* delta) {
  if (text.empty() && name_sent_) return;
  const int32_t index = static_cast<int32_t>(message_.tool_calls.size()) - 1;
  message_.tool_calls.back().arguments.append(text);
  if (delta->tool_calls.empty() || delta->tool_calls.back().index != index) {
    ToolCallDelta d;
    d.index = index;
    delta->tool_calls.push_back(std::move(d));
  }
  ToolCallDelta& d = delta->tool_calls.back();
  if (!name_sent_) {
    d.name = message_.tool_calls.back().name;
    name_sent_ = true;
  }
  d.arguments.append(text);
}

void ChatOutputParser::Emit(std::string_view text, ChatDelta* delta) {
  if (text.empty()) return;
  switch (state_) {
    case State::kReasoning:
      message_.reasoning_content.append(text);
      delta->reasoning_content.append(text);
      break;
    case State::kContent:
    case State::kAfterCalls:
      message_.content.append(text);
      delta->content.append(text);
      break;
    case State::kCalls:
      break;  // between calls: nothing the client sees
    case State::kName:
      name_.append(text);
      break;
    case State::kArguments:
      EmitArguments(text, delta);
      break;
  }
}

void ChatOutputParser::Transition(std::string_view marker, ChatDelta* delta) {
  switch (state_) {
    case State::kReasoning:
      state_ = State::kContent;
      break;
    case State::kContent:
    case State::kAfterCalls:
      state_ = State::kCalls;
      break;
    case State::kCalls:
      if (marker == kToolCallBegin) {
        name_.clear();
        state_ = State::kName;
      } else {
        state_ = State::kAfterCalls;
      }
      break;
    case State::kName:
      message_.tool_calls.push_back(ParsedToolCall{name_, ""});
      name_sent_ = false;
      EmitArguments("", delta);  // the call's first delta: index and name
      state_ = State::kArguments;
      break;
    case State::kArguments:
      state_ = marker == kToolCallEnd ? State::kCalls : State::kAfterCalls;
      break;
  }
}

ChatDelta ChatOutputParser::Push(std::string_view text) {
  ChatDelta delta;
  pending_.append(text);
  while (true) {
    const std::vector<std::string_view> markers = Markers();
    size_t best = std::string::npos;
    std::string_view found;
    for (std::string_view m : markers) {
      const size_t at = pending_.find(m);
      if (at < best || (at == best && at != std::string::npos && m.size() > found.size())) {
        best = at;
        found = m;
      }
    }
    if (best != std::string::npos) {
      Emit(std::string_view(pending_).substr(0, best), &delta);
      pending_.erase(0, best + found.size());
      Transition(found, &delta);
      continue;
    }
    // Hold back the longest tail that could still become a marker.
    size_t hold = 0;
    for (std::string_view m : markers) {
      for (size_t n = std::min(m.size() - 1, pending_.size()); n > hold; --n) {
        if (std::string_view(pending_).substr(pending_.size() - n) == m.substr(0, n)) {
          hold = n;
          break;
        }
      }
    }
    Emit(std::string_view(pending_).substr(0, pending_.size() - hold), &delta);
    pending_.erase(0, pending_.size() - hold);
    return delta;
  }
}

ChatDelta ChatOutputParser::Finish() {
  ChatDelta delta;
  Emit(pending_, &delta);
  pending_.clear();
  if (state_ == State::kName && !name_.empty()) {
    message_.tool_calls.push_back(ParsedToolCall{name_, ""});
    name_sent_ = false;
    EmitArguments("", &delta);
    name_.clear();
    state_ = State::kArguments;
  }
  return delta;
}

}  // namespace pdserve::tokenizer
