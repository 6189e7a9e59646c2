// UcxContext: RAII owner of a ucp_context_h (ucp_init / ucp_cleanup), created with the RMA,
// active-message and wakeup features kvtransfer needs.
//
// Configuration comes from the UCX_* environment, with optional overrides (TLS, NET_DEVICES)
// applied through ucp_config_modify, so one process can open contexts on different
// transports (the benchmark measures shm and tcp in one run).
//
// Thread-safety: created and destroyed by one thread; the context is used only by the
// UcxTransport I/O thread in between. Move-only.
// Errors: Create returns kUnavailable when UCX cannot start with the given transports,
// kInvalidArgument for an unknown configuration value.
#pragma once

#include <map>
#include <memory>
#include <string>

#include <ucp/api/ucp.h>

#include "common/status.h"

namespace pdserve::kvtransfer {

struct UcxContextOptions {
  std::string tls;          // UCX_TLS override, e.g. "tcp", "shm" ("" = environment)
  std::string net_devices;  // UCX_NET_DEVICES override, e.g. "lo" ("" = environment)
  // Further settings (names without the UCX_ prefix, e.g. {"TCP_TX_SEG_SIZE", "256k"}),
  // applied unless the environment sets them.
  std::map<std::string, std::string> defaults;
};

class UcxContext {
 public:
  static Result<std::unique_ptr<UcxContext>> Create(const UcxContextOptions& options);
  ~UcxContext();
  UcxContext(const UcxContext&) = delete;
  UcxContext& operator=(const UcxContext&) = delete;

  ucp_context_h get() const { return context_; }

 private:
  explicit UcxContext(ucp_context_h context) : context_(context) {}
  ucp_context_h context_;
};

}  // namespace pdserve::kvtransfer
