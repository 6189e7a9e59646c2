// The capacity planner's entry point (`pdserve plan`, docs/planner.md): a model config, a
// hardware profile, pools with their parallel plans, precisions, a workload and an SLO in; the
// memory of every rank, the step costs, the predicted TTFT / TPOT percentiles (ClusterSim),
// throughput, goodput and the best prefill:decode split out, as JSON and markdown.
//
// Thread-safety: MakePlan is a pure function of its spec; PlanReport is a value type.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "comm/parallel_plan.h"
#include "planner/cluster_sim.h"
#include "planner/hardware_profile.h"
#include "planner/model_shape.h"

namespace pdserve::planner {

struct SloSpec {
  double ttft_s = 2.0;
  double tpot_s = 0.05;
  double attainment = 0.9;  // share of requests that must meet both (goodput's definition)
};

struct PlanSpec {
  std::string model;               // config.json or a model directory
  std::string hardware = "local";  // built-in profile name or YAML path
  std::string weights;             // bf16 | w8a8 | fp8; empty: the checkpoint's own format
  std::string kv_format = "fp8";   // MLA latent: fp8 | bf16 | int8
  std::string index_format;        // indexer keys: fp8 | int8 | bf16; empty: int8 for an int8
                                   // latent (C8 + A8C8), else fp8
  bool colocated = false;
  // Pools: instances, or nodes (instances = nodes * devices_per_node / plan ranks). 0: default.
  int64_t prefill_nodes = 1, decode_nodes = 1, colocated_nodes = 1;
  int64_t prefill_instances = 0, decode_instances = 0, colocated_instances = 0;
  // Plans; unset: one node per instance (prefill cp = ep = devices per node; decode and
  // colocated dp = ep = devices per node).
  bool prefill_plan_set = false, decode_plan_set = false, colocated_plan_set = false;
  comm::ParallelPlan prefill_plan, decode_plan, colocated_plan;
  Workload workload;
  SloSpec slo;
  SchedulerLimits limits;
  // The P:D sweep (plot) and the best-plan search cover M prefill + N decode instances with
  // M + N <= this (0: max(4, the given M + N)).
  int64_t search_instances = 0;
  bool search = true;

  // Reads the keys of a YAML spec file (docs/planner.md "Spec file") over this spec.
  // Errors: InvalidArgument naming the key; NotFound.
  Status MergeYamlFile(const std::string& path);
};

// One rank's memory (bytes).
struct RankMemory {
  double capacity = 0, weights = 0, mla_cache = 0, indexer_cache = 0, activations = 0, reserved = 0;
  double Headroom() const { return capacity - weights - mla_cache - indexer_cache - activations - reserved; }
  nlohmann::json ToJson() const;
};

struct PoolReport {
  std::string role;  // prefill | decode | colocated
  int64_t instances = 0, ranks_per_instance = 0, devices = 0, nodes = 0;
  comm::ParallelPlan plan;
  double weight_bytes_per_rank = 0;
  RankMemory memory;                 // at the predicted load (prefill: the prompt being computed)
  int64_t max_decode_batch_per_rank = 0;  // decode / colocated: by memory, before the engine cap
  int64_t kv_capacity_tokens_per_rank = 0;
  StepCost step;                     // prefill: one prompt alone; decode: one step at the mean batch
  StepCost step_at_max_batch;        // decode / colocated: a step with every DP unit at its max batch
  nlohmann::json ToJson() const;
};

struct SweepPoint {
  int64_t prefill_instances = 0, decode_instances = 0;
  int64_t devices = 0;
  double max_goodput_rps = 0;
  bool feasible = true;
  std::string note;
};

struct PlanReport {
  std::string model_name;
  ModelShape shape;
  HardwareProfile hardware;
  PlanSpec spec;
  std::vector<PoolReport> pools;
  double kv_bytes_per_token = 0, mla_bytes_per_token = 0, indexer_bytes_per_token = 0;
  SimResult sim;
  double ttft_kv_tail_s = 0;       // KV transfer tail of one prompt (disaggregated)
  double goodput_rps = 0, attainment = 0, max_goodput_rps = 0, goodput_per_device = 0;
  std::vector<SweepPoint> sweep;   // goodput vs P:D split (disaggregated)
  SweepPoint best;                 // the cheapest split that carries the rate within the SLO
  bool best_found = false;
  std::vector<std::string> notes;

  nlohmann::json ToJson() const;
  std::string ToMarkdown() const;
};

// Errors: InvalidArgument (bad spec, plan, format), NotFound (model / profile),
// ResourceExhausted (the weights or one request's KV do not fit a rank: the message says what).
Result<PlanReport> MakePlan(const PlanSpec& spec);

// Loads config.json from a file or a model directory. Errors: NotFound, InvalidArgument.
Result<model::ModelConfig> LoadModelConfig(const std::string& path);

}  // namespace pdserve::planner
