#include "tokenizer/tokenizer_paths.h"

#include <cstdlib>
#include <filesystem>

#ifndef PDSERVE_SOURCE_DIR
#define PDSERVE_SOURCE_DIR "."
#endif

namespace pdserve::tokenizer {

std::string DefaultTokenizerDir() {
  if (const char* env = std::getenv("PDSERVE_TOKENIZER_DIR"); env != nullptr && env[0] != '\0')
    return env;
  constexpr const char* kRelative = "assets/tokenizer/deepseek_v3";
  std::error_code ec;
  if (std::filesystem::exists(std::filesystem::path(kRelative) / "tokenizer.json", ec)) return kRelative;
  return std::string(PDSERVE_SOURCE_DIR) + "/" + kRelative;
}

}  // namespace pdserve::tokenizer
