#include "model/config.h"

#include <cmath>

#include "common/json_excerpt.h"
#include "common/mapped_file.h"

namespace pdserve::model {

namespace {

// Reads one field with a type check; `required` fields must exist.
template <typename T>
Status ReadField(const nlohmann::json& j, const char* name, bool required, T* out,
                 const std::string& where) {
  auto it = j.find(name);
  if (it == j.end() || it->is_null()) {
    if (required) return Status::InvalidArgument(std::string("missing field '") + name + "'", where);
    return Status::Ok();
  }
  try {
    if constexpr (std::is_same_v<T, bool>) {
      if (!it->is_boolean()) throw std::runtime_error("not a boolean");
    } else if constexpr (std::is_integral_v<T>) {
      if (!it->is_number_integer()) throw std::runtime_error("not an integer");
    } else if constexpr (std::is_floating_point_v<T>) {
      if (!it->is_number()) throw std::runtime_error("not a number");
    } else {
      if (!it->is_string()) throw std::runtime_error("not a string");
    }
    *out = it->get<T>();
  } catch (const std::exception& e) {
    return Status::InvalidArgument(std::string("field '") + name + "' is " + e.what() +
                                       ": " + JsonExcerpt(*it),
                                   where);
  }
  return Status::Ok();
}

}  // namespace

double ModelConfig::MscaleSquared() const {
  if (!yarn.enabled || yarn.factor <= 1.0) return 1.0;
  const double m = 0.1 * yarn.mscale_all_dim * std::log(yarn.factor) + 1.0;
  return m * m;
}

float ModelConfig::AttentionScale() const {
  return static_cast<float>(std::pow(static_cast<double>(qk_head_dim()), -0.5) * MscaleSquared());
}

Result<ModelConfig> ModelConfig::FromJson(const nlohmann::json& j, const std::string& where) {
  if (!j.is_object()) return Status::InvalidArgument("config is not a JSON object", where);
  ModelConfig c;
  PDSERVE_RETURN_IF_ERROR(ReadField(j, "vocab_size", true, &c.vocab_size, where));
  PDSERVE_RETURN_IF_ERROR(ReadField(j, "hidden_size", true, &c.hidden_size, where));
  PDSERVE_RETURN_IF_ERROR(ReadField(j, "intermediate_size", true, &c.intermediate_size, where));
  PDSERVE_RETURN_IF_ERROR(ReadField(j, "moe_intermediate_size", true, &c.moe_intermediate_size, where));
  PDSERVE_RETURN_IF_ERROR(ReadField(j, "num_hidden_layers", true, &c.num_hidden_layers, where));
  PDSERVE_RETURN_IF_ERROR(ReadField(j, "num_attention_heads", true, &c.num_attention_heads, where));
  PDSERVE_RETURN_IF_ERROR(ReadField(j, "n_shared_experts", true, &c.n_shared_experts, where));
  PDSERVE_RETURN_IF_ERROR(ReadField(j, "n_routed_experts", true, &c.n_routed_experts, where));
  PDSERVE_RETURN_IF_ERROR(ReadField(j, "routed_scaling_factor", true, &c.routed_scaling_factor, where));
  PDSERVE_RETURN_IF_ERROR(ReadField(j, "kv_lora_rank", true, &c.kv_lora_rank, where));
  PDSERVE_RETURN_IF_ERROR(ReadField(j, "q_lora_rank", true, &c.q_lora_rank, where));
  PDSERVE_RETURN_IF_ERROR(ReadField(j, "qk_rope_head_dim", true, &c.qk_rope_head_dim, where));
  PDSERVE_RETURN_IF_ERROR(ReadField(j, "qk_nope_head_dim", true, &c.qk_nope_head_dim, where));
  PDSERVE_RETURN_IF_ERROR(ReadField(j, "v_head_dim", true, &c.v_head_dim, where));
  PDSERVE_RETURN_IF_ERROR(ReadField(j, "n_group", true, &c.n_group, where));
  PDSERVE_RETURN_IF_ERROR(ReadField(j, "topk_group", true, &c.topk_group, where));
  PDSERVE_RETURN_IF_ERROR(ReadField(j, "num_experts_per_tok", true, &c.num_experts_per_tok, where));
  PDSERVE_RETURN_IF_ERROR(ReadField(j, "first_k_dense_replace", true, &c.first_k_dense_replace, where));
  PDSERVE_RETURN_IF_ERROR(ReadField(j, "norm_topk_prob", false, &c.norm_topk_prob, where));
  PDSERVE_RETURN_IF_ERROR(ReadField(j, "topk_method", false, &c.topk_method, where));
  PDSERVE_RETURN_IF_ERROR(ReadField(j, "scoring_func", false, &c.scoring_func, where));
  PDSERVE_RETURN_IF_ERROR(ReadField(j, "rope_theta", false, &c.rope_theta, where));
  PDSERVE_RETURN_IF_ERROR(ReadField(j, "max_position_embeddings", false, &c.max_position_embeddings, where));
  PDSERVE_RETURN_IF_ERROR(ReadField(j, "index_n_heads", true, &c.index_n_heads, where));
  PDSERVE_RETURN_IF_ERROR(ReadField(j, "index_head_dim", true, &c.index_head_dim, where));
  PDSERVE_RETURN_IF_ERROR(ReadField(j, "index_topk", true, &c.index_topk, where));
  bool tie = false;
  PDSERVE_RETURN_IF_ERROR(ReadField(j, "tie_word_embeddings", false, &tie, where));
  if (tie) return Status::InvalidArgument("field 'tie_word_embeddings' = true is unsupported", where);

  auto rs = j.find("rope_scaling");
  if (rs != j.end() && !rs->is_null()) {
    if (!rs->is_object()) return Status::InvalidArgument("field 'rope_scaling' is not an object", where);
    std::string type;
    PDSERVE_RETURN_IF_ERROR(ReadField(*rs, "type", false, &type, where + " rope_scaling"));
    if (type.empty()) PDSERVE_RETURN_IF_ERROR(ReadField(*rs, "rope_type", false, &type, where + " rope_scaling"));
    if (type != "yarn")
      return Status::InvalidArgument("field 'rope_scaling.type' = '" + type + "' is unsupported (only yarn)", where);
    c.yarn.enabled = true;
    const std::string w = where + " rope_scaling";
    PDSERVE_RETURN_IF_ERROR(ReadField(*rs, "factor", true, &c.yarn.factor, w));
    PDSERVE_RETURN_IF_ERROR(ReadField(*rs, "original_max_position_embeddings", true, &c.yarn.original_max_position_embeddings, w));
    PDSERVE_RETURN_IF_ERROR(ReadField(*rs, "beta_fast", false, &c.yarn.beta_fast, w));
    PDSERVE_RETURN_IF_ERROR(ReadField(*rs, "beta_slow", false, &c.yarn.beta_slow, w));
    PDSERVE_RETURN_IF_ERROR(ReadField(*rs, "mscale", false, &c.yarn.mscale, w));
    PDSERVE_RETURN_IF_ERROR(ReadField(*rs, "mscale_all_dim", false, &c.yarn.mscale_all_dim, w));
  }
  auto qc = j.find("quantization_config");
  if (qc != j.end() && qc->is_object()) {
    std::string method;
    PDSERVE_RETURN_IF_ERROR(ReadField(*qc, "quant_method", false, &method, where + " quantization_config"));
    if (method == "fp8") {
      c.weight_format = "fp8";
      if (qc->contains("weight_block_size")) {
        const auto& b = (*qc)["weight_block_size"];
        if (!b.is_array() || b.size() != 2 || b[0] != 128 || b[1] != 128)
          return Status::InvalidArgument("field 'quantization_config.weight_block_size' must be [128, 128], got " + JsonExcerpt(b), where);
      }
    } else if (method == "w8a8_int8") {
      c.weight_format = "w8a8_int8";
      int64_t version = 1;
      PDSERVE_RETURN_IF_ERROR(ReadField(*qc, "format_version", false, &version, where + " quantization_config"));
      if (version != 1)
        return Status::InvalidArgument("field 'quantization_config.format_version' = " + std::to_string(version) +
                                           " is unsupported (only 1)", where);
    } else if (!method.empty()) {
      return Status::InvalidArgument("field 'quantization_config.quant_method' = '" + method + "' is unsupported", where);
    }
  }
  PDSERVE_RETURN_IF_ERROR(c.Validate().WithContext(where));
  return c;
}

Result<ModelConfig> ModelConfig::Load(const std::string& path) {
  PDSERVE_ASSIGN_OR_RETURN(std::string text, ReadFileToString(path));
  nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return Status::InvalidArgument("invalid JSON", path);
  return FromJson(j, path);
}

Status ModelConfig::Validate() const {
  auto positive = [](const char* name, int64_t v) -> Status {
    if (v <= 0) return Status::InvalidArgument(std::string("field '") + name + "' must be > 0, got " + std::to_string(v));
    return Status::Ok();
  };
  PDSERVE_RETURN_IF_ERROR(positive("vocab_size", vocab_size));
  PDSERVE_RETURN_IF_ERROR(positive("hidden_size", hidden_size));
  PDSERVE_RETURN_IF_ERROR(positive("num_hidden_layers", num_hidden_layers));
  PDSERVE_RETURN_IF_ERROR(positive("num_attention_heads", num_attention_heads));
  PDSERVE_RETURN_IF_ERROR(positive("kv_lora_rank", kv_lora_rank));
  PDSERVE_RETURN_IF_ERROR(positive("q_lora_rank", q_lora_rank));
  PDSERVE_RETURN_IF_ERROR(positive("qk_rope_head_dim", qk_rope_head_dim));
  PDSERVE_RETURN_IF_ERROR(positive("qk_nope_head_dim", qk_nope_head_dim));
  PDSERVE_RETURN_IF_ERROR(positive("v_head_dim", v_head_dim));
  PDSERVE_RETURN_IF_ERROR(positive("index_n_heads", index_n_heads));
  PDSERVE_RETURN_IF_ERROR(positive("index_head_dim", index_head_dim));
  PDSERVE_RETURN_IF_ERROR(positive("index_topk", index_topk));
  if (qk_rope_head_dim % 2)
    return Status::InvalidArgument("field 'qk_rope_head_dim' must be even, got " + std::to_string(qk_rope_head_dim));
  // The latent is fp8-quantized in blocks of 128 values, the indexer per head of 128 values.
  if (kv_lora_rank % 128)
    return Status::InvalidArgument("field 'kv_lora_rank' must be a multiple of 128 (fp8 blocks), got " + std::to_string(kv_lora_rank));
  if (index_head_dim != 128)
    return Status::InvalidArgument("field 'index_head_dim' must be 128 (one fp8 block per head), got " + std::to_string(index_head_dim));
  if (index_head_dim <= qk_rope_head_dim)
    return Status::InvalidArgument("field 'index_head_dim' must exceed 'qk_rope_head_dim'");
  if (first_k_dense_replace < num_hidden_layers) {
    PDSERVE_RETURN_IF_ERROR(positive("n_routed_experts", n_routed_experts));
    PDSERVE_RETURN_IF_ERROR(positive("moe_intermediate_size", moe_intermediate_size));
    PDSERVE_RETURN_IF_ERROR(positive("n_group", n_group));
    if (n_routed_experts % n_group)
      return Status::InvalidArgument("field 'n_routed_experts' (" + std::to_string(n_routed_experts) +
                                     ") must be divisible by 'n_group' (" + std::to_string(n_group) + ")");
    if (n_routed_experts / n_group < 2)
      return Status::InvalidArgument("each expert group needs >= 2 experts (group score = top-2 sum)");
    if (topk_group < 1 || topk_group > n_group)
      return Status::InvalidArgument("field 'topk_group' must be in [1, n_group], got " + std::to_string(topk_group));
    if (num_experts_per_tok < 1 || num_experts_per_tok > topk_group * (n_routed_experts / n_group))
      return Status::InvalidArgument("field 'num_experts_per_tok' = " + std::to_string(num_experts_per_tok) +
                                     " exceeds the experts of the kept groups");
    if (scoring_func != "sigmoid")
      return Status::InvalidArgument("field 'scoring_func' = '" + scoring_func + "' is unsupported (only sigmoid)");
    if (topk_method != "noaux_tc")
      return Status::InvalidArgument("field 'topk_method' = '" + topk_method + "' is unsupported (only noaux_tc)");
  }
  if (first_k_dense_replace > 0) PDSERVE_RETURN_IF_ERROR(positive("intermediate_size", intermediate_size));
  if (yarn.enabled && yarn.factor < 1.0)
    return Status::InvalidArgument("field 'rope_scaling.factor' must be >= 1");
  return Status::Ok();
}

nlohmann::json ModelConfig::ToJson() const {
  nlohmann::json j = {
      {"architectures", {"DeepseekV32ForCausalLM"}},
      {"model_type", "deepseek_v32"},
      {"vocab_size", vocab_size},
      {"hidden_size", hidden_size},
      {"intermediate_size", intermediate_size},
      {"moe_intermediate_size", moe_intermediate_size},
      {"num_hidden_layers", num_hidden_layers},
      {"num_nextn_predict_layers", 0},
      {"num_attention_heads", num_attention_heads},
      {"num_key_value_heads", num_attention_heads},
      {"n_shared_experts", n_shared_experts},
      {"n_routed_experts", n_routed_experts},
      {"routed_scaling_factor", routed_scaling_factor},
      {"kv_lora_rank", kv_lora_rank},
      {"q_lora_rank", q_lora_rank},
      {"qk_rope_head_dim", qk_rope_head_dim},
      {"qk_nope_head_dim", qk_nope_head_dim},
      {"v_head_dim", v_head_dim},
      {"n_group", n_group},
      {"topk_group", topk_group},
      {"num_experts_per_tok", num_experts_per_tok},
      {"first_k_dense_replace", first_k_dense_replace},
      {"norm_topk_prob", norm_topk_prob},
      {"topk_method", topk_method},
      {"scoring_func", scoring_func},
      {"rope_theta", rope_theta},
      {"max_position_embeddings", max_position_embeddings},
      {"index_n_heads", index_n_heads},
      {"index_head_dim", index_head_dim},
      {"index_topk", index_topk},
      {"rms_norm_eps", 1e-6},
      {"hidden_act", "silu"},
      {"tie_word_embeddings", false},
      {"torch_dtype", "bfloat16"},
      {"bos_token_id", 0},
      {"eos_token_id", 1},
  };
  if (yarn.enabled) {
    j["rope_scaling"] = {{"type", "yarn"},
                         {"factor", yarn.factor},
                         {"original_max_position_embeddings", yarn.original_max_position_embeddings},
                         {"beta_fast", yarn.beta_fast},
                         {"beta_slow", yarn.beta_slow},
                         {"mscale", yarn.mscale},
                         {"mscale_all_dim", yarn.mscale_all_dim}};
  } else {
    j["rope_scaling"] = nullptr;
  }
  if (weight_format == "fp8") {
    j["quantization_config"] = {{"quant_method", "fp8"}, {"activation_scheme", "dynamic"},
                                {"fmt", "e4m3"}, {"scale_fmt", "ue8m0"},
                                {"weight_block_size", {128, 128}}};
  } else if (weight_format == "w8a8_int8") {
    j["quantization_config"] = {{"quant_method", "w8a8_int8"}, {"format_version", 1},
                                {"weights", "int8, symmetric, one F32 weight_scale per output channel"},
                                {"activations", "int8, symmetric, dynamic per token"},
                                {"quantized_modules", {"self_attn.q_b_proj", "self_attn.o_proj",
                                                       "self_attn.indexer.wq_b", "mlp.experts.*",
                                                       "mlp.shared_experts"}}};
  }
  return j;
}

}  // namespace pdserve::model
