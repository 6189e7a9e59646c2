// Incremental parsing of an OpenAI streaming reply (server-sent events) as it arrives in
// arbitrary pieces from the socket, and of one stream chunk's JSON into what clients measure
// (text delta, finish reason, usage, error). The one SSE parser of the tree: the HTTP test
// client (http_test_client.h), the load generator (bench/loadgen) and the router benchmarks
// all read streams with it.
//
// Thread-safety: an SseParser belongs to one request's receiving thread.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace pdserve::services::testing {

// Splits a byte stream into SSE events (blank-line separated; "\n" or "\r\n" line ends).
// Each event's `data:` lines are joined with "\n" (the SSE rule); comment lines (":" first)
// and other fields (event:, id:, retry:) are ignored; an event without data is not reported.
class SseParser {
 public:
  using EventFn = std::function<void(std::string_view data)>;
  // Feeds the next piece of the stream; calls on_event for every event completed by it.
  void Feed(std::string_view bytes, const EventFn& on_event);
  // Bytes received but not yet part of a completed event (a truncated stream leaves some).
  size_t pending_bytes() const { return buffer_.size(); }

 private:
  void DispatchLine(std::string_view line, const EventFn& on_event);
  std::string buffer_;  // the incomplete current line
  std::string data_;    // the current event's data so far
  bool has_data_ = false;
};

// One `data:` payload of a completion or chat completion stream.
struct StreamChunk {
  bool done = false;              // the "[DONE]" sentinel
  std::string text;               // choices[0].text or choices[0].delta.content ("" if none)
  std::optional<std::string> finish_reason;
  std::optional<int64_t> prompt_tokens, completion_tokens;  // from a usage object
  std::optional<int64_t> cached_tokens;  // usage.prompt_tokens_details.cached_tokens
  std::vector<int32_t> token_ids;        // choices[0].token_ids (return_token_ids)
  std::optional<std::string> error;                         // an {"error": {...}} event's message
};

// Errors: InvalidArgument naming what is malformed (not JSON, choices not an array, ...).
Result<StreamChunk> ParseStreamChunk(std::string_view data);

}  // namespace pdserve::services::testing
