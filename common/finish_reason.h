// FinishReason: how a generation request ended. One definition for the engine (which decides
// it), the router <-> worker control protocol (which carries it; the codec maps it to the wire
// enum) and the router (which reports it to clients).
//
// Thread-safety: a value type and a pure function.
#pragma once

#include <cstdint>

namespace pdserve {

enum class FinishReason : uint8_t {
  kNone,    // not finished
  kStop,    // a stop token or stop string
  kLength,  // max_tokens (or the context) reached
  kAbort,   // aborted by the client, the router or a deadline
  kError,   // failed; the error travels beside it
};

// "none" | "stop" | "length" | "abort" | "error".
constexpr const char* FinishReasonName(FinishReason reason) {
  switch (reason) {
    case FinishReason::kNone: return "none";
    case FinishReason::kStop: return "stop";
    case FinishReason::kLength: return "length";
    case FinishReason::kAbort: return "abort";
    case FinishReason::kError: return "error";
  }
  return "unknown";
}

}  // namespace pdserve
