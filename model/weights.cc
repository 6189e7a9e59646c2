#include "model/weights.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>

#include "common/dtype.h"

namespace pdserve::model {

namespace {

class Loader {
 public:
  explicit Loader(Checkpoint& ckpt) : ckpt_(ckpt) {}

  // A matrix [n_out, n_in]: BF16/F32 used in place; F8_E4M3 + weight_scale_inv dequantized.
  Status LoadLinear(const std::string& name, int64_t n_out, int64_t n_in, Linear* out) {
    const TensorInfo* t = ckpt_.Find(name);
    if (!t) return Missing(name);
    if (t->shape != std::vector<int64_t>{n_out, n_in})
      return Status::InvalidArgument("tensor '" + name + "' has shape " + t->ShapeString() +
                                         ", config implies [" + std::to_string(n_out) + ", " +
                                         std::to_string(n_in) + "]",
                                     t->file);
    out->view = {DType::kBF16, t->data, n_out, n_in, n_in};
    switch (t->dtype) {
      case DType::kBF16: return Status::Ok();
      case DType::kF32: out->view.dtype = DType::kF32; return Status::Ok();
      case DType::kF8E4M3: return DequantFp8(name, *t, out);
      default:
        return Status::InvalidArgument("tensor '" + name + "' has dtype " + std::string(DTypeName(t->dtype)) +
                                           ", expected BF16, F32 or F8_E4M3",
                                       t->file);
    }
  }

  // A vector [n] of any float dtype, converted to fp32.
  Status LoadVector(const std::string& name, int64_t n, std::vector<float>* out) {
    const TensorInfo* t = ckpt_.Find(name);
    if (!t) return Missing(name);
    if (t->shape != std::vector<int64_t>{n})
      return Status::InvalidArgument("tensor '" + name + "' has shape " + t->ShapeString() +
                                         ", config implies [" + std::to_string(n) + "]",
                                     t->file);
    out->resize(static_cast<size_t>(n));
    if (t->dtype == DType::kBF16) {
      const uint16_t* p = reinterpret_cast<const uint16_t*>(t->data);
      for (int64_t i = 0; i < n; ++i) (*out)[static_cast<size_t>(i)] = Bf16ToF32(p[i]);
    } else if (t->dtype == DType::kF32) {
      std::memcpy(out->data(), t->data, static_cast<size_t>(n) * 4);
    } else {
      return Status::InvalidArgument("tensor '" + name + "' has dtype " + std::string(DTypeName(t->dtype)) +
                                         ", expected BF16 or F32",
                                     t->file);
    }
    return Status::Ok();
  }

  Status LoadMlp(const std::string& prefix, int64_t d, int64_t inter, MlpWeights* m) {
    PDSERVE_RETURN_IF_ERROR(LoadLinear(prefix + ".gate_proj.weight", inter, d, &m->gate));
    PDSERVE_RETURN_IF_ERROR(LoadLinear(prefix + ".up_proj.weight", inter, d, &m->up));
    return LoadLinear(prefix + ".down_proj.weight", d, inter, &m->down);
  }

  Status CheckNoneUnused(const ModelConfig& cfg) {
    std::vector<std::string> unexpected;
    const std::string mtp_prefix = "model.layers." + std::to_string(cfg.num_hidden_layers) + ".";
    for (const auto& name : ckpt_.UnusedNames()) {
      if (name.rfind(mtp_prefix, 0) == 0) continue;  // the MTP layer: inference ignores it
      unexpected.push_back(name);
    }
    if (unexpected.empty()) return Status::Ok();
    std::string list;
    for (size_t i = 0; i < unexpected.size() && i < 20; ++i) list += (i ? ", " : "") + unexpected[i];
    if (unexpected.size() > 20) list += ", ... (" + std::to_string(unexpected.size()) + " in all)";
    return Status::InvalidArgument("unexpected tensors: " + list, ckpt_.dir());
  }

  Status MissingSummary() const {
    if (missing_.empty()) return Status::Ok();
    std::string list;
    for (size_t i = 0; i < missing_.size() && i < 20; ++i) list += (i ? ", " : "") + missing_[i];
    if (missing_.size() > 20) list += ", ... (" + std::to_string(missing_.size()) + " in all)";
    return Status::InvalidArgument("missing tensors: " + list, ckpt_.dir());
  }

 private:
  // Missing tensors are collected so the error lists all of them at once; the loader continues
  // (with an empty view) and reports at the end.
  Status Missing(const std::string& name) {
    missing_.push_back(name);
    return Status::Ok();
  }

  Status DequantFp8(const std::string& name, const TensorInfo& t, Linear* out) {
    std::string scale_name = name + "_scale_inv";  // "...weight" -> "...weight_scale_inv"
    const TensorInfo* s = ckpt_.Find(scale_name);
    const int64_t n_out = t.shape[0], n_in = t.shape[1];
    const int64_t rb = (n_out + 127) / 128, cb = (n_in + 127) / 128;
    if (!s) return Status::InvalidArgument("FP8 tensor '" + name + "' has no '" + scale_name + "'", t.file);
    if (s->dtype != DType::kF32 || s->shape != std::vector<int64_t>{rb, cb})
      return Status::InvalidArgument("tensor '" + scale_name + "' must be F32 [" + std::to_string(rb) + ", " +
                                         std::to_string(cb) + "], got " + std::string(DTypeName(s->dtype)) + " " +
                                         s->ShapeString(),
                                     s->file);
    const float* scale = reinterpret_cast<const float*>(s->data);
    out->owned_bf16.resize(static_cast<size_t>(n_out * n_in));
    const float* table = Fp8E4M3DecodeTable();
    for (int64_t i = 0; i < n_out; ++i) {
      const float* srow = scale + (i / 128) * cb;
      for (int64_t j = 0; j < n_in; ++j) {
        const float v = table[t.data[i * n_in + j]] * srow[j / 128];
        out->owned_bf16[static_cast<size_t>(i * n_in + j)] = F32ToBf16Bits(v);
      }
    }
    out->view = {DType::kBF16, out->owned_bf16.data(), n_out, n_in, n_in};
    // The FP8 bytes are no longer needed: drop their page-cache pages from this process.
    const long page = sysconf(_SC_PAGESIZE);
    uintptr_t begin = (reinterpret_cast<uintptr_t>(t.data) + page - 1) & ~static_cast<uintptr_t>(page - 1);
    uintptr_t end = (reinterpret_cast<uintptr_t>(t.data) + t.n_bytes) & ~static_cast<uintptr_t>(page - 1);
    if (end > begin) madvise(reinterpret_cast<void*>(begin), end - begin, MADV_DONTNEED);
    return Status::Ok();
  }

  Checkpoint& ckpt_;
  std::vector<std::string> missing_;
};

}  // namespace

Result<std::unique_ptr<ModelWeights>> ModelWeights::Load(const std::string& model_dir) {
  auto w = std::unique_ptr<ModelWeights>(new ModelWeights());
  PDSERVE_ASSIGN_OR_RETURN(w->checkpoint_, Checkpoint::Open(model_dir));
  const ModelConfig& c = w->checkpoint_->config();
  w->config_ = c;
  Loader ld(*w->checkpoint_);
  const int64_t D = c.hidden_size, H = c.num_attention_heads;
  PDSERVE_RETURN_IF_ERROR(ld.LoadLinear("model.embed_tokens.weight", c.vocab_size, D, &w->embed_));
  PDSERVE_RETURN_IF_ERROR(ld.LoadLinear("lm_head.weight", c.vocab_size, D, &w->lm_head_));
  PDSERVE_RETURN_IF_ERROR(ld.LoadVector("model.norm.weight", D, &w->final_norm_));
  w->layers_.resize(static_cast<size_t>(c.num_hidden_layers));
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    LayerWeights& L = w->layers_[static_cast<size_t>(l)];
    const std::string p = "model.layers." + std::to_string(l) + ".";
    const std::string a = p + "self_attn.";
    PDSERVE_RETURN_IF_ERROR(ld.LoadVector(p + "input_layernorm.weight", D, &L.attn_norm));
    PDSERVE_RETURN_IF_ERROR(ld.LoadVector(p + "post_attention_layernorm.weight", D, &L.ffn_norm));
    PDSERVE_RETURN_IF_ERROR(ld.LoadLinear(a + "q_a_proj.weight", c.q_lora_rank, D, &L.q_a));
    PDSERVE_RETURN_IF_ERROR(ld.LoadVector(a + "q_a_layernorm.weight", c.q_lora_rank, &L.q_norm));
    PDSERVE_RETURN_IF_ERROR(ld.LoadLinear(a + "q_b_proj.weight", H * c.qk_head_dim(), c.q_lora_rank, &L.q_b));
    PDSERVE_RETURN_IF_ERROR(ld.LoadLinear(a + "kv_a_proj_with_mqa.weight", c.kv_lora_rank + c.qk_rope_head_dim, D, &L.kv_a));
    PDSERVE_RETURN_IF_ERROR(ld.LoadVector(a + "kv_a_layernorm.weight", c.kv_lora_rank, &L.kv_norm));
    PDSERVE_RETURN_IF_ERROR(ld.LoadLinear(a + "kv_b_proj.weight", H * (c.qk_nope_head_dim + c.v_head_dim), c.kv_lora_rank, &L.kv_b));
    PDSERVE_RETURN_IF_ERROR(ld.LoadLinear(a + "o_proj.weight", D, H * c.v_head_dim, &L.o));
    PDSERVE_RETURN_IF_ERROR(ld.LoadLinear(a + "indexer.wq_b.weight", c.index_n_heads * c.index_head_dim, c.q_lora_rank, &L.idx_wq_b));
    PDSERVE_RETURN_IF_ERROR(ld.LoadLinear(a + "indexer.wk.weight", c.index_head_dim, D, &L.idx_wk));
    PDSERVE_RETURN_IF_ERROR(ld.LoadVector(a + "indexer.k_norm.weight", c.index_head_dim, &L.idx_k_norm_w));
    PDSERVE_RETURN_IF_ERROR(ld.LoadVector(a + "indexer.k_norm.bias", c.index_head_dim, &L.idx_k_norm_b));
    PDSERVE_RETURN_IF_ERROR(ld.LoadLinear(a + "indexer.weights_proj.weight", c.index_n_heads, D, &L.idx_weights_proj));
    L.is_moe = c.IsMoeLayer(l);
    if (!L.is_moe) {
      PDSERVE_RETURN_IF_ERROR(ld.LoadMlp(p + "mlp", D, c.intermediate_size, &L.dense));
      continue;
    }
    PDSERVE_RETURN_IF_ERROR(ld.LoadLinear(p + "mlp.gate.weight", c.n_routed_experts, D, &L.router));
    PDSERVE_RETURN_IF_ERROR(ld.LoadVector(p + "mlp.gate.e_score_correction_bias", c.n_routed_experts, &L.router_bias));
    L.experts.resize(static_cast<size_t>(c.n_routed_experts));
    for (int64_t e = 0; e < c.n_routed_experts; ++e)
      PDSERVE_RETURN_IF_ERROR(ld.LoadMlp(p + "mlp.experts." + std::to_string(e), D, c.moe_intermediate_size,
                                         &L.experts[static_cast<size_t>(e)]));
    if (c.n_shared_experts > 0)
      PDSERVE_RETURN_IF_ERROR(ld.LoadMlp(p + "mlp.shared_experts", D, c.n_shared_experts * c.moe_intermediate_size, &L.shared));
  }
  PDSERVE_RETURN_IF_ERROR(ld.MissingSummary());
  PDSERVE_RETURN_IF_ERROR(ld.CheckNoneUnused(c));
  return w;
}

void ModelWeights::EmbedRow(int64_t token, float* out) const {
  const int64_t D = embed_.n_in();
  if (embed_.view.dtype == DType::kF32) {
    std::memcpy(out, static_cast<const float*>(embed_.view.data) + token * D, static_cast<size_t>(D) * 4);
    return;
  }
  const uint16_t* row = static_cast<const uint16_t*>(embed_.view.data) + token * D;
  for (int64_t i = 0; i < D; ++i) out[i] = Bf16ToF32(row[i]);
}

}  // namespace pdserve::model
