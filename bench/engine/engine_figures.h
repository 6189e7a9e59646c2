// What bench_engine sets its timings against: the FLOPs of a prefill or of a decode step (linear
// layers, attention, indexer) as this engine computes them, the machine's fp32 FMA peak measured in the same run,
// and the load average beside every figure.
#pragma once

#include <cstdint>
#include <string>

#include "common/thread_pool.h"
#include "model/config.h"

namespace pdserve::bench {

struct ForwardFlops {
  double linear = 0;     // every projection and MLP of every row (routed: top_k experts), lm_head per sampled row
  double attention = 0;  // scores + weighted sums over the selected keys, query absorption / W_uv or kv_b expansion
  double indexer = 0;    // q8 . k8 over the causal keys of rows with more than index_topk of them
  double total() const { return linear + attention + indexer; }
};

// A prompt of `prompt_len` tokens prefilled in chunks of `chunk` (the first chunk in the
// reference's non-absorbed form, the others absorbed, as model/model.h describes).
ForwardFlops CountPrefillFlops(const model::ModelConfig& c, int64_t prompt_len, int64_t chunk);

// One decode step of `batch` rows at position `context` (the absorbed form over min(context + 1,
// index_topk) keys; the indexer scores context + 1 keys when there are more than index_topk).
ForwardFlops CountDecodeStepFlops(const model::ModelConfig& c, int64_t context, int64_t batch);

// fp32 FMA peak of as many threads as `pool` has, all at once, in GFLOP/s (2 per multiply-add): 8-lane
// (AVX2) and, where the CPU has it, 16-lane (AVX-512) vfmadd231ps; 0 for a missing width.
struct FmaPeak {
  double avx2_gflops = 0, avx512_gflops = 0;
  double best() const { return avx512_gflops > avx2_gflops ? avx512_gflops : avx2_gflops; }
};
FmaPeak MeasureFmaPeak(ThreadPool* pool);

// "1.23 1.10 0.98" from /proc/loadavg (1, 5 and 15 minutes).
std::string LoadAverage();

}  // namespace pdserve::bench
