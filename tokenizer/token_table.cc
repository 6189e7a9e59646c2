#include "tokenizer/token_table.h"

namespace pdserve::tokenizer {

Result<TokenByteTable> BuildTokenByteTable(const Tokenizer& tok, int64_t model_vocab_size) {
  if (model_vocab_size < tok.id_limit())
    return Status::InvalidArgument("model vocabulary " + std::to_string(model_vocab_size) +
                                   " is smaller than the tokenizer's " + std::to_string(tok.id_limit()));
  if (!tok.eos_id()) return Status::FailedPrecondition("the tokenizer declares no EOS token");
  TokenByteTable t;
  t.vocab_size = model_vocab_size;
  t.bytes.resize(static_cast<size_t>(tok.id_limit()));
  t.is_text.assign(static_cast<size_t>(tok.id_limit()), 0);
  for (int32_t id = 0; id < tok.id_limit(); ++id) {
    if (!tok.IsValidId(id)) continue;
    auto b = tok.TokenBytes(id, /*skip_special=*/false);
    if (!b.ok()) return b.status();
    t.bytes[static_cast<size_t>(id)] = std::string(*b);
    t.is_text[static_cast<size_t>(id)] = !tok.IsSpecial(id) && !b->empty();
  }
  t.stop_ids = {*tok.eos_id()};
  return t;
}

}  // namespace pdserve::tokenizer
