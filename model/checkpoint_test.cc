// Loader tests: valid checkpoints load (BF16 and FP8 with 128x128 scales); malformed ones are
// refused with an error naming the file and the problem. To add a case: start from a
// make-model checkpoint, break one thing, and assert on the message.
#include <gtest/gtest.h>

#include <fstream>

#include "common/dtype.h"
#include "common/mapped_file.h"
#include "model/checkpoint.h"
#include "model/test_util.h"
#include "model/weights.h"

namespace pdserve::model {
namespace {

using testing::TempDir;

void MakeTiny(const std::string& dir, const std::string& dtype = "bf16") {
  MakeModelOptions o;
  o.preset = "tiny";
  o.out_dir = dir;
  o.seed = 7;
  o.dtype = dtype;
  ASSERT_TRUE(MakeModel(o).ok());
}

std::string FirstShard(const std::string& dir) { return dir + "/model-00001-of-00008.safetensors"; }

void EditJson(const std::string& path, const std::function<void(nlohmann::json&)>& edit) {
  auto text = ReadFileToString(path);
  ASSERT_TRUE(text.ok());
  auto j = nlohmann::json::parse(*text);
  edit(j);
  ASSERT_TRUE(WriteStringToFile(path, j.dump()).ok());
}

// Rewrites the shard holding `name` without that tensor (and drops it from the index).
void RemoveTensor(const std::string& dir, const std::string& name) {
  auto index_text = ReadFileToString(dir + "/model.safetensors.index.json");
  ASSERT_TRUE(index_text.ok());
  auto index = nlohmann::json::parse(*index_text);
  const std::string shard = index["weight_map"][name];
  std::vector<TensorToWrite> keep;
  {
    auto f = SafetensorsFile::Open(dir + "/" + shard);
    ASSERT_TRUE(f.ok());
    for (const auto& [n, t] : (*f)->tensors())
      if (n != name) keep.push_back({n, t.dtype, t.shape, std::vector<uint8_t>(t.data, t.data + t.n_bytes)});
  }
  ASSERT_TRUE(WriteSafetensors(dir + "/" + shard, keep).ok());
  index["weight_map"].erase(name);
  ASSERT_TRUE(WriteStringToFile(dir + "/model.safetensors.index.json", index.dump()).ok());
}

std::string LoadError(const std::string& dir) {
  auto w = ModelWeights::Load(dir);
  EXPECT_FALSE(w.ok());
  return w.ok() ? "" : w.status().ToString();
}

TEST(CheckpointTest, TinyLoadsFromShardsWithIndex) {
  TempDir d("ckpt_ok");
  MakeTiny(d.path());
  auto w = ModelWeights::Load(d.path());
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  EXPECT_EQ((*w)->config().num_hidden_layers, 3);
  EXPECT_TRUE((*w)->layer(1).is_moe);
  EXPECT_EQ((*w)->layer(1).experts.size(), 8u);
}

TEST(CheckpointTest, Fp8WeightsDequantizeWithBlockScales) {
  TempDir d("ckpt_fp8");
  MakeTiny(d.path(), "fp8");
  auto ckpt = Checkpoint::Open(d.path());
  ASSERT_TRUE(ckpt.ok()) << ckpt.status().ToString();
  // kv_a_proj_with_mqa is [Lkv+dr=192, D=256]: 2x2 blocks, the lower row block partial.
  const std::string name = "model.layers.0.self_attn.kv_a_proj_with_mqa.weight";
  const TensorInfo* t = (*ckpt)->Find(name);
  const TensorInfo* s = (*ckpt)->Find(name + "_scale_inv");
  ASSERT_TRUE(t && s);
  ASSERT_EQ(t->dtype, DType::kF8E4M3);
  ASSERT_EQ(s->shape, (std::vector<int64_t>{2, 2}));
  LoadOptions rows;  // the row-major dequantized matrix (not prepacked for the GEMMs)
  rows.pack_bf16 = false;
  auto w = ModelWeights::Load(d.path(), rows);
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  const auto& view = (*w)->layer(0).kv_a.view;
  ASSERT_EQ(view.dtype, DType::kBF16);
  const float* scale = reinterpret_cast<const float*>(s->data);
  const uint16_t* got = static_cast<const uint16_t*>(view.data);
  for (int64_t i : {0, 127, 128, 191})
    for (int64_t j : {0, 5, 128, 255}) {
      const float want = RoundToBf16(Fp8E4M3ToF32(t->data[i * 256 + j]) * scale[(i / 128) * 2 + j / 128]);
      EXPECT_EQ(Bf16ToF32(got[i * 256 + j]), want) << i << "," << j;
    }
}

TEST(CheckpointTest, BadHeaderLength) {
  TempDir d("ckpt_hdr");
  MakeTiny(d.path());
  {
    std::fstream f(FirstShard(d.path()), std::ios::in | std::ios::out | std::ios::binary);
    const uint64_t huge = 1ull << 40;
    f.write(reinterpret_cast<const char*>(&huge), 8);
  }
  const std::string e = LoadError(d.path());
  EXPECT_NE(e.find("header length"), std::string::npos) << e;
  EXPECT_NE(e.find("model-00001-of-00008.safetensors"), std::string::npos) << e;
}

TEST(CheckpointTest, InvalidHeaderJson) {
  TempDir d("ckpt_json");
  MakeTiny(d.path());
  {
    std::fstream f(FirstShard(d.path()), std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(8);
    f.write("}}}", 3);
  }
  EXPECT_NE(LoadError(d.path()).find("not a valid JSON"), std::string::npos);
}

TEST(CheckpointTest, OffsetsOutsideTheFile) {
  TempDir d("ckpt_off");
  const std::string path = d / "model.safetensors";
  // A hand-made file whose only tensor claims bytes past the end.
  std::string header = R"({"w":{"dtype":"BF16","shape":[4,4],"data_offsets":[0,32]}})";
  std::string bytes(8, '\0');
  const uint64_t n = header.size();
  std::memcpy(bytes.data(), &n, 8);
  bytes += header + std::string(16, '\0');
  ASSERT_TRUE(WriteStringToFile(path, bytes).ok());
  auto f = SafetensorsFile::Open(path);
  ASSERT_FALSE(f.ok());
  EXPECT_NE(f.status().message().find("outside the data region"), std::string::npos) << f.status().ToString();
  EXPECT_NE(f.status().message().find("tensor 'w'"), std::string::npos);
  // Size that disagrees with shape x dtype.
  header = R"({"w":{"dtype":"BF16","shape":[4,4],"data_offsets":[0,16]}})";
  bytes.assign(8, '\0');
  const uint64_t n2 = header.size();
  std::memcpy(bytes.data(), &n2, 8);
  bytes += header + std::string(32, '\0');
  ASSERT_TRUE(WriteStringToFile(path, bytes).ok());
  f = SafetensorsFile::Open(path);
  ASSERT_FALSE(f.ok());
  EXPECT_NE(f.status().message().find("shape x dtype needs 32"), std::string::npos) << f.status().ToString();
}

TEST(CheckpointTest, ShapeNotWhatConfigImplies) {
  TempDir d("ckpt_shape");
  MakeTiny(d.path());
  EditJson(d / "config.json", [](nlohmann::json& j) { j["q_lora_rank"] = 96; });
  const std::string e = LoadError(d.path());
  EXPECT_NE(e.find("model.layers.0.self_attn.q_a_proj.weight' has shape [128, 256], config implies [96, 256]"),
            std::string::npos) << e;
}

TEST(CheckpointTest, MissingAndUnexpectedTensorsAreListed) {
  TempDir d("ckpt_missing");
  MakeTiny(d.path());
  RemoveTensor(d.path(), "model.layers.1.mlp.experts.3.up_proj.weight");
  RemoveTensor(d.path(), "model.norm.weight");
  std::string e = LoadError(d.path());
  EXPECT_NE(e.find("missing tensors: model.norm.weight, model.layers.1.mlp.experts.3.up_proj.weight"),
            std::string::npos) << e;

  TempDir d2("ckpt_unexpected");
  MakeTiny(d2.path());
  ASSERT_TRUE(WriteSafetensors(d2 / "extra.safetensors", {{"model.layers.0.mlp.bogus.weight", DType::kF32, {2}, std::vector<uint8_t>(8)}}).ok());
  EditJson(d2 / "model.safetensors.index.json",
           [](nlohmann::json& j) { j["weight_map"]["model.layers.0.mlp.bogus.weight"] = "extra.safetensors"; });
  e = LoadError(d2.path());
  EXPECT_NE(e.find("unexpected tensors: model.layers.0.mlp.bogus.weight"), std::string::npos) << e;

  // A malformed layer / expert index (model/tensor_names.h) is named as such.
  TempDir d3("ckpt_badname");
  MakeTiny(d3.path());
  const std::string bad = "model.layers.1.mlp.experts.03.up_proj.weight";
  ASSERT_TRUE(WriteSafetensors(d3 / "extra.safetensors", {{bad, DType::kF32, {2}, std::vector<uint8_t>(8)}}).ok());
  EditJson(d3 / "model.safetensors.index.json", [&](nlohmann::json& j) { j["weight_map"][bad] = "extra.safetensors"; });
  e = LoadError(d3.path());
  EXPECT_NE(e.find("tensor '" + bad + "': expert index has a leading zero"), std::string::npos) << e;
}

TEST(CheckpointTest, Fp8WithoutScaleIsRefused) {
  TempDir d("ckpt_noscale");
  MakeTiny(d.path(), "fp8");
  RemoveTensor(d.path(), "model.layers.2.self_attn.o_proj.weight_scale_inv");
  const std::string e = LoadError(d.path());
  EXPECT_NE(e.find("F8_E4M3 tensor 'model.layers.2.self_attn.o_proj.weight' has no 'model.layers.2.self_attn.o_proj.weight_scale_inv'"),
            std::string::npos) << e;
}

TEST(CheckpointTest, UnsupportedConfigValuesNameTheField) {
  TempDir d("ckpt_cfg");
  MakeTiny(d.path());
  EditJson(d / "config.json", [](nlohmann::json& j) { j["topk_method"] = "greedy"; });
  EXPECT_NE(LoadError(d.path()).find("'topk_method' = 'greedy' is unsupported"), std::string::npos);
  EditJson(d / "config.json", [](nlohmann::json& j) { j["topk_method"] = "noaux_tc"; j["kv_lora_rank"] = 100; });
  EXPECT_NE(LoadError(d.path()).find("'kv_lora_rank' must be a multiple of 128"), std::string::npos);
  EditJson(d / "config.json", [](nlohmann::json& j) { j["kv_lora_rank"] = 128; j.erase("hidden_size"); });
  EXPECT_NE(LoadError(d.path()).find("missing field 'hidden_size'"), std::string::npos);
  EditJson(d / "config.json", [](nlohmann::json& j) { j["hidden_size"] = "big"; });
  EXPECT_NE(LoadError(d.path()).find("field 'hidden_size' is not an integer"), std::string::npos);
  ASSERT_TRUE(WriteStringToFile(d / "config.json", "{not json").ok());
  EXPECT_NE(LoadError(d.path()).find("invalid JSON"), std::string::npos);
  EXPECT_NE(LoadError(d / "nonexistent").find("does not exist"), std::string::npos);
}

}  // namespace
}  // namespace pdserve::model
