// libFuzzer target: control-plane message decoding (services/control/control_codec.h) on
// arbitrary bytes. A message that decodes must encode again, and encoding is then stable:
// encode(decode(encode(m))) == encode(m).
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "services/control/control_codec.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace pdserve::services;
  auto message = DecodeControlMessage(std::string_view(reinterpret_cast<const char*>(data), size));
  if (!message.ok()) return 0;
  auto encoded = EncodeControlMessage(*message);
  if (!encoded.ok()) std::abort();  // the decoder accepted what the encoder refuses
  auto again = DecodeControlMessage(*encoded);
  if (!again.ok()) std::abort();
  auto encoded_again = EncodeControlMessage(*again);
  if (!encoded_again.ok() || *encoded_again != *encoded) std::abort();
  return 0;
}
