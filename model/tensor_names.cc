#include "model/tensor_names.h"

#include <limits>
#include <string_view>

namespace pdserve::model {

namespace {

constexpr std::string_view kLayerPrefix = "model.layers.";
constexpr std::string_view kExpertKey = ".mlp.experts.";

// The decimal index at name[at...] followed by '.'; *end is set past the '.'.
Result<int64_t> IndexAt(const std::string& name, size_t at, const char* what, size_t* end) {
  size_t i = at;
  int64_t v = 0;
  constexpr int64_t kMax = std::numeric_limits<int32_t>::max();  // far above any real count
  while (i < name.size() && name[i] >= '0' && name[i] <= '9') {
    v = v * 10 + (name[i] - '0');
    if (v > kMax)
      return Status::InvalidArgument("tensor '" + name + "': " + what + " index too large");
    ++i;
  }
  if (i == at || i >= name.size() || name[i] != '.')
    return Status::InvalidArgument("tensor '" + name + "': expected a decimal " + what + " index followed by '.' at offset " +
                                   std::to_string(at));
  if (name[at] == '0' && i - at > 1)
    return Status::InvalidArgument("tensor '" + name + "': " + what + " index has a leading zero");
  *end = i + 1;
  return v;
}

}  // namespace

Result<TensorName> ParseTensorName(const std::string& name) {
  TensorName out;
  size_t end = 0;
  if (name.compare(0, kLayerPrefix.size(), kLayerPrefix) == 0) {
    PDSERVE_ASSIGN_OR_RETURN(out.layer, IndexAt(name, kLayerPrefix.size(), "layer", &end));
  }
  const size_t at = name.find(kExpertKey);
  if (at != std::string::npos) {
    if (out.layer < 0 || at + 1 != end)
      return Status::InvalidArgument("tensor '" + name + "': routed experts belong right under model.layers.<L>.");
    PDSERVE_ASSIGN_OR_RETURN(out.expert, IndexAt(name, at + kExpertKey.size(), "expert", &end));
  }
  return out;
}

}  // namespace pdserve::model
