#include "model/weights.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "comm/shard.h"
#include "common/dtype.h"
#include "common/mapped_file.h"
#include "common/thread_pool.h"
#include "model/fp8_blocks.h"
#include "model/mapped_pages.h"
#include "model/tensor_names.h"

namespace pdserve::model {

namespace {

class Loader {
 public:
  explicit Loader(Checkpoint& ckpt) : ckpt_(ckpt) {}

  // A matrix [n_out, n_in]: BF16/F32 used in place; F8_E4M3 + weight_scale_inv dequantized;
  // I8 + weight_scale (W8A8 checkpoints, where allow_int8) used in place.
  Status LoadLinear(const std::string& name, int64_t n_out, int64_t n_in, Linear* out,
                    bool allow_int8 = true) {
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
      case DType::kI8: return UseInt8(name, *t, allow_int8, out);
      default:
        return Status::InvalidArgument("tensor '" + name + "' has dtype " + std::string(DTypeName(t->dtype)) +
                                           ", expected BF16, F32, F8_E4M3 or I8",
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

  // Unused tensors are errors, except the MTP layer and, for an EP-sliced load from the full
  // index, the other ranks' experts. From a rank's own index, another rank's expert is an error.
  // foreign_only: report only the other ranks' experts (checked before the missing tensors,
  // which they usually explain).
  Status CheckNoneUnused(const ModelConfig& cfg, int64_t e_begin, int64_t e_end, bool rank_index,
                         const std::string& rank_label, bool foreign_only) {
    std::vector<std::string> unexpected, foreign;
    for (const auto& name : ckpt_.UnusedNames()) {
      PDSERVE_ASSIGN_OR_RETURN(const TensorName parsed, ParseTensorName(name));
      if (parsed.layer == cfg.num_hidden_layers) continue;  // the MTP layer: inference ignores it
      if (parsed.expert >= 0 && (parsed.expert < e_begin || parsed.expert >= e_end)) {
        if (rank_index) foreign.push_back(name);
        continue;
      }
      unexpected.push_back(name);
    }
    if (!foreign.empty())
      return Status::InvalidArgument(rank_label + " holds experts [" + std::to_string(e_begin) + ", " +
                                         std::to_string(e_end) + ") but its files hold " + List(foreign),
                                     ckpt_.dir());
    if (unexpected.empty() || foreign_only) return Status::Ok();
    return Status::InvalidArgument("unexpected tensors: " + List(unexpected), ckpt_.dir());
  }

  static std::string List(const std::vector<std::string>& names) {
    std::string list;
    for (size_t i = 0; i < names.size() && i < 20; ++i) list += (i ? ", " : "") + names[i];
    if (names.size() > 20) list += ", ... (" + std::to_string(names.size()) + " in all)";
    return list;
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

  // W8A8: the int8 matrix and its per-row scales stay in the mapping.
  Status UseInt8(const std::string& name, const TensorInfo& t, bool allowed, Linear* out) {
    if (ckpt_.config().weight_format != "w8a8_int8")
      return Status::InvalidArgument("I8 tensor '" + name + "' in a checkpoint whose config.json has no "
                                     "quantization_config with quant_method 'w8a8_int8'", t.file);
    if (!allowed)
      return Status::InvalidArgument("tensor '" + name + "' must be BF16/F32/F8_E4M3: the forward pass reads "
                                     "it directly, I8 is not supported there", t.file);
    const std::string scale_name = name.substr(0, name.size() - 7) + ".weight_scale";  // "...weight"
    const TensorInfo* s = ckpt_.Find(scale_name);
    const int64_t n_out = t.shape[0], n_in = t.shape[1];
    if (!s) return Status::InvalidArgument("I8 tensor '" + name + "' has no '" + scale_name + "'", t.file);
    if (s->dtype != DType::kF32 || s->shape != std::vector<int64_t>{n_out})
      return Status::InvalidArgument("tensor '" + scale_name + "' must be F32 [" + std::to_string(n_out) + "], got " +
                                         std::string(DTypeName(s->dtype)) + " " + s->ShapeString(),
                                     s->file);
    if (n_in > kernels::kGemmInt8MaxK)
      return Status::InvalidArgument("I8 tensor '" + name + "' has n_in " + std::to_string(n_in) +
                                         " > " + std::to_string(kernels::kGemmInt8MaxK) + " (int32 accumulation bound)",
                                     t.file);
    const float* scales = reinterpret_cast<const float*>(s->data);
    for (int64_t j = 0; j < n_out; ++j)
      if (!std::isfinite(scales[j]) || scales[j] < 0.0f)
        return Status::InvalidArgument("tensor '" + scale_name + "' has a negative or non-finite scale at row " +
                                           std::to_string(j),
                                       s->file);
    out->int8 = {reinterpret_cast<const int8_t*>(t.data), scales, n_out, n_in, n_in};
    out->view = {DType::kBF16, nullptr, n_out, n_in, n_in};
    return Status::Ok();
  }

  Status DequantFp8(const std::string& name, const TensorInfo& t, Linear* out) {
    const TensorInfo* s = ckpt_.Find(Fp8ScaleName(name));
    PDSERVE_RETURN_IF_ERROR(CheckFp8BlockScales(name, t, s));
    const int64_t n_out = t.shape[0], n_in = t.shape[1];
    const float* scale = reinterpret_cast<const float*>(s->data);
    out->owned_bf16.resize(static_cast<size_t>(n_out * n_in));
    std::vector<float> row(static_cast<size_t>(n_in));
    for (int64_t i = 0; i < n_out; ++i) {
      DequantFp8Rows(t.data, scale, n_in, i, i + 1, row.data());
      uint16_t* o = out->owned_bf16.data() + i * n_in;
      for (int64_t j = 0; j < n_in; ++j) o[j] = F32ToBf16Bits(row[static_cast<size_t>(j)]);
    }
    out->view = {DType::kBF16, out->owned_bf16.data(), n_out, n_in, n_in};
    // The FP8 bytes are no longer needed: drop their pages from this process (only pages wholly
    // inside the tensor: its neighbours may be used in place).
    DropPages(t.data, t.n_bytes, PagesInside(t.data, t.n_bytes));
    return Status::Ok();
  }

  Checkpoint& ckpt_;
  std::vector<std::string> missing_;
};

// Tensor-parallel shards as views: rows [begin, begin + n) or input columns [begin, begin + n).
void SliceRows(Linear* w, int64_t begin, int64_t n) {
  if (w->is_int8()) {
    w->int8.data += begin * w->int8.ld;
    w->int8.scales += begin;
    w->int8.n_out = n;
  }
  if (w->view.data)
    w->view.data = static_cast<const uint8_t*>(w->view.data) + begin * w->view.ld * static_cast<int64_t>(DTypeSize(w->view.dtype));
  w->view.n_out = n;
}

Status SliceColumns(const std::string& name, Linear* w, int64_t begin, int64_t n) {
  if (w->is_int8())
    return Status::InvalidArgument("tensor '" + name + "' is W8A8: its per-token activation scale covers the whole "
                                   "input row, so it cannot be sharded by input columns (use tp = 1)");
  if (w->view.data)
    w->view.data = static_cast<const uint8_t*>(w->view.data) + begin * static_cast<int64_t>(DTypeSize(w->view.dtype));
  w->view.n_in = n;
  return Status::Ok();
}

bool Packable(const Linear& w) {
  return !w.is_int8() && w.view.dtype == DType::kBF16 && w.view.data != nullptr && w.view.n_out > 0 &&
         w.view.n_in > 0;
}

// Prepacks a projection into dst (PackForGemm) and drops the checkpoint pages it no longer
// needs: only a contiguous view's pages wholly inside it (neighbours may be used in place).
void PackAndDrop(Linear* w, void* dst) {
  const bool mapped = w->owned_bf16.empty();
  const void* rows = w->view.data;
  const size_t bytes = static_cast<size_t>(w->view.n_out * w->view.n_in) * 2;
  const bool contiguous = w->view.ld == w->view.n_in;
  // Map the source's pages in one call rather than a fault per page.
  if (mapped && contiguous) PrefaultPages(rows, bytes);
  PackForGemm(w, dst, nullptr);
  if (mapped && contiguous) DropPages(rows, bytes, PagesInside(rows, bytes));
}

bool PackingWanted(const LoadOptions& opt) {
  const char* env = std::getenv("PDSERVE_PACKED_WEIGHTS");
  return opt.pack_bf16 && !(env != nullptr && std::string(env) == "0");
}

}  // namespace

std::string EpIndexName(int64_t ep_rank, int64_t ep_size) {
  return "model-ep" + std::to_string(ep_rank) + "-of-" + std::to_string(ep_size) + ".safetensors.index.json";
}

Result<std::unique_ptr<ModelWeights>> ModelWeights::Load(const std::string& model_dir, const LoadOptions& opt) {
  if (opt.ep_size < 1 || opt.ep_rank < 0 || opt.ep_rank >= opt.ep_size)
    return Status::InvalidArgument("bad expert-parallel rank " + std::to_string(opt.ep_rank) + " of " +
                                   std::to_string(opt.ep_size));
  const std::string rank_label = "EP rank " + std::to_string(opt.ep_rank) + " of " + std::to_string(opt.ep_size);
  // A rank's own index, when the conversion wrote one, names only the shards that rank needs.
  bool rank_index = false;
  std::string index_name = "model.safetensors.index.json";
  if (opt.ep_size > 1) {
    const std::string path = model_dir + "/" + EpIndexName(opt.ep_rank, opt.ep_size);
    if (std::filesystem::exists(path)) {
      rank_index = true;
      index_name = EpIndexName(opt.ep_rank, opt.ep_size);
      PDSERVE_ASSIGN_OR_RETURN(std::string text, ReadFileToString(path));
      const auto j = nlohmann::json::parse(text, nullptr, false);
      const nlohmann::json* meta = j.is_object() && j.contains("metadata") ? &j["metadata"] : nullptr;
      if (!meta || !meta->is_object() || !(*meta)["ep_rank"].is_number_integer() ||
          !(*meta)["ep_size"].is_number_integer())
        return Status::InvalidArgument("rank index needs metadata.ep_rank and metadata.ep_size", path);
      if ((*meta)["ep_rank"].get<int64_t>() != opt.ep_rank || (*meta)["ep_size"].get<int64_t>() != opt.ep_size)
        return Status::InvalidArgument("index was written for EP rank " + (*meta)["ep_rank"].dump() + " of " +
                                           (*meta)["ep_size"].dump() + ", loading " + rank_label,
                                       path);
    }
  }
  auto w = std::unique_ptr<ModelWeights>(new ModelWeights());
  PDSERVE_ASSIGN_OR_RETURN(w->checkpoint_, Checkpoint::Open(model_dir, index_name));
  const ModelConfig& c = w->checkpoint_->config();
  w->config_ = c;
  if (c.n_routed_experts % opt.ep_size != 0)
    return Status::InvalidArgument("n_routed_experts (" + std::to_string(c.n_routed_experts) +
                                       ") is not divisible by the EP size " + std::to_string(opt.ep_size),
                                   model_dir);
  w->expert_begin_ = opt.ep_rank * c.n_routed_experts / opt.ep_size;
  w->expert_end_ = (opt.ep_rank + 1) * c.n_routed_experts / opt.ep_size;
  const int64_t D = c.hidden_size, H = c.num_attention_heads;
  if (opt.tp_size < 1 || opt.tp_rank < 0 || opt.tp_rank >= opt.tp_size || H % opt.tp_size != 0 ||
      opt.tp_size > c.vocab_size)
    return Status::InvalidArgument("bad tensor-parallel rank " + std::to_string(opt.tp_rank) + " of " +
                                       std::to_string(opt.tp_size) + " for " + std::to_string(H) + " heads",
                                   model_dir);
  const bool tp = opt.tp_size > 1;
  const comm::ShardRange vocab = comm::EvenShard(c.vocab_size, static_cast<int>(opt.tp_size), static_cast<int>(opt.tp_rank));
  const comm::ShardRange heads = comm::HeadShard(H, static_cast<int>(opt.tp_size), static_cast<int>(opt.tp_rank));
  w->vocab_begin_ = vocab.begin;
  w->head_begin_ = heads.begin;
  w->local_heads_ = heads.size();
  Loader ld(*w->checkpoint_);
  PDSERVE_RETURN_IF_ERROR(ld.LoadLinear("model.embed_tokens.weight", c.vocab_size, D, &w->embed_, /*allow_int8=*/false));
  PDSERVE_RETURN_IF_ERROR(ld.LoadLinear("lm_head.weight", c.vocab_size, D, &w->lm_head_));
  if (tp) {
    SliceRows(&w->embed_, vocab.begin, vocab.size());
    SliceRows(&w->lm_head_, vocab.begin, vocab.size());
  }
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
    PDSERVE_RETURN_IF_ERROR(ld.LoadLinear(a + "kv_b_proj.weight", H * (c.qk_nope_head_dim + c.v_head_dim), c.kv_lora_rank, &L.kv_b,
                                          /*allow_int8=*/false));
    PDSERVE_RETURN_IF_ERROR(ld.LoadLinear(a + "o_proj.weight", D, H * c.v_head_dim, &L.o));
    if (tp) {
      const int64_t dv = c.v_head_dim, dkv = c.qk_nope_head_dim + c.v_head_dim;
      SliceRows(&L.q_b, heads.begin * c.qk_head_dim(), heads.size() * c.qk_head_dim());
      SliceRows(&L.kv_b, heads.begin * dkv, heads.size() * dkv);
      PDSERVE_RETURN_IF_ERROR(SliceColumns(a + "o_proj.weight", &L.o, heads.begin * dv, heads.size() * dv));
    }
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
    for (int64_t e = w->expert_begin_; e < w->expert_end_; ++e)
      PDSERVE_RETURN_IF_ERROR(ld.LoadMlp(p + "mlp.experts." + std::to_string(e), D, c.moe_intermediate_size,
                                         &L.experts[static_cast<size_t>(e)]));
    if (c.n_shared_experts > 0)
      PDSERVE_RETURN_IF_ERROR(ld.LoadMlp(p + "mlp.shared_experts", D, c.n_shared_experts * c.moe_intermediate_size, &L.shared));
  }
  // Another rank's experts in this rank's files explain its missing ones: report that first.
  PDSERVE_RETURN_IF_ERROR(ld.CheckNoneUnused(c, w->expert_begin_, w->expert_end_, rank_index, rank_label, true));
  PDSERVE_RETURN_IF_ERROR(ld.MissingSummary());
  PDSERVE_RETURN_IF_ERROR(ld.CheckNoneUnused(c, w->expert_begin_, w->expert_end_, rank_index, rank_label, false));
  if (PackingWanted(opt)) {
    // Every projection to pack, laid out in one populated arena, then packed on a short-lived
    // pool (one matrix per task).
    std::vector<Linear*> todo;
    auto add = [&](Linear* lin) {
      if (Packable(*lin)) todo.push_back(lin);
    };
    add(&w->lm_head_);
    const int64_t dn = c.qk_nope_head_dim, dv = c.v_head_dim, n_heads = w->local_heads_;
    for (LayerWeights& L : w->layers_) {
      for (Linear* lin : {&L.q_a, &L.q_b, &L.kv_a, &L.o, &L.idx_wq_b, &L.idx_wk, &L.idx_weights_proj, &L.router}) add(lin);
      for (MlpWeights* m : {&L.dense, &L.shared}) {
        for (Linear* lin : {&m->gate, &m->up, &m->down}) add(lin);
      }
      for (MlpWeights& m : L.experts) {
        for (Linear* lin : {&m.gate, &m.up, &m.down}) add(lin);
      }
      if (L.kv_b.view.dtype == DType::kBF16 && L.kv_b.view.data != nullptr) {
        L.kv_b_uv.resize(static_cast<size_t>(n_heads));
        L.kv_b_uk_t.resize(static_cast<size_t>(n_heads));
      }
    }
    const int64_t n_linear = static_cast<int64_t>(todo.size());
    const int64_t uv_bytes = kernels::Bf16PanelBytes(dv, c.kv_lora_rank);
    const int64_t uk_bytes = kernels::Bf16PanelBytes(c.kv_lora_rank, dn);
    std::vector<size_t> offset(static_cast<size_t>(n_linear) + 1, 0);
    for (int64_t i = 0; i < n_linear; ++i) {
      const Linear& lin = *todo[static_cast<size_t>(i)];
      offset[static_cast<size_t>(i) + 1] = offset[static_cast<size_t>(i)] +
                                           static_cast<size_t>(kernels::Bf16PanelBytes(lin.view.n_out, lin.view.n_in));
    }
    const size_t uv_begin = offset.back();
    // kv_b stays row-major (the query absorption reads W_uk rows) but moves into the arena too:
    // a prefill reads all of it, and in the checkpoint's 4 KiB file pages it goes cold between
    // requests (mapped_pages.h). embed_tokens stays in the file: one row per token.
    const size_t uk_begin = uv_begin + static_cast<size_t>(c.num_hidden_layers * n_heads * uv_bytes);
    const size_t kv_b_begin = uk_begin + static_cast<size_t>(c.num_hidden_layers * n_heads * uk_bytes);
    std::vector<Linear*> kv_b_moves;
    std::vector<size_t> kv_b_offset(1, kv_b_begin);
    for (LayerWeights& L : w->layers_) {
      const kernels::WeightView& v = L.kv_b.view;
      if (!Packable(L.kv_b) || !L.kv_b.owned_bf16.empty() || v.ld != v.n_in) continue;
      kv_b_moves.push_back(&L.kv_b);
      kv_b_offset.push_back(kv_b_offset.back() + static_cast<size_t>(v.n_out * v.n_in) * 2);
    }
    const size_t total = kv_b_offset.back();
    PDSERVE_ASSIGN_OR_RETURN(w->packed_arena_, PopulatedPages::Map(total));
    uint8_t* arena = static_cast<uint8_t*>(w->packed_arena_.data());
    for (size_t i = 0; i < kv_b_moves.size(); ++i) {
      kernels::WeightView& v = kv_b_moves[i]->view;
      const size_t bytes = static_cast<size_t>(v.n_out * v.n_in) * 2;
      PrefaultPages(v.data, bytes);
      std::memcpy(arena + kv_b_offset[i], v.data, bytes);
      DropPages(v.data, bytes, PagesInside(v.data, bytes));
      v.data = arena + kv_b_offset[i];
    }
    ThreadPool pool(static_cast<int>(std::clamp<unsigned>(std::thread::hardware_concurrency(), 1, 4)));
    pool.ParallelFor(n_linear + c.num_hidden_layers * n_heads, [&](int64_t b, int64_t e) {
      for (int64_t t = b; t < e; ++t) {
        if (t < n_linear) {
          PackAndDrop(todo[static_cast<size_t>(t)], arena + offset[static_cast<size_t>(t)]);
          continue;
        }
        LayerWeights& L = w->layers_[static_cast<size_t>((t - n_linear) / n_heads)];
        if (L.kv_b_uv.empty()) continue;
        const int64_t h = (t - n_linear) % n_heads;
        const kernels::WeightView& kv_b = L.kv_b.view;
        const uint16_t* rows = static_cast<const uint16_t*>(kv_b.data) + (h * (dn + dv) + dn) * kv_b.ld;
        L.kv_b_uv[static_cast<size_t>(h)] = kernels::PackedBf16Weights::PackInto(
            {DType::kBF16, rows, dv, kv_b.n_in, kv_b.ld}, arena + uv_begin + (t - n_linear) * uv_bytes, nullptr);
        const uint16_t* uk = static_cast<const uint16_t*>(kv_b.data) + h * (dn + dv) * kv_b.ld;
        std::vector<uint16_t> uk_t(static_cast<size_t>(kv_b.n_in * dn));
        for (int64_t d = 0; d < dn; ++d)
          for (int64_t j = 0; j < kv_b.n_in; ++j) uk_t[static_cast<size_t>(j * dn + d)] = uk[d * kv_b.ld + j];
        L.kv_b_uk_t[static_cast<size_t>(h)] = kernels::PackedBf16Weights::PackInto(
            {DType::kBF16, uk_t.data(), kv_b.n_in, dn, dn}, arena + uk_begin + (t - n_linear) * uk_bytes, nullptr);
      }
    });
  }
  return w;
}

std::string ModelWeights::PackedSummary() const {
  if (packed_arena_.size() == 0) return "weights not packed";
  return "BF16 weights arena (packed projections, kv_b) " + std::to_string(packed_arena_.size() >> 20) + " MiB, " +
         std::to_string(packed_arena_.HugeBytes() >> 20) + " MiB of it in huge pages";
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
