#include "kvtransfer/transport.h"

#include <functional>

#include <fmt/format.h>

namespace pdserve::kvtransfer {

std::string PeerName(std::string_view address) {
  return fmt::format("peer:{:016x}", std::hash<std::string_view>{}(address));
}

}  // namespace pdserve::kvtransfer
