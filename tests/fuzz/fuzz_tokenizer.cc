// libFuzzer target: tokenizer.json loading (tokenizer/tokenizer.h). A file that loads is then
// used: encode a fixed text (with and without special tokens) and decode the ids back.
#include <cstdint>
#include <string_view>

#include "tokenizer/tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view json(reinterpret_cast<const char*>(data), size);
  pdserve::tokenizer::TokenizerOptions options;
  options.cache_capacity = 16;
  auto t = pdserve::tokenizer::Tokenizer::FromJson(json, "", options);
  if (!t.ok()) return 0;
  for (bool special : {true, false}) {
    auto ids = (*t)->Encode("Hello, world! 12345 <s>ab\n\t\xc3\xa9\xe4\xb8\xad", {false, special});
    if (ids.ok()) (void)(*t)->Decode(*ids, {.skip_special_tokens = special});
  }
  return 0;
}
