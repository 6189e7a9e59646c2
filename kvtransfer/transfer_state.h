// TransferState: the ownership state machine of one request's KV blocks on the decode side
// (KvReceiver). Not engine::RequestState, which is where a request is in the scheduler.
//
//   kReserved --begin--> kWriting --all writers verified--> kComplete --HandOver--> kHandedOver
//       |                   |                                   |
//       +-------------------+-----------------------------------+--> kAborted
//   (lease expired, deadline, abort from either side, digest mismatch, dead writer)
//
// Who owns the blocks: kReserved/kWriting - the transfer (prefill ranks may write into them);
// kComplete - the receiver (nobody writes; waiting for the engine); kHandedOver - the engine;
// kAborted - the receiver until no writer can still be writing (quarantine), then the
// allocator. kHandedOver and kAborted are terminal. A kComplete notice received before any
// begin (the messages raced) still goes through kWriting.
//
// Thread-safety: pure functions.
#pragma once

#include <cstdint>
#include <string_view>

namespace pdserve::kvtransfer {

enum class TransferState : uint8_t {
  kReserved = 0,
  kWriting = 1,
  kComplete = 2,
  kHandedOver = 3,
  kAborted = 4,
};

constexpr std::string_view TransferStateName(TransferState state) {
  switch (state) {
    case TransferState::kReserved: return "reserved";
    case TransferState::kWriting: return "writing";
    case TransferState::kComplete: return "complete";
    case TransferState::kHandedOver: return "handed_over";
    case TransferState::kAborted: return "aborted";
  }
  return "?";
}

constexpr bool IsTerminal(TransferState state) {
  return state == TransferState::kHandedOver || state == TransferState::kAborted;
}

// True for the arrows of the diagram above.
constexpr bool IsValidTransition(TransferState from, TransferState to) {
  switch (from) {
    case TransferState::kReserved:
      return to == TransferState::kWriting || to == TransferState::kAborted;
    case TransferState::kWriting:
      return to == TransferState::kComplete || to == TransferState::kAborted;
    case TransferState::kComplete:
      return to == TransferState::kHandedOver || to == TransferState::kAborted;
    case TransferState::kHandedOver:
    case TransferState::kAborted:
      return false;
  }
  return false;
}

}  // namespace pdserve::kvtransfer
