#include "planner/model_shape.h"

#include <algorithm>

namespace pdserve::planner {

Result<WeightFormat> ParseWeightFormat(const std::string& s) {
  if (s == "bf16") return WeightFormat::kBf16;
  if (s == "w8a8" || s == "w8a8_int8") return WeightFormat::kW8a8;
  if (s == "fp8") return WeightFormat::kFp8;
  return Status::InvalidArgument("unknown weight format '" + s + "' (bf16, w8a8, fp8)");
}

Result<KvFormat> ParseKvFormat(const std::string& s) {
  if (s == "fp8") return KvFormat::kFp8;
  if (s == "bf16") return KvFormat::kBf16;
  if (s == "int8" || s == "c8") return KvFormat::kInt8;
  return Status::InvalidArgument("unknown KV latent format '" + s + "' (fp8, bf16, int8)");
}

Result<KvFormat> ParseIndexKeyFormat(const std::string& s) {
  if (s == "fp8") return KvFormat::kFp8;
  if (s == "int8" || s == "a8c8") return KvFormat::kInt8;
  if (s == "bf16") return KvFormat::kBf16;
  return Status::InvalidArgument("unknown indexer key format '" + s + "' (fp8, int8, bf16)");
}

const char* WeightFormatName(WeightFormat f) {
  switch (f) {
    case WeightFormat::kBf16: return "bf16";
    case WeightFormat::kW8a8: return "w8a8";
    case WeightFormat::kFp8: return "fp8";
  }
  return "?";
}

const char* KvFormatName(KvFormat f) {
  switch (f) {
    case KvFormat::kFp8: return "fp8";
    case KvFormat::kBf16: return "bf16";
    case KvFormat::kInt8: return "int8";
  }
  return "?";
}

Result<ModelShape> ModelShape::Create(const model::ModelConfig& c, WeightFormat weights, KvFormat latent,
                                      KvFormat index, bool fp8_native) {
  PDSERVE_RETURN_IF_ERROR(c.Validate());
  ModelShape s;
  s.config = c;
  s.weights = weights;
  s.latent_format = latent;
  s.index_format = index;
  s.fp8_dequantized = weights == WeightFormat::kFp8 && !fp8_native;
  const int64_t D = c.hidden_size, H = c.num_attention_heads, Lq = c.q_lora_rank, Lkv = c.kv_lora_rank;
  const int64_t dn = c.qk_nope_head_dim, dr = c.qk_rope_head_dim, dv = c.v_head_dim;
  const int64_t IH = c.index_n_heads, ID = c.index_head_dim;

  // Storage of a matrix: `quantizable` ones are int8 under W8A8 (docs/quantization.md: q_b, o,
  // indexer wq_b, routed and shared experts); under FP8 every linear weight except the router,
  // the indexer's weights_proj, the embedding and lm_head is e4m3 with 128x128 block scales.
  auto mat = [&](std::string name, int64_t n_out, int64_t n_in, Split split, bool w8a8_quantized,
                 bool fp8_quantized, int64_t count = 1) {
    MatrixSpec m{std::move(name), n_out, n_in, count, 2.0, MathType::kBf16, split};
    if (weights == WeightFormat::kW8a8 && w8a8_quantized) {
      m.bytes_per_param = 1.0 + 4.0 / static_cast<double>(n_in);  // int8 + one fp32 scale per row
      m.math = MathType::kInt8;
    } else if (weights == WeightFormat::kFp8 && fp8_quantized && fp8_native) {
      m.bytes_per_param = 1.0 + 4.0 / (128.0 * 128.0);
      m.math = MathType::kFp8;
    }
    return m;
  };
  // A BF16 kv_b is held twice (model/weights.cc): row-major for the prefill's expansion and the
  // large-batch absorption, and per head prepacked (W_uk transposed, W_uv) for decode.
  MatrixSpec kv_b = mat("kv_b_proj", H * (dn + dv), Lkv, Split::kHeads, false, true);
  if (kv_b.math == MathType::kBf16) kv_b.held_copies = 2.0;
  s.attention = {
      mat("q_a_proj", Lq, D, Split::kReplicated, false, true),
      mat("q_b_proj", H * (dn + dr), Lq, Split::kHeads, true, true),
      mat("kv_a_proj", Lkv + dr, D, Split::kReplicated, false, true),
      kv_b,
      mat("o_proj", D, H * dv, Split::kHeads, true, true),
      mat("indexer.wq_b", IH * ID, Lq, Split::kReplicated, true, true),
      mat("indexer.wk", ID, D, Split::kReplicated, false, true),
      mat("indexer.weights_proj", IH, D, Split::kReplicated, false, false),
  };
  const int64_t I = c.moe_intermediate_size, Idense = c.intermediate_size;
  s.n_dense_layers = std::min(c.first_k_dense_replace, c.num_hidden_layers);
  if (c.n_routed_experts <= 0) s.n_dense_layers = c.num_hidden_layers;
  s.n_moe_layers = c.num_hidden_layers - s.n_dense_layers;
  if (s.n_dense_layers > 0) s.dense_ffn = {mat("mlp.gate_up_down", 3 * Idense, D, Split::kReplicated, false, true)};
  if (s.n_moe_layers > 0) {
    s.shared_ffn = {mat("mlp.gate (router)", c.n_routed_experts, D, Split::kReplicated, false, false)};
    if (c.n_shared_experts > 0)
      s.shared_ffn.push_back(mat("mlp.shared_experts", 3 * I * c.n_shared_experts, D, Split::kReplicated, true, true));
    s.routed = mat("mlp.experts", 3 * I, D, Split::kExperts, true, true, c.n_routed_experts);
  }
  s.lm_head = mat("lm_head", c.vocab_size, D, Split::kVocab, false, false);
  s.embedding = mat("embed_tokens", c.vocab_size, D, Split::kVocab, false, false);
  return s;
}

int64_t ModelShape::LatentBytesPerTokenLayer() const {
  const int64_t Lkv = config.kv_lora_rank, dr = config.qk_rope_head_dim;
  const int64_t kpe = 2 * dr;
  switch (latent_format) {
    case KvFormat::kFp8: return Lkv + Lkv / 128 * 4 + kpe;
    case KvFormat::kBf16: return 2 * Lkv + kpe;
    case KvFormat::kInt8: return Lkv + 4 + kpe;
  }
  return 0;
}

int64_t ModelShape::IndexBytesPerTokenLayer() const {
  const int64_t ID = config.index_head_dim;
  return index_format == KvFormat::kBf16 ? 2 * ID : ID + 4;
}

double ModelShape::WeightBytesPerRank(int64_t tp, int64_t ep) const {
  auto held = [&](const MatrixSpec& m) {
    const double bytes = m.Bytes() * m.held_copies;
    switch (m.split) {
      case Split::kReplicated: return bytes;
      case Split::kHeads:
      case Split::kVocab: return bytes / static_cast<double>(tp);
      case Split::kExperts: return bytes / static_cast<double>(ep);
    }
    return bytes;
  };
  double b = 0;
  for (const auto& m : attention) b += held(m) * layers();
  for (const auto& m : dense_ffn) b += held(m) * n_dense_layers;
  for (const auto& m : shared_ffn) b += held(m) * n_moe_layers;
  if (n_moe_layers > 0) b += held(routed) * n_moe_layers;
  b += held(lm_head) + held(embedding);
  // Norm vectors (fp32 or bf16, a few per layer): negligible but counted.
  b += 4.0 * layers() * (2 * config.hidden_size + config.q_lora_rank + config.kv_lora_rank + config.index_head_dim);
  return b;
}

double ModelShape::TotalParams() const {
  double p = 0;
  for (const auto& m : attention) p += m.Params() * layers();
  for (const auto& m : dense_ffn) p += m.Params() * n_dense_layers;
  for (const auto& m : shared_ffn) p += m.Params() * n_moe_layers;
  if (n_moe_layers > 0) p += routed.Params() * n_moe_layers;
  return p + lm_head.Params() + embedding.Params();
}

double ModelShape::ActiveParams() const {
  double p = 0;
  for (const auto& m : attention) p += m.Params() * layers();
  for (const auto& m : dense_ffn) p += m.Params() * n_dense_layers;
  for (const auto& m : shared_ffn) p += m.Params() * n_moe_layers;
  if (n_moe_layers > 0)
    p += static_cast<double>(routed.n_out) * routed.n_in * config.num_experts_per_tok * n_moe_layers;
  return p + lm_head.Params();
}

}  // namespace pdserve::planner
