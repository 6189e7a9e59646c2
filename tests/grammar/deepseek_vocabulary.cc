#include "tests/grammar/deepseek_vocabulary.h"

#include <gtest/gtest.h>

#include "tokenizer/token_table.h"
#include "tokenizer/tokenizer_paths.h"

namespace pdserve::grammar::testing {

const tokenizer::Tokenizer* DeepSeekTokenizer() {
  static auto* loaded = new Result<std::unique_ptr<tokenizer::Tokenizer>>(
      tokenizer::Tokenizer::Load(tokenizer::DefaultTokenizerDir()));
  if (!loaded->ok()) {
    ADD_FAILURE() << "cannot load the DeepSeek-V3 tokenizer (run scripts/setup.sh): " << loaded->status().ToString();
    return nullptr;
  }
  return loaded->value().get();
}

std::shared_ptr<const Vocabulary> DeepSeekVocabulary() {
  static std::shared_ptr<const Vocabulary> vocab = [] () -> std::shared_ptr<const Vocabulary> {
    const tokenizer::Tokenizer* tok = DeepSeekTokenizer();
    if (!tok) return nullptr;
    auto table = tokenizer::BuildTokenByteTable(*tok, kDeepSeekModelVocab);
    if (!table.ok()) return nullptr;
    auto v = Vocabulary::Create(std::move(table->bytes), std::move(table->is_text), table->stop_ids, table->vocab_size);
    return v.ok() ? *v : nullptr;
  }();
  if (!vocab) ADD_FAILURE() << "cannot build the DeepSeek grammar vocabulary";
  return vocab;
}

}  // namespace pdserve::grammar::testing
