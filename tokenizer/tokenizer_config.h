// TokenizerConfig: the parts of a Hugging Face tokenizer_config.json pdserve uses: the names of
// the BOS/EOS/PAD tokens and the chat template text. The file is optional; without it these
// stay empty.
//
// Thread-safety: a plain value type.
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include "common/status.h"

namespace pdserve::tokenizer {

struct TokenizerConfig {
  std::string bos_token;  // content, e.g. "<｜begin▁of▁sentence｜>"; empty when not declared
  std::string eos_token;
  std::string pad_token;
  bool add_bos_token = false;                // as declared (informational: Encode adds none)
  std::optional<std::string> chat_template;  // the Jinja source, when present

  // Parses tokenizer_config.json text. Token entries may be strings or AddedToken objects
  // ({"content": ...}); a template list picks the entry named "default".
  // Errors: InvalidArgument for malformed JSON or wrongly typed fields.
  static Result<TokenizerConfig> FromJsonText(std::string_view text);

 private:
  static Result<TokenizerConfig> Parse(std::string_view text);
};

}  // namespace pdserve::tokenizer
