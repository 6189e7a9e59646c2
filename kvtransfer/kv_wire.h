// Wire encoding of kvtransfer's messages: Cap'n Proto (proto/kv_transfer.capnp) flat arrays.
//
// Byte layout: a single-segment Cap'n Proto message in the standard framing (segment table +
// words), as produced by capnp::messageToFlatArray. Decoders copy the bytes into aligned
// storage first, so any std::string_view may be decoded; malformed input gives
// kInvalidArgument (never an exception or a crash). Decoded descriptors are not validated
// here: callers run KvDescriptor::Validate().
//
// TransferMessage is the transfer-plane message (begin / complete / abort / ack) exchanged by
// KvSender and KvReceiver through Transport::SendMessage.
//
// Thread-safety: pure functions.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "common/status.h"
#include "kvtransfer/kv_descriptor.h"

namespace pdserve::kvtransfer {

struct TransferMessage {
  enum class Kind : uint8_t { kBegin, kComplete, kAbort, kAck };

  uint64_t request_id = 0;
  uint32_t rank = 0;
  std::string sender_address;
  Kind kind = Kind::kBegin;
  // kComplete only.
  uint32_t blocks_written = 0;
  uint64_t bytes_written = 0;
  uint64_t digest = 0;
  // kAbort: why; kAck: the verdict (OK or the failure).
  Status status;
  // kBegin / kComplete: when the writer gives up (wall clock, ms since the epoch; 0 = unset).
  // The decode side never waits for a writer past it, so both sides agree on late transfers.
  int64_t deadline_unix_ms = 0;
};

std::string_view TransferMessageKindName(TransferMessage::Kind kind);

std::string EncodeDescriptor(const KvDescriptor& descriptor);
Result<KvDescriptor> DecodeDescriptor(std::string_view bytes);

std::string EncodeTransferMessage(const TransferMessage& message);
Result<TransferMessage> DecodeTransferMessage(std::string_view bytes);

// Control plane (prefill asks decode for a request's descriptor).
// num_tokens 0 means "the decode side knows the request's length".
std::string EncodeDescriptorRequest(uint64_t request_id, uint32_t rank, uint32_t num_tokens = 0);
Status DecodeDescriptorRequest(std::string_view bytes, uint64_t* request_id, uint32_t* rank,
                               uint32_t* num_tokens = nullptr);
// A reply carries a descriptor or a failure (status not OK).
std::string EncodeDescriptorReply(const Result<KvDescriptor>& reply);
Result<KvDescriptor> DecodeDescriptorReply(std::string_view bytes);

}  // namespace pdserve::kvtransfer
