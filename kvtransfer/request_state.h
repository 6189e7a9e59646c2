// The per-request ownership state machine of the decode side (KvReceiver).
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

enum class RequestState : uint8_t {
  kReserved = 0,
  kWriting = 1,
  kComplete = 2,
  kHandedOver = 3,
  kAborted = 4,
};

constexpr std::string_view RequestStateName(RequestState state) {
  switch (state) {
    case RequestState::kReserved: return "reserved";
    case RequestState::kWriting: return "writing";
    case RequestState::kComplete: return "complete";
    case RequestState::kHandedOver: return "handed_over";
    case RequestState::kAborted: return "aborted";
  }
  return "?";
}

constexpr bool IsTerminal(RequestState state) {
  return state == RequestState::kHandedOver || state == RequestState::kAborted;
}

// True for the arrows of the diagram above.
constexpr bool IsValidTransition(RequestState from, RequestState to) {
  switch (from) {
    case RequestState::kReserved:
      return to == RequestState::kWriting || to == RequestState::kAborted;
    case RequestState::kWriting:
      return to == RequestState::kComplete || to == RequestState::kAborted;
    case RequestState::kComplete:
      return to == RequestState::kHandedOver || to == RequestState::kAborted;
    case RequestState::kHandedOver:
    case RequestState::kAborted:
      return false;
  }
  return false;
}

}  // namespace pdserve::kvtransfer
