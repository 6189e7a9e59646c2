// TokenByteTable: what every token id adds to the output text, as raw bytes, for code that
// matches output token by token (the structured-output grammar's Vocabulary, built by the
// services from this table: grammar/ and tokenizer/ do not depend on each other).
//
// For DeepSeek-V3: ids 0..128814 (id_limit) with their decode bytes; special tokens (BOS, EOS,
// placeholders, <|EOT|>) are not text; added tokens that are not special (<｜User｜>, the tool
// markers, <think> in V3.2's tokenizer) are text, spelled by their content. EOS is the stop id.
// Ids from id_limit up to the model's vocabulary (129,280 rows) have no bytes.
//
// Thread-safety: pure function over an immutable Tokenizer.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"
#include "tokenizer/tokenizer.h"

namespace pdserve::tokenizer {

struct TokenByteTable {
  std::vector<std::string> bytes;  // per id < tokenizer id_limit(); empty for holes
  std::vector<uint8_t> is_text;    // 1: ordinary text token; 0: special token or hole
  std::vector<int32_t> stop_ids;   // end-of-sequence ids
  int64_t vocab_size = 0;          // the model's vocabulary (>= id_limit)
};

// Errors: InvalidArgument when model_vocab_size < tok.id_limit(); FailedPrecondition when the
// tokenizer has no EOS token.
Result<TokenByteTable> BuildTokenByteTable(const Tokenizer& tok, int64_t model_vocab_size);

}  // namespace pdserve::tokenizer
