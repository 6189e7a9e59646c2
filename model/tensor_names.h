// The structure of a DeepSeek-V3.2 checkpoint's tensor names, parsed in one place for the
// loader (model/weights.cc) and the converter (model/tools/convert.cc):
//
//   model.layers.<L>.<rest>                 a tensor of decoder layer L (L = num_hidden_layers
//                                           is the MTP layer, which inference ignores)
//   model.layers.<L>.mlp.experts.<E>.<rest> routed expert E of layer L
//   anything else                           a model-level tensor (embed_tokens, norm, lm_head)
//
// <L> and <E> are decimal without leading zeros (the names the loader looks up), each followed
// by '.'. A name that starts "model.layers." or holds ".mlp.experts." without such an index is
// malformed, as is an expert outside a decoder layer.
// Thread-safety: pure functions.
#pragma once

#include <cstdint>
#include <string>

#include "common/status.h"

namespace pdserve::model {

struct TensorName {
  int64_t layer = -1;   // L, or -1 for a model-level tensor
  int64_t expert = -1;  // E, or -1 for anything but a routed expert's tensor
};

// Errors: InvalidArgument naming the tensor and what is wrong with its name.
Result<TensorName> ParseTensorName(const std::string& name);

}  // namespace pdserve::model
