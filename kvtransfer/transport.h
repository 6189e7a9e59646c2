// Transport: the data path of kvtransfer. One-sided RMA into memory a peer registered, plus
// small ordered messages (begin / completion / abort notices) on the same connection.
//
// Backends: UcxTransport (kvtransfer/ucx/, the real one: UCP over rc/dc, tcp, shm) and
// InProcTransport (kvtransfer/testing/, memcpy between transports of one process; in the
// testing library, linked by unit tests only). Metadata (who owns which region, with which key) is not exchanged here: it travels
// out of band (KvDescriptor on the control plane); the data path only uses descriptors the
// caller already holds.
//
// Peers are named by their transport address (the opaque bytes of address()); connections are
// made on first use and cached until Disconnect or a failure.
//
// Threading: every backend owns one internal thread that does all the I/O. All methods may be
// called from any thread and never block on the network (they queue work), except
// AllocateRegion / RegisterRegion / destroying a LocalRegion / RegisterClient /
// UnregisterClient, which wait for the I/O thread. Callbacks and handlers run on the I/O
// thread: they must be short and must not call those blocking methods (the non-blocking ones
// are fine).
//
// Completion semantics:
//  * Submit: the callback runs exactly once, after every op reached a terminal state:
//    OK (all local buffers reusable; writes become remotely visible at the latest when a later
//    SendMessage(flush_writes_first) completes), or the first error. The local buffers must
//    stay valid until then.
//  * Every op is checked against `region` (RangeWithin) before any op is issued: a bad op
//    rejects the whole batch synchronously with kInvalidArgument and no callback.
//  * Deadlines: a batch or message still unfinished at its deadline finishes with
//    kDeadlineExceeded; if ops were in flight the connection is torn down (the peer is treated
//    as broken: other work on it fails with kUnavailable, and it reconnects on next use).
//  * Peer failure (connection error) fails that peer's work with kUnavailable and calls every
//    client's peer-failure handler once.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "kvtransfer/memory_region.h"

namespace pdserve::kvtransfer {

using Clock = std::chrono::steady_clock;
using Deadline = Clock::time_point;

enum class RmaKind : uint8_t { kWrite, kRead };

// One contiguous RMA: kWrite copies local[0, length) to the remote address; kRead copies the
// remote bytes into local.
struct RmaOp {
  void* local = nullptr;
  uint64_t remote_address = 0;
  uint64_t length = 0;
};

using DoneCallback = std::function<void(const Status&)>;
using MessageHandler =
    std::function<void(std::string_view sender_address, std::string_view payload)>;
using PeerFailureHandler =
    std::function<void(std::string_view peer_address, const Status& status)>;

// Counters for tests and benchmarks; read at any time (each field is individually exact).
struct TransportStats {
  uint64_t registered_regions = 0;
  uint64_t peers = 0;            // open connections
  uint64_t remote_keys = 0;      // unpacked remote keys held
  uint64_t inflight_ops = 0;     // RMA operations issued to the backend, not yet completed
  uint64_t pending_batches = 0;  // Submit batches not yet finished
  uint64_t pending_messages = 0;
  uint64_t bytes_written = 0;
  uint64_t bytes_read = 0;
  uint64_t messages_sent = 0;
  uint64_t messages_received = 0;
  uint64_t rejected_writes = 0;  // incoming writes outside every registered region (dropped)
};

// A short printable name for a transport address (which may be binary): "peer:<hash>".
std::string PeerName(std::string_view address);

class Transport {
 public:
  // Message channel ids used by kvtransfer's protocol (KvReceiver / KvSender).
  static constexpr uint16_t kChannelToDecode = 1;
  static constexpr uint16_t kChannelToPrefill = 2;
  static constexpr uint16_t kMaxChannels = 8;

  virtual ~Transport() = default;
  Transport() = default;
  Transport(const Transport&) = delete;
  Transport& operator=(const Transport&) = delete;

  virtual std::string_view backend_name() const = 0;
  // This endpoint's address, given to peers (in descriptors and messages).
  virtual const std::string& address() const = 0;

  // Memory the backend allocates and registers (preferred: UCX shared-memory peers map it
  // directly). The LocalRegion must be destroyed before the transport.
  virtual Result<std::unique_ptr<LocalRegion>> AllocateRegion(uint64_t bytes) = 0;
  // Registers caller memory, which must outlive the returned region.
  virtual Result<std::unique_ptr<LocalRegion>> RegisterRegion(void* data, uint64_t bytes) = 0;

  // Installs the message and peer-failure handlers of `channel` (< kMaxChannels). Handlers
  // may be empty. UnregisterClient returns once no handler of the channel is running.
  virtual Status RegisterClient(uint16_t channel, MessageHandler on_message,
                                PeerFailureHandler on_peer_failure) = 0;
  virtual void UnregisterClient(uint16_t channel) = 0;

  // One-sided RMA batch to `peer`'s `region` (see the completion semantics above).
  virtual Status Submit(RmaKind kind, std::string_view peer, const RemoteRegionDesc& region,
                        std::vector<RmaOp> ops, Deadline deadline, DoneCallback done) = 0;

  // Sends `payload` to `peer`'s handler of `channel`. With flush_writes_first, the message is
  // sent only after every write issued to that peer before this call is remotely complete
  // (the completion-notice ordering). `done` (may be empty) runs once the message left or
  // failed.
  virtual Status SendMessage(std::string_view peer, uint16_t channel, std::string payload,
                             bool flush_writes_first, Deadline deadline, DoneCallback done) = 0;

  // Opens (or keeps) a connection to `peer` so that its failure is reported to the
  // peer-failure handlers even while no work is queued for it.
  virtual void Connect(std::string_view peer) = 0;

  // Drops the connection and cached keys of `peer`; its unfinished work fails with
  // kCancelled. No effect for an unknown peer.
  virtual void Disconnect(std::string_view peer) = 0;

  virtual TransportStats Stats() const = 0;
};

}  // namespace pdserve::kvtransfer
