// ParallelPlan: how one serving instance (a prefill or a decode deployment launched by one
// mpirun) spreads a model over its MPI ranks, and its validation.
//
//   cp  context parallel: a prompt's tokens split across ranks for prefill attention
//   dp  data parallel:    independent requests (and KV caches) per rank group, for decode
//   tp  tensor parallel:  small groups sharding o_proj, lm_head and the embedding
//   ep  expert parallel:  routed experts split across ranks for every MoE layer
//
// Attention ranks form a cp x dp x tp grid that covers the world exactly (tp fastest varying, so
// a TP group is a run of adjacent ranks: one host). MoE ranks form world/ep groups of ep adjacent
// ranks; each EP group holds every routed expert once (n_routed_experts/ep per rank) and EP groups
// beyond the first are replicas. A one-rank instance is the plan with every size 1.
//
// Validation is local and deterministic (same config + same world => same verdict on every
// rank), so a bad plan fails at start on every rank without any communication;
// ProcessGroups::Create additionally checks that all ranks hold the same plan.
//
// Config forms (every key optional, default 1; unknown keys are errors so typos do not pass):
//   JSON  {"cp": 1, "dp": 2, "ep": 4, "tp": 2}   or nested as {"parallel": {...}}
//   YAML  parallel: {cp: 1, dp: 2, ep: 4, tp: 2}  or the same keys at top level
//
// Thread-safety: value type.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "common/status.h"

namespace pdserve::comm {

// The model dimensions a plan is validated against (comm/ does not link the model: the caller
// copies them from its ModelConfig). A value of 0 means "unknown, do not check".
struct PlanModelDims {
  int64_t n_routed_experts = 0;
  int64_t num_attention_heads = 0;
  int64_t vocab_size = 0;
};

struct ParallelPlan {
  int cp = 1;
  int dp = 1;
  int ep = 1;
  int tp = 1;

  // Ranks the attention grid needs (must equal the world size).
  int64_t attention_ranks() const { return int64_t{cp} * dp * tp; }
  int64_t experts_per_ep_rank(const PlanModelDims& dims) const { return dims.n_routed_experts / ep; }

  // kInvalidArgument with a message naming the offending sizes and what would fix it:
  //   * every size in [1, 65536];
  //   * cp * dp * tp == world_size;
  //   * ep divides world_size;
  //   * ep divides n_routed_experts;
  //   * tp divides num_attention_heads (o_proj and the attention heads shard by whole heads);
  //   * tp <= vocab_size (every TP rank owns at least one vocabulary row).
  Status Validate(int world_size, const PlanModelDims& dims) const;

  // Errors: kInvalidArgument naming `where` and the bad key / value.
  static Result<ParallelPlan> FromJson(const nlohmann::json& j, std::string_view where = "plan");
  static Result<ParallelPlan> FromYaml(std::string_view yaml_text, std::string_view where = "plan");
  // "cp=2,ep=2" (the keys above, comma separated; every key optional, default 1), as in
  // `--plan` flags. Errors: kInvalidArgument naming `where` and the bad part.
  static Result<ParallelPlan> FromString(std::string_view text, std::string_view where = "--plan");
  // By extension: .json, or .yaml / .yml. Errors: kNotFound if unreadable, else as above.
  static Result<ParallelPlan> LoadFile(const std::string& path);

  nlohmann::json ToJson() const;
  std::string ToString() const;  // "cp=1 dp=2 ep=4 tp=2"

  bool operator==(const ParallelPlan&) const = default;
};

}  // namespace pdserve::comm
