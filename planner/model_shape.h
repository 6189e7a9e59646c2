// ModelShape: the byte and FLOP bookkeeping of a DeepSeek-V3.2-family model for the planner,
// derived from its ModelConfig and the chosen precisions (docs/planner.md "What the model
// counts"). Nothing here knows hardware: the cost model (step_cost.h) turns these counts into
// seconds.
//
// Matrices are listed per layer with their storage (bf16, fp8, or int8 for W8A8) and how they
// split under a parallel plan (replicated, by heads over TP, by vocabulary rows over TP, or
// routed experts over EP), following docs/parallel.md "Who holds what" and
// docs/quantization.md "What is quantized".
//
// KV bytes per token and layer follow model/kv_layout.h exactly (payload, no block padding):
//   latent fp8 Lkv + Lkv/128*4, bf16 2*Lkv, int8 Lkv + 4; k_pe 2*dr (bf16) in every format;
//   indexer key fp8 / int8 ID + 4 (pdserve's two formats), bf16 2*ID (the reference's BF16
//   cache, which pdserve's engine does not store; the planner accepts it for comparisons).
//
// Thread-safety: value type.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"
#include "model/config.h"
#include "planner/hardware_profile.h"

namespace pdserve::planner {

enum class WeightFormat : uint8_t { kBf16 = 0, kW8a8, kFp8 };
enum class KvFormat : uint8_t { kFp8 = 0, kBf16, kInt8 };

Result<WeightFormat> ParseWeightFormat(const std::string& s);
Result<KvFormat> ParseKvFormat(const std::string& s);         // latent: fp8 | bf16 | int8
Result<KvFormat> ParseIndexKeyFormat(const std::string& s);   // indexer keys: fp8 | int8 | bf16
const char* WeightFormatName(WeightFormat f);
const char* KvFormatName(KvFormat f);

// How a matrix is held by the ranks of an instance.
enum class Split : uint8_t { kReplicated = 0, kHeads, kVocab, kExperts };

struct MatrixSpec {
  std::string name;
  int64_t n_out = 0, n_in = 0;  // y[m, n_out] = x[m, n_in] W^T
  int64_t count = 1;            // identical matrices per layer (experts)
  double bytes_per_param = 2;   // incl. scales
  MathType math = MathType::kBf16;
  Split split = Split::kReplicated;
  // Copies a rank holds (only the held bytes count them: a pass reads one). 2 for a BF16 kv_b:
  // pdserve's engine keeps it row-major and, per head, W_uk transposed and W_uv prepacked.
  double held_copies = 1.0;
  double Params() const { return static_cast<double>(n_out) * n_in * count; }
  double Bytes() const { return Params() * bytes_per_param; }
};

struct ModelShape {
  model::ModelConfig config;
  WeightFormat weights = WeightFormat::kBf16;
  KvFormat latent_format = KvFormat::kFp8;
  KvFormat index_format = KvFormat::kFp8;

  // Per-layer matrices (attention + indexer for every layer; the FFN of dense / MoE layers).
  std::vector<MatrixSpec> attention;   // q_a, q_b, kv_a, kv_b, o, indexer wq_b, wk, weights_proj
  std::vector<MatrixSpec> dense_ffn;   // gate, up, down of a dense layer
  std::vector<MatrixSpec> shared_ffn;  // router gate + shared experts of a MoE layer
  MatrixSpec routed;                   // one routed expert's gate+up+down as one [3I, D] block
  MatrixSpec lm_head;
  MatrixSpec embedding;
  int64_t n_dense_layers = 0, n_moe_layers = 0;

  // `fp8_native`: the hardware multiplies e4m3 weights as they are; otherwise FP8 weights are
  // dequantized to BF16 at load (pdserve's CPU loader) and cost BF16 bytes and FLOPs.
  // Errors: InvalidArgument (the config does not validate).
  static Result<ModelShape> Create(const model::ModelConfig& config, WeightFormat weights, KvFormat latent,
                                   KvFormat index, bool fp8_native = true);
  bool fp8_dequantized = false;  // FP8 checkpoint held as BF16 (see Create)

  int64_t layers() const { return config.num_hidden_layers; }
  // KV payload bytes of one token in one layer (model/kv_layout.h TokenBytesPerLayer).
  int64_t LatentBytesPerTokenLayer() const;   // latent codes + scales + k_pe
  int64_t IndexBytesPerTokenLayer() const;    // indexer key codes + scale
  int64_t KvBytesPerTokenLayer() const { return LatentBytesPerTokenLayer() + IndexBytesPerTokenLayer(); }
  // All layers.
  int64_t KvBytesPerToken() const { return KvBytesPerTokenLayer() * layers(); }
  int64_t MlaBytesPerToken() const { return LatentBytesPerTokenLayer() * layers(); }
  int64_t IndexerBytesPerToken() const { return IndexBytesPerTokenLayer() * layers(); }

  // Weight bytes one rank holds under (tp, ep): replicated + its head / vocab shards + E/ep
  // experts per MoE layer, each matrix times its held_copies.
  double WeightBytesPerRank(int64_t tp, int64_t ep) const;
  double TotalParams() const;
  // Parameters a token multiplies with (k routed experts), excluding the embedding.
  double ActiveParams() const;
};

}  // namespace pdserve::planner
