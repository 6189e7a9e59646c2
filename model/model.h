// Model: the DeepSeek-V3.2 forward pass on CPU, bit-for-bit following the reference's rounding
// points (docs/model-numerics.md), for one sequence (Forward) or a batch of sequences sharing
// every GEMM (ForwardBatch, model/batch.h), each with its own paged KV cache.
//
// A call runs S new tokens of a sequence at positions [start, start + S) and appends their KV:
//   * a prefill chunk from position 0 with S > 1 uses the reference's non-absorbed attention
//     (k_nope/v expanded from the latent), exactly as the official prefill;
//   * any other call (S == 1 decode, or a chunk continuing a cached prefix) uses the absorbed
//     form over the latent cache. Both compute the same function and differ only in rounding.
// Every layer attends sparsely to the Lightning Indexer's top-k keys. The MoE runs all rows of
// the batch together, grouped by expert.
// Distributed (model/parallel.h, docs/parallel.md): loaded with a ParallelContext, the model
// holds only this rank's experts and TP shards, and every call is collective: all ranks of the
// instance must make matching calls (ForwardBatch on each unit's replicas with the same
// sequences; an idle DP rank calls ForwardBatch with no sequences, which still enters every EP
// exchange; ForwardCp on every CP rank of a unit).
// Thread-safety: a Model is immutable after Load and may run several batches concurrently
// only if each call gets its own pool; calls sharing a ThreadPool must be serialized (always,
// with a ParallelContext).
#pragma once

#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "common/thread_pool.h"
#include "model/batch.h"
#include "model/kv_cache.h"
#include "model/weights.h"

namespace pdserve::comm {
class CpSplit;
}

namespace pdserve::model {

class ParallelContext;
struct ParallelStep;

// Per-layer values of one Forward call, for accuracy tooling and tests. Shapes use S (tokens
// in the call), T (= cache tokens after the call) and K (index_topk).
struct ForwardTrace {
  std::vector<float> hidden;        // [n_layers + 1, S, D]: embedding, then residual sum per layer
  std::vector<float> index_scores;  // [n_layers, S, T]: indexer scores, -inf where not causal
  std::vector<int32_t> topk;        // [n_layers, S, K]: selections, ascending, -1 padded
  std::vector<int32_t> experts;     // [n_layers, S, top_k]: routed experts in the router's order, -1 on dense layers
};

struct ForwardOptions {
  ForwardTrace* trace = nullptr;
  // When set ([n_layers, S, K], -1 padded), replaces the indexer's selections: used to compare
  // layers with the reference's own choices fed in.
  const std::vector<int32_t>* forced_topk = nullptr;
  // When set ([n_layers, S, top_k], entries of dense layers ignored, -1 = no expert), replaces
  // the router's expert choices; the routing weights stay this model's own sigmoid scores of
  // the given experts, normalized over them. Holds discrete choices equal when two models are
  // compared (e.g. W8A8 against BF16 with the BF16 run's ForwardTrace::experts). Single-process
  // MoE only: the expert-parallel FFN (FfnParallel) ignores it and does not fill trace->experts.
  const std::vector<int32_t>* forced_experts = nullptr;
  // When set ([n_layers + 1, S, D], a reference run's ForwardTrace::hidden), every layer l
  // starts from slot l of it instead of its predecessor's output, so the trace's slot l + 1
  // holds layer l's own output for the reference's input: each layer's error alone, not the
  // drift accumulated before it (the per-layer gate of a quantized model).
  const std::vector<float>* forced_layer_inputs = nullptr;
};

struct BatchPlan;

// Layer-wise progress of a ForwardBatch call (KV streaming: a prefill worker sends layer l's
// KV while layer l + 1 computes). Called on the calling thread, once per layer in order, as
// soon as layer `layer`'s KV records (latent, rope, indexer key) of every row of the call are
// in the caches and final for this call, i.e. after the layer's attention and before its FFN.
// It runs between compute phases (the pool is idle), so it should be short; it may read the
// caches' records of layers <= `layer`, and must not write them or call into the model.
// A non-OK return stops the forward with that error (the caches then hold partial results).
using LayerKvDone = std::function<Status(int64_t layer)>;

class Model {
 public:
  // Errors: see ModelWeights::Load.
  static Result<std::unique_ptr<Model>> Load(const std::string& model_dir, ThreadPool* pool);
  // This rank's share of the model under a plan (collective: every rank of the context loads).
  // `parallel` may be null (single process) and must outlive the model.
  static Result<std::unique_ptr<Model>> Load(const std::string& model_dir, ThreadPool* pool,
                                             const ParallelContext* parallel);

  const ModelConfig& config() const { return weights_->config(); }
  const ModelWeights& weights() const { return *weights_; }
  ThreadPool* pool() const { return pool_; }

  // Runs tokens[0..S) at positions [cache.n_tokens(), +S), appends their KV, and writes the
  // last position's fp32 logits to logits[vocab_size]. The rows form one group (kChunk).
  // Errors: InvalidArgument for S == 0, a token outside [0, vocab_size), a position past
  // max_position_embeddings, or a malformed forced_topk; the cache is unchanged on error.
  Status Forward(const int32_t* tokens, int64_t S, SequenceKvCache* cache, float* logits,
                 const ForwardOptions& options = {}) const;

  // One batched step over several sequences (distinct KV storage each). Errors: those of
  // Forward for any sequence (nothing is computed then), and InvalidArgument when a
  // sequence's KV capacity is short. Each sequence's results are bitwise those of running it
  // alone with the same tokens, start and grouping (model/batch.h).
  // `stats`, when set, receives the call's work counters; `on_layer_kv`, when set, is called
  // after each layer's KV is written (LayerKvDone).
  // With a ParallelContext, an empty `seqs` is the DP dummy step: nothing is computed for this
  // rank, but it enters every MoE layer's EP exchange (and computes the rows it receives).
  Status ForwardBatch(std::span<const BatchSequence> seqs, BatchStats* stats = nullptr,
                      const LayerKvDone& on_layer_kv = {}) const;

  // Context-parallel prefill of a whole prompt (model/forward_cp.cc): every CP rank of the unit
  // calls it with the same `seq` (tokens [0, S), start 0, kChunk, no forced top-k; or the rest
  // of a prompt after a cached prefix, kPromptRest at start > 0, when every rank's cache holds
  // the prefix: then no trace); each computes the positions comm::CpSplit gives it of the new
  // tokens, every rank's KV ends up holding the full prompt, and
  // seq.logits (when set) receives the last position's logits on every CP rank. A trace in
  // seq.options (every CP rank passes one, or none does: it is gathered collectively) receives
  // the whole prompt's trace on every CP rank. Without CP (or for prompts too short to give
  // every CP rank > 8 rows) it is ForwardBatch on every rank.
  // `on_layer_kv` as in ForwardBatch (called once every rank's records of the layer are in).
  // Errors: those of ForwardBatch; InvalidArgument for kPerRow, a kChunk at start != 0, a
  // kPromptRest at start 0 or with a trace, or forced top-k.
  Status ForwardCp(const BatchSequence& seq, const LayerKvDone& on_layer_kv = {}) const;
  // The same for a SequenceKvCache (must be empty), like Forward.
  Status ForwardCp(const int32_t* tokens, int64_t S, SequenceKvCache* cache, float* logits,
                   ForwardTrace* trace = nullptr) const;

  const ParallelContext* parallel() const { return parallel_; }

 private:
  Model(std::unique_ptr<ModelWeights> w, ThreadPool* pool);
  Status Validate(const BatchSequence& s) const;
  // The layers and the logits over a built plan (shared by ForwardBatch and ForwardCp).
  Status RunPlan(std::span<const BatchSequence> seqs, const BatchPlan& plan, const ParallelStep& step,
                 const LayerKvDone& on_layer_kv = {}) const;
  Status Attention(int64_t layer, const float* x, const BatchPlan& plan, const ParallelStep& step, float* out) const;
  Status Indexer(int64_t layer, const float* x, const float* qr, const BatchPlan& plan, const ParallelStep& step,
                 std::vector<int32_t>* topk) const;
  // CP: after this rank wrote its positions' KV records of `layer`, fills in everyone else's.
  Status GatherCpRecords(int64_t layer, const BatchPlan& plan, const ParallelStep& step) const;
  // CP: kv [S x H*(dn+dv)] = bf16(latent Wkv_b^T) of every prompt position, each CP rank
  // expanding its own positions and all-gathering the (bf16, so lossless) results.
  // CP: after RunPlan filled this rank's positions of `trace`, fills in everyone else's (every
  // CP rank ends with the whole prompt's trace, laid out as a single-process Forward's).
  Status GatherCpTrace(const BatchPlan& plan, const ParallelStep& step, ForwardTrace* trace) const;
  Status ExpandCpKeys(int64_t layer, const BatchPlan& plan, const ParallelStep& step, std::vector<float>* kv) const;
  Status Ffn(int64_t layer, const float* x, const BatchPlan& plan, const ParallelStep& step, float* out) const;
  // Sigmoid router with group-limited top-k over n rows: ids/weights [n x top_k], -1 padded.
  // forced (may be null): per row, top_k experts to use instead of the router's choice (or null).
  void Route(const LayerWeights& lw, const float* x, int64_t n, int32_t* ids, float* weights,
             const std::vector<const int32_t*>* forced = nullptr) const;
  // The MoE over the EP group (model/moe_parallel.cc).
  Status FfnParallel(int64_t layer, const float* x, const BatchPlan& plan, const ParallelStep& step, float* out) const;
  void Mlp(const MlpWeights& m, const float* x, int64_t S, float* out) const;
  // Mlp's two halves: h[S, I] = bf16(silu(bf16(x Wg^T)) * bf16(x Wu^T)), then
  // out = bf16(h Wd^T). Mlp(x) == MlpDown(MlpUp(x)) bitwise.
  void MlpUp(const MlpWeights& m, const float* x, int64_t S, float* h) const;
  void MlpDown(const MlpWeights& m, const float* h, int64_t S, float* out) const;
  // One expert's share of a layer (a routed expert, or the shared expert): its gathered rows
  // x[m, D] -> y[m, D].
  struct ExpertJob {
    const MlpWeights* mlp = nullptr;
    const float* x = nullptr;
    int64_t m = 0;
    float* y = nullptr;
  };
  // Runs every job, each y bitwise equal to Mlp over its rows, as one pass over all experts:
  // all gate and up projections run as one grouped call (one parallel region, tasks over
  // (call, output block); ApplyLinearGrouped), the activations per job, and all down
  // projections as a second grouped call: two parallel regions per layer whatever the number
  // of experts, and no synchronisation per expert. per_expert_moe_variant()
  // (model/forward_variants.h) runs one Mlp per job instead (the reference the pass is
  // compared against bit for bit).
  void RunExperts(std::span<const ExpertJob> jobs) const;
  // ApplyLinear over the plan's rows, each with its group's GEMM path.
  void PlannedLinear(const Linear& w, const float* x, const BatchPlan& plan, float* y) const;

  std::unique_ptr<ModelWeights> weights_;
  ThreadPool* pool_;
  const ParallelContext* parallel_ = nullptr;
  std::vector<float> rope_freqs_;  // dr/2 frequencies shared by MLA and the indexer
};

}  // namespace pdserve::model
