// The router's ZeroMQ request API (proto/request_api.capnp, docs/request-api.md) as plain C++
// values, and their codec. The router (services/router/request_api_server.h) and the client
// library (services/client/request_client.h) use these; neither touches Cap'n Proto builders.
//
// Decoding never trusts its input: bytes that are not a well-formed message, an unknown union
// member or enum value, a list beyond the limits below or a wrong protocol version give a
// Status, never an exception or a crash. Value checks (ranges of sampling parameters, token ids
// in the vocabulary, the model name) are the router's, shared with its HTTP API.
//
// Thread-safety: value types and pure functions.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "common/finish_reason.h"
#include "common/status.h"
#include "services/control/control_messages.h"

namespace pdserve::services::api {

inline constexpr uint32_t kRequestApiProtocolVersion = 1;

struct Limits {
  static constexpr size_t kMaxMessageBytes = size_t{64} << 20;
  static constexpr size_t kMaxPromptTokens = size_t{1} << 22;
  static constexpr size_t kMaxTextBytes = size_t{32} << 20;  // prompt text, chat content
  static constexpr size_t kMaxMessages = 65536;
  static constexpr size_t kMaxListItems = 4096;              // stop strings, stop ids, tool calls, tools, logit bias
  static constexpr uint32_t kMaxChoices = 1024;              // n (the router's own cap is lower)
};

struct ToolCall {
  std::string name;
  std::string arguments;  // JSON text
  bool operator==(const ToolCall&) const = default;
};

struct ChatMessage {
  std::string role;
  std::optional<std::string> content;
  std::vector<ToolCall> tool_calls;
  bool operator==(const ChatMessage&) const = default;
};

struct Tool {
  std::string name;
  std::string description;
  std::string parameters;  // JSON Schema text; "" none
  bool operator==(const Tool&) const = default;
};

enum class ToolChoiceMode : uint8_t { kAuto, kNone, kRequired, kFunction };
struct ToolChoice {
  ToolChoiceMode mode = ToolChoiceMode::kAuto;
  std::string function;  // kFunction
  bool operator==(const ToolChoice&) const = default;
};

enum class ResponseFormatType : uint8_t { kText, kJsonObject, kJsonSchema, kRegex, kGrammar };
struct ResponseFormat {
  ResponseFormatType type = ResponseFormatType::kText;
  std::string text;     // the schema / regex / EBNF
  bool strict = true;   // kJsonSchema
  bool operator==(const ResponseFormat&) const = default;
};

// Unset: as if the OpenAI JSON key were absent.
struct Sampling {
  std::optional<int64_t> max_tokens;
  std::optional<double> temperature, top_p, min_p, presence_penalty, frequency_penalty, repetition_penalty;
  std::optional<int64_t> top_k, seed;
  bool operator==(const Sampling&) const = default;
};

enum class PromptKind : uint8_t { kTokenIds, kText, kChat };

struct Submit {
  uint64_t request_id = 0;
  std::string model;
  PromptKind kind = PromptKind::kTokenIds;
  std::vector<int32_t> prompt_ids;     // kTokenIds
  std::string prompt_text;             // kText
  std::vector<ChatMessage> messages;   // kChat
  std::optional<bool> thinking;        // kChat
  Sampling sampling;
  std::vector<std::string> stop;
  std::vector<int32_t> stop_token_ids;
  bool ignore_eos = false;
  bool skip_special_tokens = true;
  bool logprobs = false;
  uint32_t top_logprobs = 0;
  std::string user;
  std::string api_key;                 // router.api_keys_file; never logged
  uint32_t n = 1;                      // choices
  std::vector<LogitBias> logit_bias;
  std::vector<Tool> tools;             // kChat
  ToolChoice tool_choice;              // kChat
  ResponseFormat response_format;
  bool operator==(const Submit&) const = default;
};

struct Abort {
  uint64_t request_id = 0;
  std::string reason;
  bool operator==(const Abort&) const = default;
};

struct Ping {
  uint64_t nonce = 0;
  bool operator==(const Ping&) const = default;
};

struct Accepted {
  uint64_t request_id = 0;
  std::string tag;
  uint32_t prompt_tokens = 0;
  uint32_t max_tokens = 0;
  bool operator==(const Accepted&) const = default;
};

struct ToolCallDelta {
  uint32_t index = 0;
  std::string id;    // first delta of the call only
  std::string name;  // first delta of the call only
  std::string arguments;
  bool operator==(const ToolCallDelta&) const = default;
};

struct Output {
  uint64_t request_id = 0;
  std::vector<int32_t> tokens;
  std::string text;                    // completions: the text; chat: the content
  std::vector<TokenLogprob> logprobs;  // empty or parallel to tokens
  FinishReason finish = FinishReason::kNone;  // never kError: an error is an Error message
  uint32_t prompt_tokens = 0;          // usage, on the finishing event (of this choice)
  uint32_t completion_tokens = 0;
  uint32_t index = 0;                  // the choice
  std::string reasoning_text{};        // chat
  std::vector<ToolCallDelta> tool_calls{};  // chat
  bool tool_calls_finish = false;      // finish kStop with tool calls (the wire's toolCalls)
  uint32_t reasoning_tokens = 0;
  bool finishing() const { return finish != FinishReason::kNone; }
  bool operator==(const Output&) const = default;
};

struct Error {
  uint64_t request_id = 0;
  uint32_t http_status = 500;
  std::string type;
  std::string code;
  std::string param;
  std::string message;
  bool operator==(const Error&) const = default;
};

struct Pong {
  uint64_t nonce = 0;
  bool operator==(const Pong&) const = default;
};

struct Keepalive {
  bool operator==(const Keepalive&) const = default;
};

using Message = std::variant<Submit, Abort, Ping, Accepted, Output, Error, Pong, Keepalive>;

// The message's name as in the schema ("submit", "output", ...).
const char* MessageName(const Message& message);

// Errors: InvalidArgument when the message breaks a limit above.
Result<std::string> EncodeMessage(const Message& message);
// Errors: InvalidArgument (malformed bytes, limits, wrong protocol version; the message names
// the field), Unimplemented (a union member this build does not know).
Result<Message> DecodeMessage(std::string_view bytes);

}  // namespace pdserve::services::api
