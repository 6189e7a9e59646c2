// Small socket helpers shared by the services' listeners.
//
// Thread-safety: pure functions.
#pragma once

#include <string>

namespace pdserve::services {

// Why HOST:PORT cannot be listened on, found by trying to bind it the way our listeners do
// (SO_REUSEADDR, no SO_REUSEPORT): "address in use (another process listens there)",
// "cannot assign requested address (no interface has HOST)", or the OS error text. Used to turn a
// library's bare "bind failed" into a message an operator can act on.
std::string DescribeListenFailure(const std::string& host, int port);

}  // namespace pdserve::services
