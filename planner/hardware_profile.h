// HardwareProfile: what the capacity planner knows about one kind of machine, read from YAML
// (docs/planner.md "Hardware profiles"). Figures are either measured (the built-in `local`
// profile, from pdserve's own bench/ drivers) or taken from public spec sheets (peaks, derated by
// the `efficiency` factors). Every profile file names the source of each figure.
//
// Units in the YAML are the ones spec sheets use (TFLOP/s, GB/s = 1e9 B/s, GiB, us, ms); the
// struct holds SI units (FLOP/s, B/s, bytes, s) so the cost model never converts.
//
//   name: h800                               # required
//   description: "..."                       # free text
//   sources: ["...", "..."]                  # where each number comes from
//   cost_per_device_hour: 2.0                # optional, any currency; ranks M:N plans by cost
//   device:
//     memory_gib: 80                         # capacity of one rank (device)
//     memory_bandwidth_gbs: 3350             # weight / KV streaming
//     matmul_tflops: {bf16: 989, fp8: 1979, int8: 1979}   # large-m GEMM (dense, no sparsity)
//     gemv_tflops: {bf16: ...}               # optional: FLOP rate of small-m GEMMs (m <= small_m_max)
//     matmul_tflops_by_rows:                 # optional: measured rates at given row counts m (above
//       bf16: {16: 0.075, 128: 0.079}        # small_m_max), interpolated in log m; beyond the last
//                                            # point the rate moves toward matmul_tflops
//     small_m_max: 8                         # optional
//     attention_tflops: 400                  # sparse MLA attention (absorbed form)
//     expanded_attention_tflops: 100         # optional: the expanded first-chunk form (default: above)
//     indexer_tflops: 800                    # Lightning Indexer scores
//     topk_keys_per_s: 2e11                  # optional: top-k selection throughput
//     efficiency: {matmul: 0.6, memory: 0.8, attention: 0.5, indexer: 0.5, network: 0.7}
//   node:
//     devices: 8
//     intra: {bandwidth_gbs: 200, latency_us: 3}   # per device, one direction, within a node
//     inter: {bandwidth_gbs: 50, latency_us: 10}   # per device, one direction, across nodes
//   kv_transfer: {bandwidth_gbs: 50, latency_us: 50}  # prefill -> decode KV moves
//   runtime:                                 # per-step / per-request software costs
//     step_overhead_us: 200                  # fixed cost of one engine step (schedule, launch, sample)
//     row_overhead_us: 5                     # per row of a step (sampling, events)
//     row_layer_overhead_us: 0               # per row and layer: elementwise work outside the GEMM,
//                                            # attention and indexer kernels (norms, RoPE, rounding,
//                                            # activation quantization), when not fused away
//     request_overhead_ms: 3                 # router + HTTP + control on the way to the first token
//     pd_overhead_ms: 1                      # extra control round trips of a disaggregated request
//     token_delivery_us: 100                 # worker -> router -> client, per streamed token
//     memory_reserved_gib: 2                 # per rank, runtime / framework
//   engine:                                  # how the engine computes (defaults: pdserve's engine)
//     first_chunk_attention: absorbed        # or `expanded` (pdserve's CPU engine: a prompt's first
//                                            # chunk expands K/V with kv_b and attends non-absorbed)
//     act_bytes: 2                           # activation element bytes on the wire (EP, TP, CP)
//     decode_row_group: 0                    # >0: decode rows read the weights in passes of at most
//                                            # this many rows (pdserve's batch-invariant CPU GEMV
//                                            # path: 8); prompt chunks of more rows share one pass
//
// Thread-safety: value type.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/status.h"

namespace pdserve::planner {

// A compute data type of a matmul (the weights' storage decides it, see ModelShape).
enum class MathType : uint8_t { kBf16 = 0, kFp8, kInt8 };
const char* MathTypeName(MathType t);

struct LinkSpec {
  double bandwidth_bps = 0;  // bytes/s, one direction, per device
  double latency_s = 0;
};

struct HardwareProfile {
  std::string name;
  std::string description;
  std::vector<std::string> sources;
  double cost_per_device_hour = 0;  // 0: unknown (plans are then ranked by device count)

  // One device (rank). Rates below are already multiplied by their efficiency factor.
  double memory_bytes = 0;
  double memory_bandwidth_bps = 0;
  std::map<MathType, double> matmul_flops;  // large-m GEMM
  std::map<MathType, double> gemv_flops;    // small-m GEMM (m <= small_m_max); missing: matmul
  std::map<MathType, std::map<int64_t, double>> matmul_flops_by_rows;  // optional, m -> FLOP/s
  int64_t small_m_max = 8;
  double attention_flops = 0;
  double expanded_attention_flops = 0;
  double indexer_flops = 0;
  double topk_keys_per_s = 0;  // 0: selection cost ignored

  int64_t devices_per_node = 1;
  LinkSpec intra;
  LinkSpec inter;
  LinkSpec kv_transfer;

  double step_overhead_s = 0;
  double row_overhead_s = 0;
  double row_layer_overhead_s = 0;
  double request_overhead_s = 0;
  double pd_overhead_s = 0;
  double token_delivery_s = 0;
  double memory_reserved_bytes = 0;

  bool first_chunk_expanded = false;
  int64_t act_bytes = 2;
  int64_t decode_row_group = 0;  // 0: all rows of a step share one pass over the weights

  // The FLOP rate of a GEMM with m rows in `t`: the gemv rate for m <= small_m_max when given;
  // above, the by-rows points interpolated in log m (clamped below the first point, and moving
  // to matmul_flops at 4x the last point), else matmul_flops.
  // REQUIRES: HasMath(t).
  double GemmFlops(MathType t, int64_t m) const;
  bool HasMath(MathType t) const { return matmul_flops.count(t) > 0; }
  // The link ranks of a group of `group` devices talk over: intra-node when the group fits in a
  // node, else inter-node (the slower one bounds a collective that crosses nodes).
  const LinkSpec& LinkFor(int64_t group) const { return group <= devices_per_node ? intra : inter; }

  // Errors: InvalidArgument naming `origin` and the key path ("device.memory_gib: ...").
  static Result<HardwareProfile> Parse(std::string_view yaml_text, const std::string& origin);
  // A built-in profile name (BuiltinProfileNames) or a path to a YAML file.
  // Errors: NotFound (neither), InvalidArgument (bad file).
  static Result<HardwareProfile> Load(const std::string& name_or_path);

  nlohmann::json ToJson() const;
};

// Names of the profiles compiled into the binary (planner/profiles/*.yaml), sorted.
std::vector<std::string> BuiltinProfileNames();
// The YAML text of a built-in profile, or nullptr.
const char* BuiltinProfileText(std::string_view name);

}  // namespace pdserve::planner
