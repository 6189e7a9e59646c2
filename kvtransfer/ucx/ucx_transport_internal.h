// Private to UcxTransport (ucx_transport.cc, ucx_transport_ops.cc): the bookkeeping of
// peers, RMA batches, messages and in-flight UCX requests. Touched by the I/O thread only.
#pragma once

#include <deque>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "kvtransfer/ucx/ucx_transport.h"

namespace pdserve::kvtransfer {

std::string ShortAddress(const std::string& address);

struct UcxTransport::Peer {
  UcxTransport* owner = nullptr;
  std::weak_ptr<Peer> self;
  std::string address;
  std::unique_ptr<UcxEndpoint> ep;
  std::map<std::string, std::unique_ptr<UcxRemoteKey>> rkeys;  // by packed key
  std::deque<std::shared_ptr<Batch>> queue;       // batches with ops not yet issued (FIFO)
  std::deque<std::shared_ptr<Message>> messages;  // messages not yet started (FIFO)
  uint64_t batches_submitted = 0;
  uint64_t batches_issued = 0;  // leaves `queue` in order: a message waits for its turn
  bool message_flushing = false;
  uint32_t inflight = 0;  // RMA ops outstanding
  bool am_writes = false;  // writes as active messages (see WriteProtocol)
  bool failed = false;
  Status reset_status;
  Status endpoint_error;  // set by OnEndpointError
};

struct UcxTransport::Batch {
  RmaKind kind = RmaKind::kWrite;
  std::shared_ptr<Peer> peer;
  RemoteRegionDesc region;
  std::vector<RmaOp> ops;
  Deadline deadline{};
  DoneCallback done;
  ucp_rkey_h rkey = nullptr;
  size_t next_op = 0;
  uint64_t next_offset = 0;
  uint32_t inflight = 0;
  uint64_t bytes = 0;
  Status status;
  bool finished = false;
};

struct UcxTransport::Message {
  enum class Stage { kQueued, kFlushing, kSending, kDone };
  std::shared_ptr<Peer> peer;
  uint16_t channel = 0;
  std::string envelope;
  bool flush_first = false;
  uint64_t after_batches = 0;
  Deadline deadline{};
  DoneCallback done;
  Stage stage = Stage::kQueued;
};

struct UcxTransport::OpContext {
  OpContext(UcxTransport* t, std::shared_ptr<Batch> b, std::shared_ptr<Message> m, uint64_t n)
      : transport(t), batch(std::move(b)), message(std::move(m)), length(n) {}
  UcxTransport* transport;
  std::shared_ptr<Batch> batch;
  std::shared_ptr<Message> message;
  uint64_t length;
  // Active-message writes: the header ([u32 n][n x (u64 address, u64 length)], little
  // endian) and the pieces' local buffers, sent as one UCP iov message.
  std::vector<uint8_t> header;
  std::vector<ucp_dt_iov_t> iov;
};

struct UcxTransport::Closing {
  ucs_status_ptr_t request;
  std::shared_ptr<Peer> peer;
  Deadline give_up;
};

}  // namespace pdserve::kvtransfer
