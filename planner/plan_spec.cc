// PlanSpec::MergeYamlFile (planner/plan.h): a spec file with the same settings as the flags.
//
//   model: models/small                hardware: local
//   weights: bf16                      kv_format: fp8          index_format: fp8
//   mode: disaggregated                # or colocated
//   prefill:   {nodes: 1, instances: 0, plan: "cp=8,ep=8"}
//   decode:    {nodes: 1, instances: 0, plan: "dp=8,ep=8"}
//   colocated: {nodes: 1, instances: 0, plan: "dp=8,ep=8"}
//   workload:  {input_len: 1024, output_len: 128, range_ratio: 0, rate: 1, num_requests: 400, warmup: 0, seed: 1}
//   slo:       {ttft_ms: 2000, tpot_ms: 50, attainment: 0.9}
//   engine:    {max_num_seqs: 64, max_step_tokens: 512, prefill_chunk: 256}
//   search:    {enabled: true, instances: 0}
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <initializer_list>

#include <yaml-cpp/yaml.h>

#include "planner/plan.h"

namespace pdserve::planner {

namespace {

Status CheckKeys(const YAML::Node& n, const std::string& path, std::initializer_list<const char*> allowed) {
  if (!n.IsMap()) return Status::InvalidArgument(path + ": expected a mapping");
  for (const auto& kv : n) {
    const std::string k = kv.first.as<std::string>();
    if (std::none_of(allowed.begin(), allowed.end(), [&](const char* a) { return k == a; }))
      return Status::InvalidArgument((path.empty() ? k : path + "." + k) + ": unknown key");
  }
  return Status::Ok();
}

template <typename T>
Status Read(const YAML::Node& n, const char* key, const std::string& path, T* out) {
  const YAML::Node v = n[key];
  if (!v || v.IsNull()) return Status::Ok();
  try {
    *out = v.as<T>();
  } catch (const std::exception&) {
    return Status::InvalidArgument((path.empty() ? std::string(key) : path + "." + key) + ": wrong type (" +
                                   (v.IsScalar() ? v.as<std::string>() : std::string("not a scalar")) + ")");
  }
  return Status::Ok();
}

Status ReadPool(const YAML::Node& root, const char* key, int64_t* nodes, int64_t* instances, bool* plan_set,
                comm::ParallelPlan* plan) {
  const YAML::Node n = root[key];
  if (!n || n.IsNull()) return Status::Ok();
  PDSERVE_RETURN_IF_ERROR(CheckKeys(n, key, {"nodes", "instances", "plan"}));
  PDSERVE_RETURN_IF_ERROR(Read(n, "nodes", key, nodes));
  PDSERVE_RETURN_IF_ERROR(Read(n, "instances", key, instances));
  std::string text;
  PDSERVE_RETURN_IF_ERROR(Read(n, "plan", key, &text));
  if (!text.empty()) {
    PDSERVE_ASSIGN_OR_RETURN(*plan, comm::ParallelPlan::FromString(text, std::string(key) + ".plan"));
    *plan_set = true;
  }
  return Status::Ok();
}

Status MergeImpl(const YAML::Node& root, const std::string& dir, PlanSpec* s) {
  PDSERVE_RETURN_IF_ERROR(CheckKeys(root, "", {"model", "hardware", "weights", "kv_format", "index_format", "mode",
                                               "prefill", "decode", "colocated", "workload", "slo", "engine",
                                               "search"}));
  auto rel = [&](std::string* p) {
    if (!p->empty() && std::filesystem::path(*p).is_relative() && !std::filesystem::exists(*p) &&
        std::filesystem::exists(std::filesystem::path(dir) / *p))
      *p = (std::filesystem::path(dir) / *p).string();
  };
  PDSERVE_RETURN_IF_ERROR(Read(root, "model", "", &s->model));
  rel(&s->model);
  PDSERVE_RETURN_IF_ERROR(Read(root, "hardware", "", &s->hardware));
  if (s->hardware.find('/') != std::string::npos || s->hardware.ends_with(".yaml")) rel(&s->hardware);
  PDSERVE_RETURN_IF_ERROR(Read(root, "weights", "", &s->weights));
  PDSERVE_RETURN_IF_ERROR(Read(root, "kv_format", "", &s->kv_format));
  PDSERVE_RETURN_IF_ERROR(Read(root, "index_format", "", &s->index_format));
  std::string mode;
  PDSERVE_RETURN_IF_ERROR(Read(root, "mode", "", &mode));
  if (!mode.empty()) {
    if (mode != "disaggregated" && mode != "colocated")
      return Status::InvalidArgument("mode: expected disaggregated or colocated, got '" + mode + "'");
    s->colocated = mode == "colocated";
  }
  PDSERVE_RETURN_IF_ERROR(ReadPool(root, "prefill", &s->prefill_nodes, &s->prefill_instances, &s->prefill_plan_set,
                                   &s->prefill_plan));
  PDSERVE_RETURN_IF_ERROR(ReadPool(root, "decode", &s->decode_nodes, &s->decode_instances, &s->decode_plan_set,
                                   &s->decode_plan));
  PDSERVE_RETURN_IF_ERROR(ReadPool(root, "colocated", &s->colocated_nodes, &s->colocated_instances,
                                   &s->colocated_plan_set, &s->colocated_plan));
  if (const YAML::Node w = root["workload"]; w && !w.IsNull()) {
    PDSERVE_RETURN_IF_ERROR(CheckKeys(w, "workload", {"input_len", "output_len", "range_ratio", "rate", "num_requests",
                                                       "warmup", "seed"}));
    PDSERVE_RETURN_IF_ERROR(Read(w, "input_len", "workload", &s->workload.input_len));
    PDSERVE_RETURN_IF_ERROR(Read(w, "output_len", "workload", &s->workload.output_len));
    PDSERVE_RETURN_IF_ERROR(Read(w, "range_ratio", "workload", &s->workload.range_ratio));
    PDSERVE_RETURN_IF_ERROR(Read(w, "rate", "workload", &s->workload.rate_rps));
    PDSERVE_RETURN_IF_ERROR(Read(w, "num_requests", "workload", &s->workload.num_requests));
    PDSERVE_RETURN_IF_ERROR(Read(w, "warmup", "workload", &s->workload.warmup));
    PDSERVE_RETURN_IF_ERROR(Read(w, "seed", "workload", &s->workload.seed));
  }
  if (const YAML::Node o = root["slo"]; o && !o.IsNull()) {
    PDSERVE_RETURN_IF_ERROR(CheckKeys(o, "slo", {"ttft_ms", "tpot_ms", "attainment"}));
    double ttft = s->slo.ttft_s * 1e3, tpot = s->slo.tpot_s * 1e3;
    PDSERVE_RETURN_IF_ERROR(Read(o, "ttft_ms", "slo", &ttft));
    PDSERVE_RETURN_IF_ERROR(Read(o, "tpot_ms", "slo", &tpot));
    PDSERVE_RETURN_IF_ERROR(Read(o, "attainment", "slo", &s->slo.attainment));
    s->slo.ttft_s = ttft * 1e-3;
    s->slo.tpot_s = tpot * 1e-3;
  }
  if (const YAML::Node e = root["engine"]; e && !e.IsNull()) {
    PDSERVE_RETURN_IF_ERROR(CheckKeys(e, "engine", {"max_num_seqs", "max_step_tokens", "prefill_chunk"}));
    PDSERVE_RETURN_IF_ERROR(Read(e, "max_num_seqs", "engine", &s->limits.max_num_seqs));
    PDSERVE_RETURN_IF_ERROR(Read(e, "max_step_tokens", "engine", &s->limits.max_step_tokens));
    PDSERVE_RETURN_IF_ERROR(Read(e, "prefill_chunk", "engine", &s->limits.prefill_chunk));
  }
  if (const YAML::Node e = root["search"]; e && !e.IsNull()) {
    PDSERVE_RETURN_IF_ERROR(CheckKeys(e, "search", {"enabled", "instances"}));
    PDSERVE_RETURN_IF_ERROR(Read(e, "enabled", "search", &s->search));
    PDSERVE_RETURN_IF_ERROR(Read(e, "instances", "search", &s->search_instances));
  }
  return Status::Ok();
}

}  // namespace

Status PlanSpec::MergeYamlFile(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) return Status::NotFound("no plan spec file", path);
  try {
    const YAML::Node root = YAML::LoadFile(path);
    if (!root.IsMap()) return Status::InvalidArgument("a plan spec must be a YAML mapping", path);
    return MergeImpl(root, std::filesystem::path(path).parent_path().string(), this).WithContext("plan spec " + path);
  } catch (const std::exception& e) {
    return Status::InvalidArgument(std::string("plan spec is not valid YAML: ") + e.what(), path);
  }
}

}  // namespace pdserve::planner
