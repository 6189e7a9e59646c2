#include "tokenizer/stream_detokenizer.h"

namespace pdserve::tokenizer {

Result<std::string> StreamDetokenizer::Push(int32_t id) {
  PDSERVE_ASSIGN_OR_RETURN(std::string_view bytes, tokenizer_.TokenBytes(id, options_.skip_special_tokens));
  ++tokens_seen_;
  std::string text;
  decoder_.Feed(bytes, &text);
  return text;
}

std::string StreamDetokenizer::Finish() {
  std::string text;
  decoder_.Finish(&text);
  tokens_seen_ = 0;
  return text;
}

}  // namespace pdserve::tokenizer
