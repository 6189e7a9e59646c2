// PreTokenizer: splits normalized text into the pieces BPE runs on, as tokenizer.json's
// "pre_tokenizer" declares. Supported types (anything else is Unimplemented at load):
//   Sequence   stages applied in order, each to every piece of the previous stage
//   Split      regex or literal pattern; behaviors Isolated, Removed, MergedWithPrevious,
//              MergedWithNext, Contiguous; invert
//   ByteLevel  optional GPT-2 regex split and prefix space. The byte -> character mapping
//              itself is implicit: BPE works on raw bytes (see BpeModel).
//   Digits     digits isolated one by one or grouped
// Split semantics follow the Rust tokenizers library; for the Isolated behavior they equal the
// JS reference. An empty regex match advances one character, as JS's matchAll does.
//
// Thread-safety: immutable after FromJson(); Split() may be called from any thread.
#pragma once

#include <memory>

#include <nlohmann/json_fwd.hpp>

#include "common/status.h"
#include "tokenizer/pieces.h"
#include "tokenizer/regex.h"

namespace pdserve::tokenizer {

class PreTokenizer {
 public:
  virtual ~PreTokenizer() = default;

  // Splits every piece of `in` and appends the results, in order, to *out (never empty views).
  // REQUIRES: pieces are valid UTF-8. Errors: ResourceExhausted when a regex hits a PCRE2 limit.
  virtual Status Split(const Pieces& in, Pieces* out, PieceArena* arena) const = 0;

  // True when the pipeline includes a ByteLevel stage (required for byte-level BPE).
  virtual bool HasByteLevel() const { return false; }

  // Builds the pre-tokenizer a tokenizer.json "pre_tokenizer" value describes; null JSON gives
  // nullptr (no splitting). Errors: InvalidArgument (malformed), Unimplemented (unknown type).
  static Result<std::unique_ptr<PreTokenizer>> FromJson(const nlohmann::json& config,
                                                        RegexDialect dialect);
};

}  // namespace pdserve::tokenizer
