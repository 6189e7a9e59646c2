#include "kvtransfer/ucx/ucx_context.h"

#include <cstdlib>

#include <fmt/format.h>

#include "kvtransfer/ucx/ucx_status.h"

namespace pdserve::kvtransfer {

Status FromUcsStatus(ucs_status_t status, std::string_view what) {
  const std::string message = fmt::format("{}: {}", what, ucs_status_string(status));
  switch (status) {
    case UCS_OK:
      return Status::Ok();
    case UCS_ERR_CANCELED:
      return Status::Cancelled(message);
    case UCS_ERR_TIMED_OUT:
      return Status::DeadlineExceeded(message);
    case UCS_ERR_INVALID_PARAM:
    case UCS_ERR_INVALID_ADDR:
    case UCS_ERR_UNSUPPORTED:
      return Status::InvalidArgument(message);
    case UCS_ERR_NO_MEMORY:
    case UCS_ERR_NO_RESOURCE:
    case UCS_ERR_EXCEEDS_LIMIT:
      return Status::ResourceExhausted(message);
    case UCS_ERR_UNREACHABLE:
    case UCS_ERR_ENDPOINT_TIMEOUT:
    case UCS_ERR_CONNECTION_RESET:
    case UCS_ERR_REJECTED:
    case UCS_ERR_IO_ERROR:
    case UCS_ERR_NOT_CONNECTED:
    case UCS_ERR_NO_DEVICE:
    case UCS_ERR_SHMEM_SEGMENT:  // the peer's shared memory is gone with it
      return Status::Unavailable(message);
    default:
      return Status::Internal(message);
  }
}

Result<std::unique_ptr<UcxContext>> UcxContext::Create(const UcxContextOptions& options) {
  ucp_config_t* config = nullptr;
  ucs_status_t status = ucp_config_read(nullptr, nullptr, &config);
  if (status != UCS_OK) return FromUcsStatus(status, "ucp_config_read");
  auto modify = [&](const char* name, const std::string& value) -> Status {
    if (value.empty()) return Status::Ok();
    ucs_status_t s = ucp_config_modify(config, name, value.c_str());
    if (s != UCS_OK) {
      return Status::InvalidArgument(
          fmt::format("UCX config {}={}: {}", name, value, ucs_status_string(s)));
    }
    return Status::Ok();
  };
  Status modified = modify("TLS", options.tls);
  if (modified.ok()) modified = modify("NET_DEVICES", options.net_devices);
  for (const auto& [name, value] : options.defaults) {
    if (!modified.ok()) break;
    if (std::getenv(("UCX_" + name).c_str()) == nullptr) modified = modify(name.c_str(), value);
  }
  if (!modified.ok()) {
    ucp_config_release(config);
    return modified;
  }
  ucp_params_t params{};
  params.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_MT_WORKERS_SHARED;
  params.features = UCP_FEATURE_RMA | UCP_FEATURE_AM | UCP_FEATURE_WAKEUP;
  params.mt_workers_shared = 0;
  ucp_context_h context = nullptr;
  status = ucp_init(&params, config, &context);
  ucp_config_release(config);
  if (status != UCS_OK) {
    Status s = FromUcsStatus(status, fmt::format("ucp_init (TLS '{}')", options.tls));
    return Status::Unavailable(s.message());
  }
  return std::unique_ptr<UcxContext>(new UcxContext(context));
}

UcxContext::~UcxContext() {
  if (context_ != nullptr) ucp_cleanup(context_);
}

}  // namespace pdserve::kvtransfer
