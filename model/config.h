// ModelConfig: the DeepSeek-V3.2 architecture hyper-parameters, read from a Hugging Face
// `config.json` (HF field names) and validated before any weight is touched.
//
// Symbols used across model/ (docs/model-numerics.md): D hidden_size, H num_attention_heads,
// dn/dr/dv qk_nope/qk_rope/v head dims, Lq q_lora_rank, Lkv kv_lora_rank, IH/ID indexer heads
// and head dim, K index_topk.
// Thread-safety: a value type, immutable once loaded.
#pragma once

#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "common/status.h"

namespace pdserve::model {

struct YarnConfig {
  bool enabled = false;
  double factor = 1.0;
  int64_t original_max_position_embeddings = 4096;
  double beta_fast = 32.0;
  double beta_slow = 1.0;
  double mscale = 1.0;
  double mscale_all_dim = 1.0;
};

struct ModelConfig {
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;             // D
  int64_t intermediate_size = 0;       // dense MLP
  int64_t moe_intermediate_size = 0;   // per routed expert
  int64_t num_hidden_layers = 0;
  int64_t num_attention_heads = 0;     // H
  int64_t n_shared_experts = 0;
  int64_t n_routed_experts = 0;
  double routed_scaling_factor = 1.0;
  int64_t kv_lora_rank = 0;            // Lkv
  int64_t q_lora_rank = 0;             // Lq
  int64_t qk_rope_head_dim = 0;        // dr
  int64_t qk_nope_head_dim = 0;        // dn
  int64_t v_head_dim = 0;              // dv
  int64_t n_group = 1;
  int64_t topk_group = 1;
  int64_t num_experts_per_tok = 1;
  int64_t first_k_dense_replace = 0;
  bool norm_topk_prob = true;
  std::string topk_method = "noaux_tc";
  std::string scoring_func = "sigmoid";
  double rope_theta = 10000.0;
  int64_t max_position_embeddings = 4096;
  int64_t index_n_heads = 0;           // IH
  int64_t index_head_dim = 0;          // ID
  int64_t index_topk = 0;              // K
  YarnConfig yarn;
  // Weight format of the checkpoint: "bf16"; "fp8" when quantization_config says fp8 (E4M3,
  // 128x128 block scales); "w8a8_int8" for pdserve's W8A8 (docs/quantization.md: I8 weights
  // with per-output-channel F32 `weight_scale`, dynamic per-token INT8 activations).
  std::string weight_format = "bf16";

  // Derived quantities.
  int64_t qk_head_dim() const { return qk_nope_head_dim + qk_rope_head_dim; }
  bool IsMoeLayer(int64_t layer) const { return layer >= first_k_dense_replace && n_routed_experts > 0; }
  // YaRN attention-score multiplier m^2 (1 without YaRN), m = 0.1*mscale_all_dim*ln(factor)+1.
  double MscaleSquared() const;
  // MLA softmax scale: (dn+dr)^-0.5 * m^2.
  float AttentionScale() const;

  // Errors: InvalidArgument naming the field that is missing, mistyped or unsupported.
  static Result<ModelConfig> FromJson(const nlohmann::json& j, const std::string& where);
  static Result<ModelConfig> Load(const std::string& config_json_path);
  // The HF config.json form (as DeepSeek-V3.2-Exp publishes it).
  nlohmann::json ToJson() const;
  // Checks ranges and divisibility (experts per group, fp8 block alignment). Errors: InvalidArgument.
  Status Validate() const;
};

}  // namespace pdserve::model
