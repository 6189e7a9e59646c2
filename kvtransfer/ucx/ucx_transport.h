// UcxTransport: the UCX (UCP) backend of Transport. One ucp context + worker per transport,
// driven by one I/O thread; RMA with ucp_put_nbx / ucp_get_nbx on remote keys unpacked from
// the descriptors' packed keys; messages as UCP active messages (eager) whose payload starts
// with the sender's worker address; ucp_ep_flush_nbx orders completion notices after writes.
//
// Runs over whatever UCX selects from UCX_TLS (or options.tls): rc/dc on rdma-core NICs, tcp,
// and shared memory (posix/sysv/cma). Notes per transport:
//  * tcp: RMA is emulated with active messages, so the *target* must progress: this
//    transport's I/O thread does, also when idle (it sleeps in epoll on the worker's wakeup
//    fd). Large transfers are split into max_chunk_bytes pieces with at most
//    max_inflight_ops per peer outstanding (unbounded outstanding puts collapse tcp bandwidth).
//  * shared memory: regions from AllocateRegion are mapped by the peer (RMA is a memcpy by the
//    writer); UCX cannot report a dead shm peer (no peer error handling), so failures there
//    surface through deadlines. Endpoints fall back to UCP_ERR_HANDLING_MODE_NONE for it.
//
// I/O thread loop: run queued commands, issue RMA within the per-peer cap, progress the
// worker, handle failed peers, enforce deadlines, advance endpoint closes; when nothing
// happened for busy_poll_us, arm the worker and sleep in epoll (worker fd + an eventfd that
// commands and shutdown write to; at most until the next deadline).
//
// Threading, ownership, errors: see Transport. LocalRegions must be destroyed before the
// transport (checked). Create returns kUnavailable when UCX cannot start on the requested
// transports.
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <stop_token>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "kvtransfer/transport.h"
#include "kvtransfer/ucx/ucx_context.h"
#include "kvtransfer/ucx/ucx_endpoint.h"
#include "kvtransfer/ucx/ucx_memory.h"
#include "kvtransfer/ucx/ucx_worker.h"

namespace pdserve::kvtransfer {

// How RMA writes travel. ucp_put_nbx where UCX has transport-level RMA (shared memory,
// rc/dc); where it would only emulate put with active messages (tcp), kAuto sends the data
// in kvtransfer's own active messages instead, written into the region by the receiver's I/O
// thread after a bounds check against the memory it registered. Same copies as UCX's
// emulation, but the receiver never replies: with UCX 1.13 an emulated-put target that
// replies to a writer that just died aborts the whole process (ucp_request.inl "unexpected
// error"), i.e. a killed prefill could take its decode worker down.
enum class WriteProtocol : uint8_t { kAuto, kPut, kActiveMessage };

struct UcxTransportOptions {
  UcxContextOptions context;          // TLS / NET_DEVICES overrides
  WriteProtocol write_protocol = WriteProtocol::kAuto;
  uint64_t max_am_chunk_bytes = 1 << 20;  // per active message in kActiveMessage mode
  uint64_t max_chunk_bytes = 4 << 20;  // larger RMA ops are split
  uint32_t max_inflight_ops = 4;       // per peer
  uint32_t busy_poll_us = 200;         // spin this long after the last activity before sleeping
  // Allow endpoints without peer failure detection (needed for shared memory).
  bool allow_no_error_handling = true;
};

class UcxTransport final : public Transport {
 public:
  static Result<std::unique_ptr<UcxTransport>> Create(const UcxTransportOptions& options = {});
  ~UcxTransport() override;

  std::string_view backend_name() const override { return "ucx"; }
  const std::string& address() const override { return address_; }
  Result<std::unique_ptr<LocalRegion>> AllocateRegion(uint64_t bytes) override;
  Result<std::unique_ptr<LocalRegion>> RegisterRegion(void* data, uint64_t bytes) override;
  Status RegisterClient(uint16_t channel, MessageHandler on_message,
                        PeerFailureHandler on_peer_failure) override;
  void UnregisterClient(uint16_t channel) override;
  Status Submit(RmaKind kind, std::string_view peer, const RemoteRegionDesc& region,
                std::vector<RmaOp> ops, Deadline deadline, DoneCallback done) override;
  Status SendMessage(std::string_view peer, uint16_t channel, std::string payload,
                     bool flush_writes_first, Deadline deadline, DoneCallback done) override;
  void Connect(std::string_view peer) override;
  void Disconnect(std::string_view peer) override;
  TransportStats Stats() const override;

 private:
  class Region;
  struct Peer;
  struct Batch;
  struct Message;
  struct OpContext;
  struct Closing;
  struct Client {
    MessageHandler on_message;
    PeerFailureHandler on_peer_failure;
  };
  struct AmArg {  // what the active-message callback of one channel gets
    UcxTransport* self;
    uint16_t channel;
  };
  struct Counters {
    std::atomic<uint64_t> registered_regions{0}, peers{0}, remote_keys{0}, inflight_ops{0},
        pending_batches{0}, pending_messages{0}, bytes_written{0}, bytes_read{0},
        messages_sent{0}, messages_received{0}, rejected_writes{0};
  };

  UcxTransport(const UcxTransportOptions& options, std::unique_ptr<UcxContext> context,
               std::unique_ptr<UcxWorker> worker, int event_fd, int epoll_fd);
  void Post(std::function<void()> command);
  // Runs `fn` on the I/O thread and waits (inline when called from it).
  void RunSync(const std::function<void()>& fn);
  void Loop(std::stop_token stop);

  // ---- I/O thread only ----
  bool RunCommands();
  std::shared_ptr<Peer> GetPeer(const std::string& address, Status* error);
  bool Pump(Peer& peer);
  bool IssueRma(const std::shared_ptr<Peer>& peer, const std::shared_ptr<Batch>& batch);
  // WriteProtocol::kActiveMessage: one message carries up to max_am_chunk_bytes, gathering
  // consecutive ops (an iov) so that streamed layers of small blocks make few large messages.
  bool IssueAmWrite(const std::shared_ptr<Peer>& peer, const std::shared_ptr<Batch>& batch);
  bool PumpMessages(const std::shared_ptr<Peer>& peer);
  void FinishBatchIfDone(const std::shared_ptr<Batch>& batch);
  void FinishMessage(const std::shared_ptr<Message>& message, const Status& status);
  void SendAm(const std::shared_ptr<Peer>& peer, const std::shared_ptr<Message>& message);
  void ResetPeer(std::shared_ptr<Peer> peer, const Status& status, bool notify);  // by value: it may erase the caller's copy
  void CheckDeadlines(Deadline now);
  bool ProgressClosing(bool force_all);
  // Ends the batches with RMA still outstanding on `peer` (their late completions are ignored).
  void AbandonInflight(Peer& peer);
  Deadline NextDeadline() const;
  void Shutdown();
  static void OnRmaDone(void* request, ucs_status_t status, void* user_data);
  static void OnFlushDone(void* request, ucs_status_t status, void* user_data);
  static void OnAmSent(void* request, ucs_status_t status, void* user_data);
  static void OnEndpointError(void* arg, ucp_ep_h ep, ucs_status_t status);
  static ucs_status_t OnAmReceived(void* arg, const void* header, size_t header_length,
                                   void* data, size_t length, const ucp_am_recv_param_t* param);
  // Active-message writes (WriteProtocol::kActiveMessage): header = remote address.
  static ucs_status_t OnAmWrite(void* arg, const void* header, size_t header_length, void* data,
                                size_t length, const ucp_am_recv_param_t* param);
  static constexpr uint16_t kAmWriteId = kMaxChannels;
  static constexpr size_t kMaxAmWriteEntries = 256;  // header 4 KB (UCX 1.13 allows ~8 KB)

  const UcxTransportOptions options_;
  std::unique_ptr<UcxContext> context_;
  std::unique_ptr<UcxWorker> worker_;
  const std::string address_;
  const int event_fd_;
  const int epoll_fd_;
  Counters counters_;

  std::mutex mu_;
  std::deque<std::function<void()>> commands_;

  // I/O thread state.
  std::unordered_map<std::string, std::shared_ptr<Peer>> peers_;
  std::vector<std::shared_ptr<Peer>> failed_peers_;  // reported by OnEndpointError
  std::vector<std::shared_ptr<Batch>> active_batches_;
  std::vector<std::shared_ptr<Message>> active_messages_;
  std::vector<Closing> closing_;
  std::map<uint64_t, std::unique_ptr<RegisteredRegion>> regions_;
  uint64_t next_region_id_ = 1;
  Client clients_[kMaxChannels];
  AmArg am_args_[kMaxChannels];
  bool peer_mode_unreachable_ = false;  // shm peers: skip the failing PEER-mode attempt
  std::atomic<std::thread::id> io_thread_id_{};

  std::jthread thread_;  // last member: stopped and joined first
};

}  // namespace pdserve::kvtransfer
