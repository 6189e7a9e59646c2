// ModelShape: KV bytes per token agree with the engine's own layout (model/kv_layout.h) for
// every format, and the official DeepSeek-V3.2-Exp config gives its published sizes.
#include "planner/model_shape.h"

#include <gtest/gtest.h>

#include "model/kv_layout.h"
#include "model/tools/make_model.h"
#include "planner/plan.h"

namespace pdserve::planner {
namespace {

model::ModelConfig V32() {
  auto c = LoadModelConfig(std::string(PDSERVE_PLANNER_TESTDATA) + "/deepseek-v3.2-exp");
  EXPECT_TRUE(c.ok()) << c.status().ToString();
  return c.value();
}

TEST(ModelShapeTest, KvBytesMatchTheEngineLayoutForEveryFormat) {
  const std::vector<model::ModelConfig> configs = {model::PresetConfig("small", 0).value(),
                                                   model::PresetConfig("tiny", 0).value(), V32()};
  for (const auto& c : configs)
    for (const char* latent : {"fp8", "bf16", "int8"})
      for (const char* index : {"fp8", "int8"}) {
        auto shape = ModelShape::Create(c, WeightFormat::kBf16, ParseKvFormat(latent).value(),
                                        ParseIndexKeyFormat(index).value());
        ASSERT_TRUE(shape.ok());
        const auto layout = model::KvLayoutFor(c, 64, ParseLatentFormat(latent).value(),
                                                ParseIndexFormat(index).value());
        const auto token_bytes = static_cast<int64_t>(layout.TokenBytesPerLayer());
        EXPECT_EQ(shape->KvBytesPerTokenLayer(), token_bytes) << latent << "/" << index;
        EXPECT_EQ(shape->KvBytesPerToken(), token_bytes * c.num_hidden_layers);
      }
}

TEST(ModelShapeTest, DeepSeekV32Sizes) {
  const model::ModelConfig c = V32();
  EXPECT_EQ(c.weight_format, "fp8");
  auto s = ModelShape::Create(c, WeightFormat::kBf16, KvFormat::kFp8, KvFormat::kFp8);
  ASSERT_TRUE(s.ok());
  // 671B in the main model (the MTP layer is not served) and ~37B active per token.
  EXPECT_NEAR(s->TotalParams() / 1e9, 671.0, 2.0);
  EXPECT_NEAR(s->ActiveParams() / 1e9, 37.5, 1.5);
  // The indexer adds ~0.85B parameters (the seeds' figure).
  double indexer = 0;
  for (const auto& m : s->attention)
    if (m.name.rfind("indexer.", 0) == 0) indexer += m.Params() * c.num_hidden_layers;
  EXPECT_NEAR(indexer / 1e9, 0.85, 0.03);
  // fp8 latent + fp8 keys: 656 + 132 B per token and layer.
  EXPECT_EQ(s->KvBytesPerTokenLayer(), 788);
  EXPECT_EQ(s->KvBytesPerToken(), 788 * 61);
  // The seeds: an indexer-key cache of 4 x 64K tokens per rank is ~4 GB in BF16, ~2 GB in int8.
  auto bf16 = ModelShape::Create(c, WeightFormat::kBf16, KvFormat::kBf16, KvFormat::kBf16).value();
  const double tokens = 4.0 * 65536;
  EXPECT_NEAR(tokens * static_cast<double>(bf16.IndexerBytesPerToken()) / 1e9, 4.09, 0.01);
  auto c8 = ModelShape::Create(c, WeightFormat::kW8a8, KvFormat::kInt8, KvFormat::kInt8).value();
  EXPECT_NEAR(tokens * static_cast<double>(c8.IndexerBytesPerToken()) / 1e9, 2.11, 0.01);
}

TEST(ModelShapeTest, WeightBytesPerRank) {
  const model::ModelConfig c = V32();
  auto bf16 = ModelShape::Create(c, WeightFormat::kBf16, KvFormat::kFp8, KvFormat::kFp8).value();
  auto w8 = ModelShape::Create(c, WeightFormat::kW8a8, KvFormat::kFp8, KvFormat::kFp8).value();
  auto fp8 = ModelShape::Create(c, WeightFormat::kFp8, KvFormat::kFp8, KvFormat::kFp8).value();
  auto fp8_cpu = ModelShape::Create(c, WeightFormat::kFp8, KvFormat::kFp8, KvFormat::kFp8, /*fp8_native=*/false).value();
  // One rank holding everything: ~1.34 TB in BF16 (the seeds' "~1.3 TB").
  EXPECT_NEAR(bf16.WeightBytesPerRank(1, 1) / 1e12, 1.34, 0.02);
  EXPECT_NEAR(fp8_cpu.WeightBytesPerRank(1, 1), bf16.WeightBytesPerRank(1, 1), 1.0);
  EXPECT_TRUE(fp8_cpu.fp8_dequantized);
  EXPECT_LT(fp8.WeightBytesPerRank(1, 1), 0.52 * bf16.WeightBytesPerRank(1, 1));
  // W8A8 quantizes the experts, q_b, o and the indexer's wq_b: the bulk.
  EXPECT_LT(w8.WeightBytesPerRank(1, 1), 0.53 * bf16.WeightBytesPerRank(1, 1));
  // Experts split over EP; o_proj / q_b / kv_b / lm_head / embedding split over TP.
  EXPECT_LT(bf16.WeightBytesPerRank(1, 32), bf16.WeightBytesPerRank(1, 16));
  EXPECT_LT(bf16.WeightBytesPerRank(2, 32), bf16.WeightBytesPerRank(1, 32));
  const double experts = bf16.routed.Bytes() * 58;
  EXPECT_NEAR(bf16.WeightBytesPerRank(1, 1) - bf16.WeightBytesPerRank(1, 2), experts / 2, 1.0);
}

// kv_b is held twice where it stays BF16 (row-major, and per head prepacked for decode: W_uk
// transposed and W_uv, model/weights.cc), once where the hardware multiplies it in fp8; every
// other matrix once.
TEST(ModelShapeTest, Bf16KvBCountsItsPrepackedHeadCopies) {
  const model::ModelConfig c = V32();
  const double kv_b_bytes = 61.0 * 128 * (128 + 128) * 512 * 2;
  for (WeightFormat f : {WeightFormat::kBf16, WeightFormat::kW8a8}) {
    auto shape = ModelShape::Create(c, f, KvFormat::kFp8, KvFormat::kFp8).value();
    double once = 0;
    for (MatrixSpec m : shape.attention) {
      EXPECT_EQ(m.held_copies, m.name == "kv_b_proj" ? 2.0 : 1.0) << m.name;
      once += m.Bytes() * 61;
    }
    double held_attention = 0;
    for (const MatrixSpec& m : shape.attention) held_attention += m.Bytes() * m.held_copies * 61;
    EXPECT_NEAR(held_attention - once, kv_b_bytes, 1.0) << WeightFormatName(f);
    // Under TP the copies split by heads like kv_b itself.
    auto tp2 = shape;
    for (MatrixSpec& m : tp2.attention) m.held_copies = 1.0;
    EXPECT_NEAR(shape.WeightBytesPerRank(2, 1) - tp2.WeightBytesPerRank(2, 1), kv_b_bytes / 2, 1.0);
  }
  auto fp8 = ModelShape::Create(c, WeightFormat::kFp8, KvFormat::kFp8, KvFormat::kFp8).value();
  for (const MatrixSpec& m : fp8.attention) EXPECT_EQ(m.held_copies, 1.0) << m.name;
}

TEST(ModelShapeTest, FormatNamesParse) {
  EXPECT_FALSE(ParseKvFormat("fp16").ok());
  EXPECT_FALSE(ParseWeightFormat("int4").ok());
  EXPECT_EQ(ParseIndexKeyFormat("bf16").value(), KvFormat::kBf16);
  EXPECT_EQ(ParseKvFormat("c8").value(), KvFormat::kInt8);
}

}  // namespace
}  // namespace pdserve::planner
