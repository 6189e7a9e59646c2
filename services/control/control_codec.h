// Control-plane codec: ControlMessage <-> the bytes of one proto/control.capnp ControlMessage
// (unpacked Cap'n Proto, single segment when possible).
//
// Decoding never trusts its input: bytes that are not a well-formed message, an unknown union
// member or enum value, a list beyond the limits below, a negative token id, a non-finite
// float or a missing required field give a Status, never an exception or a crash. Semantic
// checks that need context (is this request id known, is this sampling combination
// supported) are the receiver's job.
//
// Thread-safety: pure functions.
#pragma once

#include <string>
#include <string_view>

#include "common/status.h"
#include "services/control/control_messages.h"

namespace pdserve::services {

// Limits enforced by DecodeControlMessage (and checked by EncodeControlMessage, so a sender
// learns about a message its peer would refuse before sending it).
struct ControlLimits {
  static constexpr size_t kMaxMessageBytes = size_t{64} << 20;
  static constexpr size_t kMaxPromptTokens = size_t{1} << 22;
  static constexpr size_t kMaxEventTokens = size_t{1} << 20;
  static constexpr size_t kMaxStopTokenIds = 4096;
  static constexpr size_t kMaxStopStrings = 64;
  static constexpr size_t kMaxStopStringBytes = 4096;
  static constexpr size_t kMaxTopLogprobs = 64;
  static constexpr size_t kMaxTextBytes = 64 * 1024;     // ids, addresses, messages, reasons
  static constexpr size_t kMaxBlobBytes = size_t{16} << 20;  // KV descriptors, matcher states
  static constexpr size_t kMaxConstraintBytes = size_t{1} << 20;  // a schema / regex / grammar
  // Hashes in one kvEvents list (8 MiB); a larger set goes out as several messages.
  static constexpr size_t kMaxKvEventHashes = size_t{1} << 20;
};

// Errors: InvalidArgument when the message breaks a limit above.
Result<std::string> EncodeControlMessage(const ControlMessage& message);

// Errors: InvalidArgument (malformed bytes, limits, bad values; the message names the field),
// Unimplemented (a union member this build does not know: a newer peer).
Result<ControlMessage> DecodeControlMessage(std::string_view bytes);

}  // namespace pdserve::services
