// Mapping of UCX status codes to pdserve::Status (by what the caller should do next).
// Thread-safety: pure function.
#pragma once

#include <string_view>

#include <ucs/type/status.h>

#include "common/status.h"

namespace pdserve::kvtransfer {

// `what` names the failed operation ("ucp_put_nbx to <peer>").
Status FromUcsStatus(ucs_status_t status, std::string_view what);

}  // namespace pdserve::kvtransfer
