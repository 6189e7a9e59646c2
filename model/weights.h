// ModelWeights: every tensor of a DeepSeek-V3.2 checkpoint, validated against the config and
// held as kernel-ready views.
//
// BF16 and F32 matrices are used in place from the mmap'd checkpoint (no copy). FP8 (E4M3)
// matrices with 128x128 `weight_scale_inv` blocks are dequantized once at load into owned BF16
// storage (w = bf16(fp8 * scale_inv[i/128][j/128])); the FP8 pages are then released with
// madvise, so the process never holds two copies. Norm vectors (small) are converted to fp32.
// W8A8 checkpoints (config quant_method "w8a8_int8", docs/quantization.md): I8 matrices with
// their F32 `<name>_scale` [n_out] are used in place from the mmap (no BF16 detour); I8 is
// refused where the forward pass reads the matrix directly (embed_tokens, kv_b_proj).
//
// Expert parallelism: LoadOptions{ep_rank, ep_size} loads only experts [ep_rank * E / ep_size,
// (ep_rank + 1) * E / ep_size) of every MoE layer (the other entries of `experts` stay empty)
// plus every non-expert tensor. If the directory has the rank's own index
// (model-ep{r}-of-{N}.safetensors.index.json, written by `pdserve convert --ep-size N`), only
// the shards it names are opened, and it must hold exactly that rank's experts.
// Tensor parallelism: LoadOptions{tp_rank, tp_size} keeps only this rank's shards (comm/shard.h):
// vocabulary rows EvenShard(vocab) of embed_tokens and lm_head, whole heads HeadShard(H) of
// q_b_proj and kv_b_proj (rows) and of o_proj (input columns, a strided view). The other
// tensors stay whole (replicated). Shards are views into the mapping, so pages of the other
// shards are never touched (FP8 matrices are dequantized whole, then sliced). W8A8 o_proj cannot
// be column-sharded (its activation scale covers the whole input row): InvalidArgument.
// Packing: BF16 projections are prepacked at load (LoadOptions::pack_bf16); embed_tokens and
// kv_b_proj, which the forward pass reads by rows, stay row-major views.
// Thread-safety: immutable after Load(); safe to read from any thread.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "model/checkpoint.h"
#include "model/config.h"
#include "model/linear.h"
#include "model/mapped_pages.h"

namespace pdserve::model {

struct MlpWeights {
  Linear gate, up, down;  // gate_proj (W1), up_proj (W3), down_proj (W2)
};

struct LayerWeights {
  std::vector<float> attn_norm, ffn_norm;
  Linear q_a, q_b, kv_a, kv_b, o;
  // W_uv of each local head (kv_b_proj rows h*(dn+dv)+dn .. +dv, [dv, Lkv]) prepacked for the
  // absorbed attention's output GEMM, and W_uk of each head transposed ([Lkv, dn]: output j of
  // the query absorption reads column j of rows h*(dn+dv) .. +dn) prepacked for the absorption
  // GEMM of decode batches. Both empty when kv_b is not BF16 or packing is off; the absorption
  // then reads kv_b's rows (kernels::AbsorbQueries, the same chains), as it does for batches
  // of more rows (model/attention.cc, kAbsorbGemmMaxRows).
  std::vector<kernels::PackedBf16Weights> kv_b_uv, kv_b_uk_t;
  std::vector<float> q_norm, kv_norm;
  // Lightning indexer
  Linear idx_wq_b, idx_wk, idx_weights_proj;
  std::vector<float> idx_k_norm_w, idx_k_norm_b;
  // FFN: dense layers fill `dense`; MoE layers fill the rest.
  bool is_moe = false;
  MlpWeights dense;
  Linear router;                      // mlp.gate.weight [E, D]
  std::vector<float> router_bias;     // e_score_correction_bias [E]
  std::vector<MlpWeights> experts;    // index = expert id
  MlpWeights shared;
};

struct LoadOptions {
  int64_t ep_rank = 0;
  int64_t ep_size = 1;
  int64_t tp_rank = 0;
  int64_t tp_size = 1;
  // Prepack every BF16 projection for the GEMM kernels (PackForGemm, model/linear.h): the
  // checkpoint's pages of a packed tensor are then dropped, so the process holds one copy.
  // The environment variable PDSERVE_PACKED_WEIGHTS=0 turns it off (side-by-side runs).
  bool pack_bf16 = true;
};

// The per-rank index file name of an expert-parallel checkpoint.
std::string EpIndexName(int64_t ep_rank, int64_t ep_size);

class ModelWeights {
 public:
  // Loads and validates every tensor. Errors (InvalidArgument, naming file and tensor): a
  // tensor missing, of the wrong shape or dtype, an FP8 weight without its scale, tensors the
  // architecture does not use ("unexpected tensors: a, b, ..."), or any Checkpoint error.
  // With ep_size > 1 also: InvalidArgument for a bad rank/size, E not divisible by ep_size, a
  // rank index made for another rank, or files holding another rank's experts.
  static Result<std::unique_ptr<ModelWeights>> Load(const std::string& model_dir,
                                                    const LoadOptions& options = {});

  const ModelConfig& config() const { return config_; }
  const LayerWeights& layer(int64_t i) const { return layers_[static_cast<size_t>(i)]; }
  // Embedding rows [V, D] (BF16 or F32 view into the checkpoint or owned storage); with TP,
  // rows [vocab_begin, vocab_begin + embed().n_out()) only, and likewise lm_head.
  const Linear& embed() const { return embed_; }
  const Linear& lm_head() const { return lm_head_; }
  const std::vector<float>& final_norm() const { return final_norm_; }
  // Routed experts held: [expert_begin, expert_end) (all of them unless EP-sliced).
  int64_t expert_begin() const { return expert_begin_; }
  int64_t expert_end() const { return expert_end_; }
  int64_t vocab_begin() const { return vocab_begin_; }
  // Attention heads held: [head_begin, head_begin + local_heads) (all of them without TP).
  int64_t head_begin() const { return head_begin_; }
  int64_t local_heads() const { return local_heads_; }
  // Writes embedding row `token` (a row of the held shard) as fp32 into out[D].
  // REQUIRES 0 <= token < embed().n_out().
  void EmbedRow(int64_t token, float* out) const;
  // For start-up logs: "BF16 weights arena (packed projections, kv_b) N MiB, M MiB of it in
  // huge pages", or "weights not packed".
  std::string PackedSummary() const;

 private:
  ModelConfig config_;
  std::unique_ptr<Checkpoint> checkpoint_;  // owns the mappings the views point into
  PopulatedPages packed_arena_;             // the prepacked BF16 weights and kv_b (LoadOptions::pack_bf16)
  std::vector<LayerWeights> layers_;
  Linear embed_, lm_head_;
  std::vector<float> final_norm_;
  int64_t expert_begin_ = 0, expert_end_ = 0;
  int64_t vocab_begin_ = 0, head_begin_ = 0, local_heads_ = 0;
};

}  // namespace pdserve::model
