#include "engine/block_hash.h"

#include <xxhash.h>

#include <string>

#include "common/check.h"

namespace pdserve::engine {

uint64_t KvNamespace(const KvNamespaceInputs& in) {
  PDSERVE_CHECK(in.config != nullptr, "KvNamespace needs the model config");
  // One line of text, versioned, so a later change of the rule gives other names.
  std::string text = "pdserve-prefix-cache-v1\nmodel=" + std::to_string(in.model_identity) +
                     "\nconfig=" + in.config->ToJson().dump() + "\nweights=" + in.config->weight_format +
                     "\nlayout=" + in.layout.ToString() + "\nfirst_chunk=" + std::to_string(in.first_chunk_tokens) +
                     "\nplan=cp" + std::to_string(in.cp) + ",tp" + std::to_string(in.tp) + ",ep" + std::to_string(in.ep);
  const uint64_t h = XXH3_64bits(text.data(), text.size());
  return h == 0 ? 1 : h;
}

}  // namespace pdserve::engine
