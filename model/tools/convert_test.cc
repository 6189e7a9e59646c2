// Tests of the streaming converter (model/tools/convert.h), the incremental safetensors writer and the
// W8A8 / expert-parallel loading paths of ModelWeights: FP8 block-scaled tensors built here
// with exactly representable values, EP-split conversions loaded rank by rank on 2 and 4 ranks
// (their union equals the unsplit conversion), and malformed inputs refused with clear errors.
#include "model/tools/convert.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "common/mapped_file.h"
#include "model/safetensors.h"
#include "model/safetensors_writer.h"
#include "model/test_util.h"
#include "model/weights.h"

namespace pdserve::model {
namespace {

using testing::TempDir;

TensorToWrite F32Tensor(const std::string& name, std::vector<int64_t> shape, const std::vector<float>& v) {
  TensorToWrite t{name, DType::kF32, std::move(shape), std::vector<uint8_t>(v.size() * 4)};
  std::memcpy(t.bytes.data(), v.data(), t.bytes.size());
  return t;
}

TensorToWrite Bf16Tensor(const std::string& name, std::vector<int64_t> shape, const std::vector<float>& v) {
  TensorToWrite t{name, DType::kBF16, std::move(shape), std::vector<uint8_t>(v.size() * 2)};
  for (size_t i = 0; i < v.size(); ++i) {
    const uint16_t b = F32ToBf16Bits(v[i]);
    std::memcpy(&t.bytes[i * 2], &b, 2);
  }
  return t;
}

// A checkpoint directory holding only `tensors` (the converter does not need a full model).
void WriteDir(const std::string& dir, const std::vector<TensorToWrite>& tensors, const std::string& format) {
  auto cfg = PresetConfig("tiny", 0);
  ASSERT_TRUE(cfg.ok());
  ModelConfig c = *cfg;
  c.weight_format = format;
  ASSERT_TRUE(WriteStringToFile(dir + "/config.json", c.ToJson().dump(2)).ok());
  ASSERT_TRUE(WriteSafetensors(dir + "/model.safetensors", tensors).ok());
}

// An FP8 weight [rows, cols] with 128x128 block scales 2^(block index - 3): every value is
// fp8(code) * scale, encoded exactly (checked), so dequantization has one right answer.
struct Fp8Weight {
  std::vector<float> values;
  TensorToWrite codes, scales;
};
Fp8Weight MakeFp8(const std::string& name, int64_t rows, int64_t cols) {
  Fp8Weight f;
  const int64_t rb = (rows + 127) / 128, cb = (cols + 127) / 128;
  std::vector<float> s(static_cast<size_t>(rb * cb));
  for (size_t b = 0; b < s.size(); ++b) s[b] = std::ldexp(1.0f, static_cast<int>(b) - 3);
  f.codes = {name, DType::kF8E4M3, {rows, cols}, std::vector<uint8_t>(static_cast<size_t>(rows * cols))};
  f.values.resize(static_cast<size_t>(rows * cols));
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j) {
      // Codes cycle through normal e4m3 values of both signs (never the NaN codes 0x7f/0xff).
      const uint8_t code = static_cast<uint8_t>(((i * 37 + j * 11) % 0x7e) | (((i + j) % 3 == 0) ? 0x80 : 0));
      const float scale = s[static_cast<size_t>((i / 128) * cb + j / 128)];
      f.codes.bytes[static_cast<size_t>(i * cols + j)] = code;
      f.values[static_cast<size_t>(i * cols + j)] = Fp8E4M3ToF32(code) * scale;
      EXPECT_EQ(F32ToFp8E4M3(Fp8E4M3ToF32(code)), code);  // exactly representable
    }
  f.scales = F32Tensor(name + "_scale_inv", {rb, cb}, s);
  return f;
}

const TensorInfo* FindIn(const SafetensorsFile& f, const std::string& name) {
  auto it = f.tensors().find(name);
  return it == f.tensors().end() ? nullptr : &it->second;
}

TEST(ConvertTest, Fp8BlockScaledDequantizesToTheRightValues) {
  TempDir d("convert_fp8");
  const std::string in = d / "in";
  std::filesystem::create_directories(in);
  // q_b_proj is a W8A8 target, kv_b_proj stays BF16; odd sizes give partial 128-blocks.
  Fp8Weight qb = MakeFp8("model.layers.0.self_attn.q_b_proj.weight", 200, 300);
  Fp8Weight kvb = MakeFp8("model.layers.0.self_attn.kv_b_proj.weight", 130, 257);
  WriteDir(in, {qb.codes, qb.scales, kvb.codes, kvb.scales, Bf16Tensor("model.norm.weight", {4}, {1, 2, 3, 4})}, "fp8");
  for (const std::string quant : {"w8a8", "bf16"}) {
    ConvertOptions o;
    o.in_dir = in;
    o.out_dir = d / ("out_" + quant);
    o.quant = quant;
    ThreadPool pool(2);
    o.pool = &pool;
    auto stats = Convert(o);
    ASSERT_TRUE(stats.ok()) << stats.status().ToString();
    EXPECT_EQ(stats->quantized, quant == "w8a8" ? 1 : 0);
    auto f = SafetensorsFile::Open(o.out_dir + "/model-00001-of-00001.safetensors");
    ASSERT_TRUE(f.ok()) << f.status().ToString();
    // kv_b: BF16 of the exact values (4-bit mantissas fit bf16 exactly).
    const TensorInfo* kv = FindIn(**f, "model.layers.0.self_attn.kv_b_proj.weight");
    ASSERT_NE(kv, nullptr);
    ASSERT_EQ(kv->dtype, DType::kBF16);
    const uint16_t* kvp = reinterpret_cast<const uint16_t*>(kv->data);
    for (size_t i = 0; i < kvb.values.size(); ++i) ASSERT_EQ(Bf16ToF32(kvp[i]), kvb.values[i]) << i;
    const TensorInfo* q = FindIn(**f, "model.layers.0.self_attn.q_b_proj.weight");
    ASSERT_NE(q, nullptr);
    EXPECT_EQ(FindIn(**f, "model.layers.0.self_attn.q_b_proj.weight_scale_inv"), nullptr);
    if (quant == "bf16") {
      ASSERT_EQ(q->dtype, DType::kBF16);
      for (size_t i = 0; i < qb.values.size(); ++i)
        ASSERT_EQ(Bf16ToF32(reinterpret_cast<const uint16_t*>(q->data)[i]), qb.values[i]) << i;
      continue;
    }
    // q_b: I8 with per-row scale amax/127; dequantized within half a step of the exact value.
    ASSERT_EQ(q->dtype, DType::kI8);
    const TensorInfo* s = FindIn(**f, "model.layers.0.self_attn.q_b_proj.weight_scale");
    ASSERT_NE(s, nullptr);
    ASSERT_EQ(s->shape, std::vector<int64_t>{200});
    const float* sc = reinterpret_cast<const float*>(s->data);
    const int8_t* qi = reinterpret_cast<const int8_t*>(q->data);
    for (int64_t i = 0; i < 200; ++i) {
      float amax = 0;
      for (int64_t j = 0; j < 300; ++j) amax = std::max(amax, std::fabs(qb.values[i * 300 + j]));
      ASSERT_EQ(sc[i], amax / 127.0f) << i;
      for (int64_t j = 0; j < 300; ++j)
        ASSERT_LE(std::fabs(qi[i * 300 + j] * sc[i] - qb.values[i * 300 + j]), 0.5f * sc[i] * 1.0001f) << i << "," << j;
    }
  }
}

TEST(ConvertTest, ConverterBf16MatchesLoaderFp8Dequant) {
  // The converter's FP8 -> BF16 equals what the loader does with the same FP8 checkpoint.
  TempDir d("convert_vs_loader");
  MakeModelOptions mo;
  mo.out_dir = d / "fp8";
  mo.dtype = "fp8";
  mo.seed = 5;
  ASSERT_TRUE(MakeModel(mo).ok());
  ConvertOptions o;
  o.in_dir = mo.out_dir;
  o.out_dir = d / "bf16";
  o.quant = "bf16";
  ASSERT_TRUE(Convert(o).ok());
  auto a = ModelWeights::Load(mo.out_dir);
  auto b = ModelWeights::Load(o.out_dir);
  ASSERT_TRUE(a.ok() && b.ok());
  for (int64_t l = 0; l < (*a)->config().num_hidden_layers; ++l) {
    const Linear& x = (*a)->layer(l).q_b;
    const Linear& y = (*b)->layer(l).q_b;
    // Both loads prepack their BF16 projections: equal panels mean equal weights.
    ASSERT_TRUE(x.packed && y.packed) << l;
    ASSERT_EQ(x.packed.bytes(), y.packed.bytes()) << l;
    ASSERT_EQ(std::memcmp(x.packed.view().data, y.packed.view().data, static_cast<size_t>(x.packed.bytes())), 0) << l;
  }
}

// Every routed expert's I8 weights and scales, plus a few shared tensors, of two loads.
void ExpectSameTensors(const ModelWeights& part, const ModelWeights& full) {
  const ModelConfig& c = full.config();
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    const LayerWeights& p = part.layer(l);
    const LayerWeights& f = full.layer(l);
    auto same = [](const Linear& x, const Linear& y) {
      ASSERT_TRUE(x.is_int8() && y.is_int8());
      ASSERT_EQ(x.n_out(), y.n_out());
      ASSERT_EQ(std::memcmp(x.int8.data, y.int8.data, static_cast<size_t>(x.n_out() * x.n_in())), 0);
      ASSERT_EQ(std::memcmp(x.int8.scales, y.int8.scales, static_cast<size_t>(x.n_out()) * 4), 0);
    };
    same(p.q_b, f.q_b);
    same(p.o, f.o);
    same(p.idx_wq_b, f.idx_wq_b);
    EXPECT_EQ(p.attn_norm, f.attn_norm);
    if (!f.is_moe) continue;
    same(p.shared.down, f.shared.down);
    for (int64_t e = part.expert_begin(); e < part.expert_end(); ++e) {
      same(p.experts[static_cast<size_t>(e)].gate, f.experts[static_cast<size_t>(e)].gate);
      same(p.experts[static_cast<size_t>(e)].up, f.experts[static_cast<size_t>(e)].up);
      same(p.experts[static_cast<size_t>(e)].down, f.experts[static_cast<size_t>(e)].down);
    }
    for (int64_t e = 0; e < c.n_routed_experts; ++e)
      if (e < part.expert_begin() || e >= part.expert_end()) {
        EXPECT_EQ(p.experts[static_cast<size_t>(e)].gate.n_out(), 0) << "rank loaded a foreign expert " << e;
      }
  }
}

TEST(ConvertTest, EpSplitLoadsOnTwoAndFourRanksAndUnionEqualsUnsplit) {
  TempDir d("convert_ep");
  MakeModelOptions mo;
  mo.out_dir = d / "bf16";
  mo.seed = 7;
  ASSERT_TRUE(MakeModel(mo).ok());
  ConvertOptions o;
  o.in_dir = mo.out_dir;
  o.out_dir = d / "w8";
  ASSERT_TRUE(Convert(o).ok());
  auto full = ModelWeights::Load(o.out_dir);
  ASSERT_TRUE(full.ok()) << full.status().ToString();
  const int64_t E = (*full)->config().n_routed_experts;
  for (int64_t n : {2, 4}) {
    ConvertOptions oe = o;
    oe.out_dir = d / ("w8_ep" + std::to_string(n));
    oe.ep_size = n;
    oe.max_shard_bytes = 512 << 10;  // several shards per group
    ASSERT_TRUE(Convert(oe).ok());
    std::vector<bool> covered(static_cast<size_t>(E), false);
    for (int64_t r = 0; r < n; ++r) {
      // The rank's index names only shared shards and its own.
      auto text = ReadFileToString(oe.out_dir + "/" + EpIndexName(r, n));
      ASSERT_TRUE(text.ok());
      const auto idx = nlohmann::json::parse(*text);
      for (const auto& [name, shard] : idx["weight_map"].items()) {
        const std::string s = shard.get<std::string>();
        EXPECT_TRUE(s.rfind("model-shared-", 0) == 0 ||
                    s.rfind("model-ep" + std::to_string(r) + "-of-" + std::to_string(n) + "-", 0) == 0)
            << name << " -> " << s;
      }
      auto part = ModelWeights::Load(oe.out_dir, {r, n});
      ASSERT_TRUE(part.ok()) << part.status().ToString();
      EXPECT_EQ((*part)->expert_begin(), r * E / n);
      EXPECT_EQ((*part)->expert_end(), (r + 1) * E / n);
      for (int64_t e = (*part)->expert_begin(); e < (*part)->expert_end(); ++e) covered[static_cast<size_t>(e)] = true;
      ExpectSameTensors(**part, **full);
    }
    for (int64_t e = 0; e < E; ++e) EXPECT_TRUE(covered[static_cast<size_t>(e)]) << e;
    // The whole split directory also loads as one model (its main index lists every shard).
    auto all = ModelWeights::Load(oe.out_dir);
    ASSERT_TRUE(all.ok()) << all.status().ToString();
    ExpectSameTensors(**all, **full);
  }
  // A rank-sliced load of the unsplit conversion (no rank index) maps its experts only.
  auto slice = ModelWeights::Load(o.out_dir, {1, 2});
  ASSERT_TRUE(slice.ok()) << slice.status().ToString();
  ExpectSameTensors(**slice, **full);
}

TEST(ConvertTest, EpLoadRefusesWrongExpertsAndBadRanks) {
  TempDir d("convert_ep_bad");
  MakeModelOptions mo;
  mo.out_dir = d / "bf16";
  ASSERT_TRUE(MakeModel(mo).ok());
  ConvertOptions o;
  o.in_dir = mo.out_dir;
  o.out_dir = d / "w8";
  o.ep_size = 2;
  ASSERT_TRUE(Convert(o).ok());
  auto rank1 = ReadFileToString(o.out_dir + "/" + EpIndexName(1, 2));
  ASSERT_TRUE(rank1.ok());
  // Rank 1's index under rank 0's name: refused by its metadata.
  ASSERT_TRUE(WriteStringToFile(o.out_dir + "/" + EpIndexName(0, 2), *rank1).ok());
  auto r = ModelWeights::Load(o.out_dir, {0, 2});
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("index was written for EP rank 1 of 2, loading EP rank 0 of 2"), std::string::npos)
      << r.status().ToString();
  // Rank 1's files claiming to be rank 0's: refused naming the foreign experts.
  auto j = nlohmann::json::parse(*rank1);
  j["metadata"]["ep_rank"] = 0;
  ASSERT_TRUE(WriteStringToFile(o.out_dir + "/" + EpIndexName(0, 2), j.dump()).ok());
  r = ModelWeights::Load(o.out_dir, {0, 2});
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("EP rank 0 of 2 holds experts [0, 4) but its files hold model.layers.1.mlp.experts.4."),
            std::string::npos)
      << r.status().ToString();
  EXPECT_EQ(ModelWeights::Load(o.out_dir, {2, 2}).status().code(), StatusCode::kInvalidArgument);
  auto r3 = ModelWeights::Load(o.out_dir, {0, 3});
  EXPECT_NE(r3.status().message().find("not divisible by the EP size 3"), std::string::npos) << r3.status().ToString();
}

// Runs the converter on a directory made of `tensors`; returns its status.
Status ConvertTensors(const TempDir& d, const std::string& tag, const std::vector<TensorToWrite>& tensors,
                      const std::string& format = "fp8") {
  const std::string in = d / ("in_" + tag);
  std::filesystem::create_directories(in);
  WriteDir(in, tensors, format);
  ConvertOptions o;
  o.in_dir = in;
  o.out_dir = d / ("out_" + tag);
  return Convert(o).status();
}

void ExpectError(const Status& s, const std::string& text) {
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.ToString();
  EXPECT_NE(s.message().find(text), std::string::npos) << s.ToString();
}

TEST(ConvertTest, MalformedInputsAreRefusedClearly) {
  TempDir d("convert_bad");
  const std::string qb = "model.layers.0.self_attn.q_b_proj.weight";
  Fp8Weight w = MakeFp8(qb, 130, 140);
  ExpectError(ConvertTensors(d, "noscale", {w.codes}), "F8_E4M3 tensor '" + qb + "' has no '" + qb + "_scale_inv'");
  ExpectError(ConvertTensors(d, "badscale", {w.codes, F32Tensor(qb + "_scale_inv", {1, 2}, {1, 1})}),
              "must be F32 [2, 2], got F32 [1, 2]");
  ExpectError(ConvertTensors(d, "nanscale", {w.codes, F32Tensor(qb + "_scale_inv", {2, 2}, {1, NAN, 1, 1})}),
              "non-finite scale");
  Fp8Weight nan = MakeFp8(qb, 130, 140);
  nan.codes.bytes[140 * 129 + 3] = 0x7f;
  ExpectError(ConvertTensors(d, "nancode", {nan.codes, nan.scales}), "NaN fp8 code in row 129");
  ExpectError(ConvertTensors(d, "orphan", {F32Tensor("model.norm.weight_scale_inv", {1, 1}, {1})}),
              "'model.norm.weight_scale_inv' scales no F8_E4M3 tensor");
  std::vector<float> inf(64, 1.0f);
  inf[9] = INFINITY;
  ExpectError(ConvertTensors(d, "inf", {Bf16Tensor(qb, {8, 8}, inf)}, "bf16"), "non-finite value in row 1");
  std::vector<float> nanv(64, 1.0f);
  nanv[8 * 5 + 2] = NAN;  // NaN must be caught too (a max-based scan can miss it)
  ExpectError(ConvertTensors(d, "nan", {Bf16Tensor(qb, {8, 8}, nanv)}, "bf16"), "non-finite value in row 5");
  ExpectError(ConvertTensors(d, "vec", {Bf16Tensor(qb, {8}, std::vector<float>(8, 1))}, "bf16"), "is not a matrix");
  TensorToWrite i32{"model.norm.weight", DType::kI32, {2}, std::vector<uint8_t>(8)};
  ExpectError(ConvertTensors(d, "i32", {i32}, "bf16"), "has dtype I32, expected BF16, F32 or F8_E4M3");
  ExpectError(ConvertTensors(d, "expert", {Bf16Tensor("model.layers.1.mlp.experts.9.up_proj.weight", {2, 2}, {1, 2, 3, 4})},
                             "bf16"),
              "names expert 9 outside [0, 8)");
  ExpectError(ConvertTensors(d, "badname", {Bf16Tensor("model.layers.x.mlp.gate.weight", {2, 2}, {1, 2, 3, 4})}, "bf16"),
              "tensor 'model.layers.x.mlp.gate.weight': expected a decimal layer index");
  ExpectError(ConvertTensors(d, "already", {Bf16Tensor("model.norm.weight", {2}, {1, 2})}, "w8a8_int8"),
              "already a W8A8 checkpoint");
  // Bad options.
  ConvertOptions o;
  o.in_dir = d / "in_vec";
  o.out_dir = d / "out_opts";
  o.quant = "int4";
  ExpectError(Convert(o).status(), "--quant must be w8a8, w8a8_all or bf16");
  o.quant = "bf16";
  o.ep_size = 3;
  ExpectError(Convert(o).status(), "--ep-size 3 does not divide n_routed_experts (8)");
  o.ep_size = 1;
  o.out_dir = d / "in_vec";
  ExpectError(Convert(o).status(), "--out is the input directory");
  std::filesystem::create_directories(d / "full");
  ASSERT_TRUE(WriteStringToFile(d / "full/x", "x").ok());
  o.out_dir = d / "full";
  ExpectError(Convert(o).status(), "not empty");
}

TEST(ConvertTest, W8A8LoaderErrors) {
  TempDir d("w8_loader_bad");
  MakeModelOptions mo;
  mo.out_dir = d / "bf16";
  ASSERT_TRUE(MakeModel(mo).ok());
  ConvertOptions o;
  o.in_dir = mo.out_dir;
  o.out_dir = d / "w8";
  ASSERT_TRUE(Convert(o).ok());
  // I8 weights under a config without the w8a8 quantization_config.
  auto text = ReadFileToString(o.out_dir + "/config.json");
  ASSERT_TRUE(text.ok());
  auto j = nlohmann::json::parse(*text);
  j.erase("quantization_config");
  ASSERT_TRUE(WriteStringToFile(o.out_dir + "/config.json", j.dump()).ok());
  auto r = ModelWeights::Load(o.out_dir);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("no quantization_config with quant_method 'w8a8_int8'"), std::string::npos)
      << r.status().ToString();
  j["quantization_config"] = {{"quant_method", "w8a8_int8"}, {"format_version", 2}};
  ASSERT_TRUE(WriteStringToFile(o.out_dir + "/config.json", j.dump()).ok());
  EXPECT_NE(ModelWeights::Load(o.out_dir).status().message().find("format_version' = 2 is unsupported"), std::string::npos);
}

TEST(SafetensorsWriterTest, ChunkedWritesRoundTripAndIncompleteFilesAreRefused) {
  TempDir d("st_writer");
  std::vector<TensorDecl> decls = {{"a", DType::kF32, {3, 2}}, {"b", DType::kI8, {5}}, {"c", DType::kBF16, {0}}};
  auto w = SafetensorsWriter::Create(d / "x.safetensors", decls, {{"who", "test"}});
  ASSERT_TRUE(w.ok());
  const float a[6] = {1, 2, 3, 4, 5, 6};
  const int8_t b[5] = {-1, 2, -3, 4, -128};
  ASSERT_TRUE((*w)->Append(a, 10).ok());  // chunks crossing element and tensor boundaries
  EXPECT_EQ((*w)->current_tensor(), 0u);
  ASSERT_TRUE((*w)->Append(reinterpret_cast<const uint8_t*>(a) + 10, 14).ok());
  EXPECT_EQ((*w)->current_tensor(), 1u);
  ASSERT_TRUE((*w)->Append(b, 5).ok());
  EXPECT_EQ((*w)->Append(b, 1).code(), StatusCode::kFailedPrecondition);  // overrun
  ASSERT_TRUE((*w)->Finish().ok());
  auto f = SafetensorsFile::Open(d / "x.safetensors");
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  EXPECT_EQ(std::memcmp(FindIn(**f, "a")->data, a, 24), 0);
  EXPECT_EQ(std::memcmp(FindIn(**f, "b")->data, b, 5), 0);
  EXPECT_EQ(FindIn(**f, "c")->shape, std::vector<int64_t>{0});
  // Missing bytes: Finish refuses and nothing appears under the final name.
  {
    auto w2 = SafetensorsWriter::Create(d / "y.safetensors", decls);
    ASSERT_TRUE(w2.ok());
    ASSERT_TRUE((*w2)->Append(a, 24).ok());
    Status s = (*w2)->Finish();
    EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition);
    EXPECT_NE(s.message().find("tensor 'b' is incomplete"), std::string::npos) << s.ToString();
  }
  EXPECT_FALSE(std::filesystem::exists(d / "y.safetensors"));
  EXPECT_FALSE(std::filesystem::exists(d / "y.safetensors.tmp"));
  EXPECT_EQ(SafetensorsWriter::Create(d / "z.safetensors", {{"a", DType::kF32, {1}}, {"a", DType::kF32, {1}}}).status().code(),
            StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace pdserve::model
