// UcxWorker: RAII owner of a ucp_worker_h (single-threaded mode) and its wakeup file
// descriptor and address.
//
// Thread-safety: only the thread that owns the worker (the UcxTransport I/O thread) may call
// anything but address() after creation; creation and destruction happen while no other
// thread uses it. Move-only. Must be destroyed before its UcxContext.
// Errors: Create returns kUnavailable / kInternal with the UCX reason.
#pragma once

#include <memory>
#include <string>

#include <ucp/api/ucp.h>

#include "common/status.h"
#include "kvtransfer/ucx/ucx_context.h"

namespace pdserve::kvtransfer {

class UcxWorker {
 public:
  static Result<std::unique_ptr<UcxWorker>> Create(UcxContext* context);
  ~UcxWorker();
  UcxWorker(const UcxWorker&) = delete;
  UcxWorker& operator=(const UcxWorker&) = delete;

  ucp_worker_h get() const { return worker_; }
  // The file descriptor that becomes readable when ucp_worker_arm'ed work arrives.
  int event_fd() const { return event_fd_; }
  // The packed worker address peers connect to.
  const std::string& address() const { return address_; }

 private:
  UcxWorker(ucp_worker_h worker, int event_fd, std::string address)
      : worker_(worker), event_fd_(event_fd), address_(std::move(address)) {}
  ucp_worker_h worker_;
  int event_fd_;
  std::string address_;
};

}  // namespace pdserve::kvtransfer
