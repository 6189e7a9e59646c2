// Test helpers shared by the tokenizer unit tests (not part of the library).
#pragma once

#include <memory>
#include <string>

#include <gtest/gtest.h>

#include "tokenizer/tokenizer.h"
#include "tokenizer/tokenizer_paths.h"

namespace pdserve::tokenizer::testing {

// The DeepSeek-V3 tokenizer from the default directory, loaded once per test process.
// Fails the calling test (fatally) when the files are missing: run scripts/setup.sh.
inline const Tokenizer* DeepSeek() {
  static const Result<std::unique_ptr<Tokenizer>>* loaded =
      new Result<std::unique_ptr<Tokenizer>>(Tokenizer::Load(DefaultTokenizerDir()));
  if (!loaded->ok()) {
    ADD_FAILURE() << "cannot load the DeepSeek-V3 tokenizer (run scripts/setup.sh): "
                  << loaded->status().ToString();
    return nullptr;
  }
  return loaded->value().get();
}

}  // namespace pdserve::tokenizer::testing

#define PDSERVE_DEEPSEEK_OR_FAIL(var)                                     \
  const ::pdserve::tokenizer::Tokenizer* var = ::pdserve::tokenizer::testing::DeepSeek(); \
  if (var == nullptr) return
