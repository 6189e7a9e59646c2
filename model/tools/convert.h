// Checkpoint conversion: a Hugging Face DeepSeek-V3.2 checkpoint (BF16, or FP8 E4M3 with
// 128x128 `weight_scale_inv` blocks) to pdserve's W8A8 INT8 format or to plain BF16
// (docs/quantization.md has the format specification).
//
// Streaming: input shards are mmap'd; every output tensor is produced in blocks of rows
// (dequantize -> quantize per output channel -> append to the shard being written) and the
// input pages it came from are released as soon as the block is written, so peak memory stays
// at a few row blocks plus the page cache of one block, never a whole tensor or the model.
//
// W8A8 (quant "w8a8"): MLA q_b_proj and o_proj, the indexer's wq_b, routed and shared experts
// become I8 [n_out, n_in] + F32 `<module>.weight_scale` [n_out] (symmetric, per output row:
// scale = amax/127); every other matrix and vector is BF16 (FP8 ones dequantized) or kept as is
// (F32 vectors). The MTP layer (index num_hidden_layers) is dropped: inference never reads it.
// W8A8-all (quant "w8a8_all", beyond the seeds' plan, for memory-bound decode): every matrix
// except embed_tokens and kv_b_proj (read directly by the forward pass), the router
// (mlp.gate) and the indexer's weights_proj (tiny, routing/selection-sensitive) becomes I8,
// lm_head and the dense MLPs included.
// Expert parallelism (ep_size N > 1): rank r's routed experts [r*E/N, (r+1)*E/N) go to shards
// `model-ep{r}-of-{N}-XXXXX-of-YYYYY.safetensors`, everything else to
// `model-shared-XXXXX-of-YYYYY.safetensors`; `model.safetensors.index.json` lists all of them
// and `model-ep{r}-of-{N}.safetensors.index.json` only what rank r reads.
// Thread-safety: Convert may run concurrently on distinct output directories.
#pragma once

#include <cstdint>
#include <string>

#include "common/status.h"
#include "common/thread_pool.h"

namespace pdserve::model {

struct ConvertOptions {
  std::string in_dir;
  std::string out_dir;                   // must not exist or be empty
  std::string quant = "w8a8";            // "w8a8", "w8a8_all" or "bf16"
  int64_t ep_size = 1;                   // expert-parallel split of the routed experts
  int64_t max_shard_bytes = int64_t{4} << 30;
  ThreadPool* pool = nullptr;            // row blocks are converted in parallel on it
};

struct ConvertStats {
  int64_t tensors_in = 0;       // input tensors read (scales included)
  int64_t tensors_out = 0;      // output tensors written (scales included)
  int64_t quantized = 0;        // matrices written as I8
  int64_t dropped_mtp = 0;      // MTP-layer tensors skipped
  int64_t bytes_in = 0;         // tensor bytes read
  int64_t bytes_out = 0;        // tensor bytes written
  int64_t shards = 0;
  double seconds = 0;
};

// True for the HF weight names W8A8 (resp. W8A8-all, for matrices) stores as I8 (see above).
bool IsW8A8Target(const std::string& name);
bool IsW8A8AllTarget(const std::string& name);

// Errors: InvalidArgument for bad options (unknown quant, ep_size not dividing the experts, an
// output directory that is not empty, in == out), an already-W8A8 input, and malformed input
// tensors -- an FP8 weight without its scale_inv, a scale_inv of the wrong shape or dtype or
// with non-finite values, a scale_inv without its weight, NaN fp8 codes or non-finite values in
// a matrix being quantized, an expert id outside [0, n_routed_experts), an unsupported dtype, a
// quantization target that is not a matrix -- each naming the tensor and file; any Checkpoint
// or config error; Internal for I/O.
Result<ConvertStats> Convert(const ConvertOptions& options);

}  // namespace pdserve::model
