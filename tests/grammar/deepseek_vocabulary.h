// The grammar Vocabulary of the DeepSeek-V3 tokenizer with the model's 129,280-row vocabulary,
// built once per test process (what the services will do at start-up).
#pragma once

#include <memory>

#include "grammar/vocabulary.h"
#include "tokenizer/tokenizer.h"

namespace pdserve::grammar::testing {

constexpr int64_t kDeepSeekModelVocab = 129280;

// Null (with a test failure) when the tokenizer assets are missing.
const tokenizer::Tokenizer* DeepSeekTokenizer();
std::shared_ptr<const Vocabulary> DeepSeekVocabulary();

}  // namespace pdserve::grammar::testing
