// libFuzzer target: the OpenAI request parser (services/router/openai_request.h) on arbitrary
// HTTP bodies. The first byte picks the endpoint (completions / chat); the rest is the body.
#include <cstdint>
#include <string_view>

#include "services/router/openai_request.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  using pdserve::router::ApiEndpoint;
  const ApiEndpoint endpoint = (data[0] & 1) ? ApiEndpoint::kChat : ApiEndpoint::kCompletions;
  const std::string_view body(reinterpret_cast<const char*>(data + 1), size - 1);
  pdserve::router::ParsedRequest request;
  if (auto error = pdserve::router::ParseRequest(endpoint, body, &request)) {
    (void)error->Body();  // the 400 reply must render
  }
  return 0;
}
