// libFuzzer target: the safetensors header parser (model/safetensors.h) on arbitrary bytes.
// Every input must give a Status or tensors whose bytes lie inside the input.
#include <cstdint>
#include <cstdlib>

#include "model/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto parsed = pdserve::model::SafetensorsFile::ParseHeader(data, size, "fuzz.safetensors");
  if (!parsed.ok()) return 0;
  for (const auto& [name, t] : parsed.value()) {
    // The parser promises every tensor lies inside the file: touch its first and last byte.
    if (t.n_bytes == 0) continue;
    if (t.data < data || t.data + t.n_bytes > data + size) std::abort();
    volatile uint8_t first = t.data[0], last = t.data[t.n_bytes - 1];
    (void)first;
    (void)last;
  }
  return 0;
}
