// UcxEndpoint: RAII owner of a ucp_ep_h connected to a peer's worker address, plus
// UcxRemoteKey, the RAII owner of a remote key unpacked for that endpoint.
//
// Error handling: endpoints ask for UCP_ERR_HANDLING_MODE_PEER (a dead peer fails outstanding
// requests and calls the error callback). UCX's shared-memory transports cannot do that (it
// makes ucp_ep_create fail with "unreachable"), so Create falls back to
// UCP_ERR_HANDLING_MODE_NONE when allowed; peer_error_handling() says which one is active.
// Without it, a dead peer is only noticed by deadlines.
//
// Closing: StartClose hands the close request to the caller (UcxTransport progresses it
// without blocking its loop); the destructor closes synchronously (bounded) if the caller did
// not. Remote keys are destroyed once no operation using them is outstanding.
//
// Thread-safety: the I/O thread that owns the worker only. Move-only.
// Errors: Create returns kUnavailable when the peer's address is unreachable.
#pragma once

#include <memory>
#include <string>

#include <ucp/api/ucp.h>

#include "common/status.h"
#include "kvtransfer/ucx/ucx_worker.h"

namespace pdserve::kvtransfer {

class UcxEndpoint {
 public:
  // `on_error(arg, ep, status)` runs on the worker thread during ucp_worker_progress.
  // try_peer_mode=false goes straight to UCP_ERR_HANDLING_MODE_NONE (allowed only with
  // allow_no_error_handling).
  static Result<std::unique_ptr<UcxEndpoint>> Create(UcxWorker* worker,
                                                     const std::string& peer_address,
                                                     bool try_peer_mode,
                                                     bool allow_no_error_handling,
                                                     ucp_err_handler_cb_t on_error, void* arg);
  ~UcxEndpoint();
  UcxEndpoint(const UcxEndpoint&) = delete;
  UcxEndpoint& operator=(const UcxEndpoint&) = delete;

  ucp_ep_h get() const { return ep_; }
  bool peer_error_handling() const { return peer_error_handling_; }
  // True when UCX selected transport-level RMA (shared memory, rc/dc) for this endpoint;
  // false when ucp_put_nbx would be emulated with active messages (tcp). Read from the
  // endpoint's configuration (ucp_ep_print_info lists "put[...]" protocols only then).
  bool native_rma() const { return native_rma_; }
  // Starts closing (forcefully when peer error handling is on: outstanding requests complete
  // with UCS_ERR_CANCELED). Returns the request to progress (nullptr if already done). The
  // endpoint must not be used afterwards.
  ucs_status_ptr_t StartClose();

 private:
  UcxEndpoint(UcxWorker* worker, ucp_ep_h ep, bool peer_error_handling, bool native_rma)
      : worker_(worker), ep_(ep), peer_error_handling_(peer_error_handling),
        native_rma_(native_rma) {}
  UcxWorker* const worker_;
  ucp_ep_h ep_;
  const bool peer_error_handling_;
  const bool native_rma_;
};

class UcxRemoteKey {
 public:
  static Result<std::unique_ptr<UcxRemoteKey>> Unpack(UcxEndpoint* endpoint,
                                                      const std::string& packed_key);
  ~UcxRemoteKey();
  UcxRemoteKey(const UcxRemoteKey&) = delete;
  UcxRemoteKey& operator=(const UcxRemoteKey&) = delete;

  ucp_rkey_h get() const { return rkey_; }

 private:
  explicit UcxRemoteKey(ucp_rkey_h rkey) : rkey_(rkey) {}
  ucp_rkey_h rkey_;
};

}  // namespace pdserve::kvtransfer
