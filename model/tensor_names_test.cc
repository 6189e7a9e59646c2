// Checkpoint tensor-name parsing (model/tensor_names.h): the layer and routed-expert indices of
// good names, and a clear error naming the tensor for malformed ones. To add a case: a name and
// its expected (layer, expert), or a bad name and a fragment of its error.
#include <gtest/gtest.h>

#include "model/tensor_names.h"

namespace pdserve::model {
namespace {

TEST(TensorNamesTest, GoodNames) {
  struct Case { const char* name; int64_t layer, expert; };
  const Case kCases[] = {
      {"model.embed_tokens.weight", -1, -1},
      {"lm_head.weight", -1, -1},
      {"model.norm.weight", -1, -1},
      {"model.layers.0.input_layernorm.weight", 0, -1},
      {"model.layers.61.self_attn.q_b_proj.weight_scale_inv", 61, -1},
      {"model.layers.3.mlp.gate.weight", 3, -1},
      {"model.layers.3.mlp.shared_experts.up_proj.weight", 3, -1},
      {"model.layers.3.mlp.experts.0.up_proj.weight", 3, 0},
      {"model.layers.12.mlp.experts.255.down_proj.weight_scale_inv", 12, 255},
      {"model.layers.10.mlp.experts.10.gate_proj.weight", 10, 10},
  };
  for (const Case& c : kCases) {
    const Result<TensorName> n = ParseTensorName(c.name);
    ASSERT_TRUE(n.ok()) << c.name << ": " << n.status().ToString();
    EXPECT_EQ(n->layer, c.layer) << c.name;
    EXPECT_EQ(n->expert, c.expert) << c.name;
  }
}

TEST(TensorNamesTest, BadNamesGiveAClearError) {
  struct Case { const char* name; const char* error; };
  const Case kCases[] = {
      {"model.layers.", "expected a decimal layer index"},
      {"model.layers.x.mlp.gate.weight", "expected a decimal layer index"},
      {"model.layers.3", "expected a decimal layer index"},
      {"model.layers.3mlp.weight", "expected a decimal layer index"},
      {"model.layers.-1.mlp.weight", "expected a decimal layer index"},
      {"model.layers.03.mlp.gate.weight", "layer index has a leading zero"},
      {"model.layers.99999999999999999999999.mlp.gate.weight", "layer index too large"},
      {"model.layers.1.mlp.experts.up_proj.weight", "expected a decimal expert index"},
      {"model.layers.1.mlp.experts.7", "expected a decimal expert index"},
      {"model.layers.1.mlp.experts.007.up_proj.weight", "expert index has a leading zero"},
      {"model.layers.1.mlp.experts.4294967296.up_proj.weight", "expert index too large"},
      {"model.mlp.experts.1.up_proj.weight", "routed experts belong right under model.layers.<L>."},
      {"model.layers.1.self_attn.mlp.experts.1.up_proj.weight", "routed experts belong right under"},
  };
  for (const Case& c : kCases) {
    const Result<TensorName> n = ParseTensorName(c.name);
    ASSERT_FALSE(n.ok()) << c.name;
    EXPECT_EQ(n.status().code(), StatusCode::kInvalidArgument) << c.name;
    const std::string text = n.status().ToString();
    EXPECT_NE(text.find(std::string("tensor '") + c.name + "'"), std::string::npos) << text;
    EXPECT_NE(text.find(c.error), std::string::npos) << text;
  }
}

}  // namespace
}  // namespace pdserve::model
