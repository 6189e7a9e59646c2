#include "model/tools/make_model.h"

#include <array>
#include <cmath>
#include <functional>
#include <filesystem>

#include "common/dtype.h"
#include "common/mapped_file.h"
#include "model/safetensors.h"

namespace pdserve::model {

namespace {

// SplitMix64: tiny, portable and good enough for weights; normals via Box-Muller in double.
class Rng {
 public:
  explicit Rng(uint64_t seed) : state_(seed * 0x9E3779B97F4A7C15ull + 0x1234567ull) {}
  uint64_t Next() {
    uint64_t z = (state_ += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  double Uniform() { return (static_cast<double>(Next() >> 11) + 0.5) * (1.0 / 9007199254740992.0); }
  double Normal() {
    if (has_spare_) {
      has_spare_ = false;
      return spare_;
    }
    const double u1 = Uniform(), u2 = Uniform();
    const double r = std::sqrt(-2.0 * std::log(u1));
    spare_ = r * std::sin(2.0 * M_PI * u2);
    has_spare_ = true;
    return r * std::cos(2.0 * M_PI * u2);
  }

 private:
  uint64_t state_;
  double spare_ = 0.0;
  bool has_spare_ = false;
};

// Names of the matrices the official FP8 checkpoints store as F8_E4M3 + scale.
bool IsFp8Linear(const std::string& name) {
  static const char* kBf16Only[] = {"embed_tokens", "lm_head", "norm", "weights_proj", "mlp.gate.weight"};
  for (const char* s : kBf16Only)
    if (name.find(s) != std::string::npos) return false;
  return name.size() > 7 && name.compare(name.size() - 7, 7, ".weight") == 0;
}

class Writer {
 public:
  Writer(const MakeModelOptions& opt, uint64_t seed) : opt_(opt), rng_(seed) {}

  // A matrix [n_out, n_in] with entries N(mean, std^2), optionally edited before it is written.
  void Matrix(const std::string& name, int64_t n_out, int64_t n_in, double std, double mean = 0.0,
              const std::function<void(std::vector<float>&)>& edit = {}) {
    std::vector<float> v(static_cast<size_t>(n_out * n_in));
    for (auto& x : v) x = static_cast<float>(mean + std * rng_.Normal());
    if (edit) edit(v);
    Emit(name, {n_out, n_in}, v);
  }
  // A random unit vector of length n.
  std::vector<float> UnitVector(int64_t n) {
    std::vector<float> v(static_cast<size_t>(n));
    double norm = 0;
    for (auto& x : v) {
      x = static_cast<float>(rng_.Normal());
      norm += double(x) * x;
    }
    for (auto& x : v) x = static_cast<float>(x / std::sqrt(norm));
    return v;
  }
  void Vector(const std::string& name, int64_t n, double std, double mean, DType dtype = DType::kBF16) {
    std::vector<float> v(static_cast<size_t>(n));
    for (auto& x : v) x = static_cast<float>(mean + std * rng_.Normal());
    if (dtype == DType::kF32) {
      TensorToWrite t{name, DType::kF32, {n}, std::vector<uint8_t>(static_cast<size_t>(n) * 4)};
      std::memcpy(t.bytes.data(), v.data(), t.bytes.size());
      Add(std::move(t));
    } else {
      Emit(name, {n}, v);
    }
  }
  Rng& rng() { return rng_; }

  void Emit(const std::string& name, std::vector<int64_t> shape, const std::vector<float>& v) {
    if (opt_.dtype == "fp8" && shape.size() == 2 && IsFp8Linear(name)) {
      EmitFp8(name, shape, v);
      return;
    }
    TensorToWrite t{name, DType::kBF16, shape, std::vector<uint8_t>(v.size() * 2)};
    uint16_t* p = reinterpret_cast<uint16_t*>(t.bytes.data());
    for (size_t i = 0; i < v.size(); ++i) p[i] = F32ToBf16Bits(v[i]);
    Add(std::move(t));
  }

  // Block-quantized like the official checkpoints: per 128x128 block, scale = amax / 448.
  void EmitFp8(const std::string& name, const std::vector<int64_t>& shape, const std::vector<float>& v) {
    const int64_t n_out = shape[0], n_in = shape[1];
    const int64_t rb = (n_out + 127) / 128, cb = (n_in + 127) / 128;
    std::vector<float> scales(static_cast<size_t>(rb * cb));
    for (int64_t bi = 0; bi < rb; ++bi)
      for (int64_t bj = 0; bj < cb; ++bj) {
        float amax = 0.0f;
        for (int64_t i = bi * 128; i < std::min(n_out, bi * 128 + 128); ++i)
          for (int64_t j = bj * 128; j < std::min(n_in, bj * 128 + 128); ++j)
            amax = std::max(amax, std::fabs(v[static_cast<size_t>(i * n_in + j)]));
        scales[static_cast<size_t>(bi * cb + bj)] = amax > 0 ? amax / kFp8E4M3Max : 1.0f;
      }
    TensorToWrite w{name, DType::kF8E4M3, shape, std::vector<uint8_t>(v.size())};
    for (int64_t i = 0; i < n_out; ++i)
      for (int64_t j = 0; j < n_in; ++j)
        w.bytes[static_cast<size_t>(i * n_in + j)] =
            F32ToFp8E4M3(v[static_cast<size_t>(i * n_in + j)] / scales[static_cast<size_t>((i / 128) * cb + j / 128)]);
    Add(std::move(w));
    TensorToWrite s{name + "_scale_inv", DType::kF32, {rb, cb}, std::vector<uint8_t>(scales.size() * 4)};
    std::memcpy(s.bytes.data(), scales.data(), s.bytes.size());
    Add(std::move(s));
  }

  void Add(TensorToWrite t) {
    if (!pending_.empty() && pending_bytes_ + t.bytes.size() > static_cast<size_t>(opt_.max_shard_bytes)) Flush();
    pending_bytes_ += t.bytes.size();
    pending_.push_back(std::move(t));
  }

  void Flush() {
    if (pending_.empty()) return;
    shards_.push_back(std::move(pending_));
    pending_.clear();
    pending_bytes_ = 0;
    // Shards are written at Finish() once their count (part of the file names) is known;
    // to bound memory, spill each full shard to a temporary file now.
    const std::string tmp = opt_.out_dir + "/.shard" + std::to_string(shards_.size()) + ".tmp";
    if (status_.ok()) status_ = WriteSafetensors(tmp, shards_.back());
    for (const auto& t : shards_.back()) names_.push_back({t.name, shards_.size()});
    shards_.back().clear();
  }

  Status Finish(const ModelConfig& cfg) {
    Flush();
    PDSERVE_RETURN_IF_ERROR(status_);
    const size_t n = shards_.size();
    nlohmann::json weight_map = nlohmann::json::object();
    auto shard_name = [n](size_t i) {
      char buf[64];
      std::snprintf(buf, sizeof(buf), "model-%05zu-of-%05zu.safetensors", i, n);
      return std::string(buf);
    };
    for (size_t i = 1; i <= n; ++i) {
      const std::string tmp = opt_.out_dir + "/.shard" + std::to_string(i) + ".tmp";
      std::filesystem::rename(tmp, opt_.out_dir + "/" + shard_name(i));
    }
    for (const auto& [name, shard] : names_) weight_map[name] = shard_name(shard);
    nlohmann::json index = {{"metadata", {{"total_size", 0}}}, {"weight_map", weight_map}};
    PDSERVE_RETURN_IF_ERROR(WriteStringToFile(opt_.out_dir + "/model.safetensors.index.json", index.dump(2)));
    return WriteStringToFile(opt_.out_dir + "/config.json", cfg.ToJson().dump(2));
  }

 private:
  const MakeModelOptions& opt_;
  Rng rng_;
  std::vector<TensorToWrite> pending_;
  size_t pending_bytes_ = 0;
  std::vector<std::vector<TensorToWrite>> shards_;
  std::vector<std::pair<std::string, size_t>> names_;
  Status status_;
};

}  // namespace

Result<ModelConfig> PresetConfig(const std::string& preset, int64_t vocab_override) {
  ModelConfig c;
  if (preset == "tiny") {
    c.vocab_size = 1024; c.hidden_size = 256; c.intermediate_size = 512; c.moe_intermediate_size = 128;
    c.num_hidden_layers = 3; c.num_attention_heads = 4; c.n_shared_experts = 1; c.n_routed_experts = 8;
    c.routed_scaling_factor = 2.5; c.kv_lora_rank = 128; c.q_lora_rank = 128; c.qk_rope_head_dim = 64;
    c.qk_nope_head_dim = 64; c.v_head_dim = 64; c.n_group = 4; c.topk_group = 2; c.num_experts_per_tok = 2;
    c.first_k_dense_replace = 1; c.rope_theta = 10000.0; c.max_position_embeddings = 8192;
    c.index_n_heads = 4; c.index_head_dim = 128; c.index_topk = 16;
    c.yarn = {true, 4.0, 2048, 32.0, 1.0, 1.0, 1.0};
  } else if (preset == "tiny2") {
    c.vocab_size = 1000; c.hidden_size = 192; c.intermediate_size = 320; c.moe_intermediate_size = 96;
    c.num_hidden_layers = 2; c.num_attention_heads = 3; c.n_shared_experts = 2; c.n_routed_experts = 16;
    c.routed_scaling_factor = 1.5; c.kv_lora_rank = 256; c.q_lora_rank = 160; c.qk_rope_head_dim = 32;
    c.qk_nope_head_dim = 48; c.v_head_dim = 40; c.n_group = 8; c.topk_group = 3; c.num_experts_per_tok = 4;
    c.first_k_dense_replace = 0; c.rope_theta = 50000.0; c.max_position_embeddings = 4096;
    c.index_n_heads = 2; c.index_head_dim = 128; c.index_topk = 24;
  } else if (preset == "small") {
    c.vocab_size = 32000; c.hidden_size = 1024; c.intermediate_size = 2816; c.moe_intermediate_size = 256;
    c.num_hidden_layers = 6; c.num_attention_heads = 16; c.n_shared_experts = 1; c.n_routed_experts = 64;
    c.routed_scaling_factor = 2.5; c.kv_lora_rank = 512; c.q_lora_rank = 384; c.qk_rope_head_dim = 64;
    c.qk_nope_head_dim = 128; c.v_head_dim = 128; c.n_group = 8; c.topk_group = 4; c.num_experts_per_tok = 8;
    c.first_k_dense_replace = 1; c.rope_theta = 10000.0; c.max_position_embeddings = 65536;
    c.index_n_heads = 16; c.index_head_dim = 128; c.index_topk = 512;
    c.yarn = {true, 16.0, 4096, 32.0, 1.0, 1.0, 1.0};
  } else if (preset == "v32-slice") {
    // DeepSeek-V3.2's layer shapes (attention, indexer, experts) in 2 MoE layers with 16
    // routed experts and a small vocabulary: a decode step reads bytes in the full model's
    // proportions (experts and q_b/o ~94%) at 1/30 of its size, for decode benchmarks.
    c.vocab_size = 8192; c.hidden_size = 7168; c.intermediate_size = 18432; c.moe_intermediate_size = 2048;
    c.num_hidden_layers = 2; c.num_attention_heads = 128; c.n_shared_experts = 1; c.n_routed_experts = 16;
    c.routed_scaling_factor = 2.5; c.kv_lora_rank = 512; c.q_lora_rank = 1536; c.qk_rope_head_dim = 64;
    c.qk_nope_head_dim = 128; c.v_head_dim = 128; c.n_group = 8; c.topk_group = 4; c.num_experts_per_tok = 8;
    c.first_k_dense_replace = 0; c.rope_theta = 10000.0; c.max_position_embeddings = 163840;
    c.index_n_heads = 64; c.index_head_dim = 128; c.index_topk = 2048;
    c.yarn = {true, 40.0, 4096, 32.0, 1.0, 1.0, 1.0};
  } else {
    return Status::InvalidArgument("unknown preset '" + preset + "' (tiny, tiny2, small, v32-slice)");
  }
  if (vocab_override > 0) c.vocab_size = vocab_override;
  PDSERVE_RETURN_IF_ERROR(c.Validate());
  return c;
}

Status MakeModel(const MakeModelOptions& options) {
  MakeModelOptions opt = options;
  if (opt.out_dir.empty()) return Status::InvalidArgument("missing output directory");
  if (opt.dtype != "bf16" && opt.dtype != "fp8")
    return Status::InvalidArgument("dtype must be bf16 or fp8, got '" + opt.dtype + "'");
  PDSERVE_ASSIGN_OR_RETURN(ModelConfig c, PresetConfig(opt.preset, opt.vocab));
  if (opt.dtype == "fp8") c.weight_format = "fp8";
  if (opt.max_shard_bytes <= 0)
    opt.max_shard_bytes = opt.preset == "small" || opt.preset == "v32-slice" ? (256 << 20) : (1 << 20);
  std::error_code ec;
  std::filesystem::create_directories(opt.out_dir, ec);
  if (ec) return Status::Internal("cannot create directory: " + ec.message(), opt.out_dir);

  Writer w(opt, opt.seed);
  const int64_t D = c.hidden_size, H = c.num_attention_heads;
  auto lin = [&](const std::string& name, int64_t n_out, int64_t n_in, double gain,
                 const std::function<void(std::vector<float>&)>& edit = {}) {
    w.Matrix(name, n_out, n_in, gain / std::sqrt(static_cast<double>(n_in)), 0.0, edit);
  };
  auto mlp = [&](const std::string& p, int64_t inter) {
    lin(p + ".gate_proj.weight", inter, D, 1.0);
    lin(p + ".up_proj.weight", inter, D, 1.0);
    lin(p + ".down_proj.weight", D, inter, 0.5);
  };

  // Structure that gives the Lightning Indexer's choices clear margins (trained models have
  // it; i.i.d. weights do not, and their near-ties make two correct implementations diverge):
  //  * every embedding carries a common direction y_dir and a "salience" direction z_dir with
  //    sign +1 for ~12% of the vocabulary (salient tokens) and -1 for the rest;
  //  * the indexer's queries pick up y_dir (through q_a_proj and wq_b), its keys pick up z_dir
  //    (through wk), both into the same non-RoPE key dimensions u_dir, and weights_proj reads
  //    y_dir so every head weight is positive. Salient keys then score far above zero and the
  //    others exactly zero (ReLU): with fewer salient keys than index_topk in context, the
  //    selection is "all salient keys, then the earliest others" with no near-ties.
  //  * router and lm_head rows are made orthogonal to y_dir and z_dir so those constant
  //    components do not decide experts or tokens.
  const std::vector<float> y_dir = w.UnitVector(D);
  std::vector<float> z_dir = w.UnitVector(D);
  {
    double dot = 0, norm = 0;
    for (int64_t i = 0; i < D; ++i) dot += double(y_dir[i]) * z_dir[i];
    for (int64_t i = 0; i < D; ++i) norm += std::pow(z_dir[i] -= static_cast<float>(dot) * y_dir[i], 2);
    for (auto& x : z_dir) x = static_cast<float>(x / std::sqrt(norm));
  }
  const std::vector<float> v_dir = w.UnitVector(c.q_lora_rank);
  const int64_t ID = c.index_head_dim, dr = c.qk_rope_head_dim, n_nope = ID - dr;
  std::vector<float> u_dir(static_cast<size_t>(ID), 0.0f);  // zero on the RoPE dims (first dr)
  for (int64_t j = 0; j < n_nope; ++j)  // balanced signs: zero mean survives the LayerNorm
    u_dir[dr + j] = static_cast<float>(((j * 7 + 3) % n_nope < n_nope / 2 ? 1.0 : -1.0) / std::sqrt(double(n_nope)));
  const double sqrt_d = std::sqrt(static_cast<double>(D));
  auto add_outer = [](std::vector<float>& m, int64_t n_in, const std::vector<float>& out_dir,
                      const std::vector<float>& in_dir, double scale) {
    for (size_t i = 0; i < out_dir.size(); ++i)
      for (int64_t j = 0; j < n_in; ++j) m[i * n_in + j] += static_cast<float>(scale * out_dir[i] * in_dir[j]);
  };
  auto project_out = [&](std::vector<float>& m, int64_t n_out) {
    for (int64_t i = 0; i < n_out; ++i)
      for (const std::vector<float>* dir : std::array<const std::vector<float>*, 2>{&y_dir, &z_dir}) {
        double dot = 0;
        for (int64_t j = 0; j < D; ++j) dot += double(m[i * D + j]) * (*dir)[j];
        for (int64_t j = 0; j < D; ++j) m[i * D + j] -= static_cast<float>(dot * (*dir)[j]);
      }
  };

  w.Matrix("model.embed_tokens.weight", c.vocab_size, D, 1.0, 0.0, [&](std::vector<float>& m) {
    for (int64_t v = 0; v < c.vocab_size; ++v) {
      // Salient tokens: a fixed hash of the id, so presets of any vocabulary keep ~12%.
      const bool salient = ((static_cast<uint64_t>(v) * 0x9E3779B97F4A7C15ull) >> 57) < 16;
      for (int64_t j = 0; j < D; ++j)
        m[v * D + j] += static_cast<float>(0.5 * sqrt_d * (y_dir[j] + (salient ? 1.0 : -1.0) * z_dir[j]));
    }
  });
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    const std::string a = p + "self_attn.";
    w.Vector(p + "input_layernorm.weight", D, 0.1, 1.0);
    lin(a + "q_a_proj.weight", c.q_lora_rank, D, 1.0,
        [&](std::vector<float>& m) { add_outer(m, D, v_dir, y_dir, 4.0 * std::sqrt(double(c.q_lora_rank)) / sqrt_d); });
    w.Vector(a + "q_a_layernorm.weight", c.q_lora_rank, 0.1, 1.0);
    // q_b and kv_b get gain > 1 so attention scores span a few units: softmax is then peaked
    // enough that attention is not a plain average.
    lin(a + "q_b_proj.weight", H * c.qk_head_dim(), c.q_lora_rank, 2.0);
    lin(a + "kv_a_proj_with_mqa.weight", c.kv_lora_rank + c.qk_rope_head_dim, D, 1.0);
    w.Vector(a + "kv_a_layernorm.weight", c.kv_lora_rank, 0.1, 1.0);
    lin(a + "kv_b_proj.weight", H * (c.qk_nope_head_dim + c.v_head_dim), c.kv_lora_rank, 2.0);
    lin(a + "o_proj.weight", D, H * c.v_head_dim, 0.5);
    lin(a + "indexer.wq_b.weight", c.index_n_heads * ID, c.q_lora_rank, 1.0, [&](std::vector<float>& m) {
      std::vector<float> heads_u(static_cast<size_t>(c.index_n_heads * ID));
      for (int64_t h = 0; h < c.index_n_heads; ++h) std::copy(u_dir.begin(), u_dir.end(), heads_u.begin() + h * ID);
      add_outer(m, c.q_lora_rank, heads_u, v_dir, 3.0 * std::sqrt(double(n_nope)) / std::sqrt(double(c.q_lora_rank)));
    });
    lin(a + "indexer.wk.weight", ID, D, 1.0,
        [&](std::vector<float>& m) { add_outer(m, D, u_dir, z_dir, 4.0 * std::sqrt(double(n_nope)) / sqrt_d); });
    w.Vector(a + "indexer.k_norm.weight", ID, 0.1, 1.0);
    w.Vector(a + "indexer.k_norm.bias", ID, 0.1, 0.0);
    lin(a + "indexer.weights_proj.weight", c.index_n_heads, D, 1.0, [&](std::vector<float>& m) {
      std::vector<float> ones(static_cast<size_t>(c.index_n_heads), 1.0f);
      add_outer(m, D, ones, y_dir, 2.0 / sqrt_d * std::sqrt(double(D)) / 4.0);
    });
    w.Vector(p + "post_attention_layernorm.weight", D, 0.1, 1.0);
    if (!c.IsMoeLayer(l)) {
      mlp(p + "mlp", c.intermediate_size);
      continue;
    }
    // Router logits with std ~3 spread sigmoid scores over (0, 1): clear gaps between experts.
    lin(p + "mlp.gate.weight", c.n_routed_experts, D, 3.0,
        [&](std::vector<float>& m) { project_out(m, c.n_routed_experts); });
    w.Vector(p + "mlp.gate.e_score_correction_bias", c.n_routed_experts, 0.05, 0.0, DType::kF32);
    for (int64_t e = 0; e < c.n_routed_experts; ++e) mlp(p + "mlp.experts." + std::to_string(e), c.moe_intermediate_size);
    if (c.n_shared_experts > 0) mlp(p + "mlp.shared_experts", c.n_shared_experts * c.moe_intermediate_size);
  }
  w.Vector("model.norm.weight", D, 0.1, 1.0);
  // lm_head gain 4: logits with std ~4 give greedy steps clear top-1 margins.
  lin("lm_head.weight", c.vocab_size, D, 4.0, [&](std::vector<float>& m) { project_out(m, c.vocab_size); });
  return w.Finish(c);
}

}  // namespace pdserve::model
