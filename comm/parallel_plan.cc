#include "comm/parallel_plan.h"

#include <cstdlib>
#include <fstream>
#include <map>
#include <sstream>

#include <fmt/format.h>
#include <yaml-cpp/yaml.h>

namespace pdserve::comm {

namespace {

constexpr int kMaxGroupSize = 65536;

// Reads the four sizes from a flat key -> integer map; shared by the JSON and YAML forms.
Result<ParallelPlan> FromSizes(const std::map<std::string, int64_t>& sizes, std::string_view where) {
  ParallelPlan plan;
  for (const auto& [key, value] : sizes) {
    int* field = key == "cp" ? &plan.cp : key == "dp" ? &plan.dp : key == "ep" ? &plan.ep
               : key == "tp" ? &plan.tp : nullptr;
    if (field == nullptr) {
      return Status::InvalidArgument(
          fmt::format("unknown parallel plan key '{}' (expected cp, dp, ep, tp)", key), where);
    }
    if (value < 1 || value > kMaxGroupSize) {
      return Status::InvalidArgument(
          fmt::format("parallel plan {}={} is out of range [1, {}]", key, value, kMaxGroupSize), where);
    }
    *field = static_cast<int>(value);
  }
  return plan;
}

}  // namespace

Status ParallelPlan::Validate(int world_size, const PlanModelDims& dims) const {
  const std::string plan = ToString();
  for (const auto& [name, v] : {std::pair{"cp", cp}, {"dp", dp}, {"ep", ep}, {"tp", tp}}) {
    if (v < 1 || v > kMaxGroupSize) {
      return Status::InvalidArgument(
          fmt::format("parallel plan [{}]: {}={} is out of range [1, {}]", plan, name, v, kMaxGroupSize));
    }
  }
  if (attention_ranks() != world_size) {
    return Status::InvalidArgument(fmt::format(
        "parallel plan [{}]: cp*dp*tp = {} ranks, but the MPI world has {} (mpirun -n must equal "
        "cp*dp*tp)", plan, attention_ranks(), world_size));
  }
  if (world_size % ep != 0) {
    return Status::InvalidArgument(fmt::format(
        "parallel plan [{}]: ep={} does not divide the world size {} (EP groups are runs of ep "
        "adjacent ranks)", plan, ep, world_size));
  }
  if (dims.n_routed_experts > 0 && dims.n_routed_experts % ep != 0) {
    return Status::InvalidArgument(fmt::format(
        "parallel plan [{}]: ep={} does not divide the model's {} routed experts", plan, ep,
        dims.n_routed_experts));
  }
  if (dims.num_attention_heads > 0 && dims.num_attention_heads % tp != 0) {
    return Status::InvalidArgument(fmt::format(
        "parallel plan [{}]: tp={} does not divide the model's {} attention heads (o_proj is "
        "sharded by whole heads)", plan, tp, dims.num_attention_heads));
  }
  if (dims.vocab_size > 0 && dims.vocab_size < tp) {
    return Status::InvalidArgument(fmt::format(
        "parallel plan [{}]: tp={} exceeds the vocabulary size {}", plan, tp, dims.vocab_size));
  }
  return Status::Ok();
}

Result<ParallelPlan> ParallelPlan::FromJson(const nlohmann::json& j, std::string_view where) {
  const nlohmann::json& node = j.is_object() && j.contains("parallel") ? j.at("parallel") : j;
  if (!node.is_object()) {
    return Status::InvalidArgument("parallel plan must be an object {cp, dp, ep, tp}", where);
  }
  std::map<std::string, int64_t> sizes;
  for (const auto& [key, value] : node.items()) {
    if (!value.is_number_integer()) {
      return Status::InvalidArgument(
          fmt::format("parallel plan key '{}' must be an integer, got {}", key, value.dump()), where);
    }
    sizes[key] = value.get<int64_t>();
  }
  return FromSizes(sizes, where);
}

Result<ParallelPlan> ParallelPlan::FromYaml(std::string_view yaml_text, std::string_view where) {
  YAML::Node root;
  try {
    root = YAML::Load(std::string(yaml_text));
  } catch (const YAML::Exception& e) {
    return Status::InvalidArgument(fmt::format("YAML parse error: {}", e.what()), where);
  }
  const YAML::Node node = root.IsMap() && root["parallel"] ? root["parallel"] : root;
  if (!node.IsMap()) {
    return Status::InvalidArgument("parallel plan must be a mapping {cp, dp, ep, tp}", where);
  }
  std::map<std::string, int64_t> sizes;
  for (const auto& kv : node) {
    const std::string key = kv.first.as<std::string>();
    try {
      sizes[key] = kv.second.as<int64_t>();
    } catch (const YAML::Exception&) {
      return Status::InvalidArgument(
          fmt::format("parallel plan key '{}' must be an integer", key), where);
    }
  }
  return FromSizes(sizes, where);
}

Result<ParallelPlan> ParallelPlan::LoadFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return Status::NotFound(fmt::format("cannot read parallel plan file {}", path));
  std::stringstream text;
  text << in.rdbuf();
  const auto ends_with = [&](std::string_view suffix) {
    return path.size() >= suffix.size() && path.compare(path.size() - suffix.size(), suffix.size(), suffix) == 0;
  };
  if (ends_with(".yaml") || ends_with(".yml")) return FromYaml(text.str(), path);
  nlohmann::json j = nlohmann::json::parse(text.str(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return Status::InvalidArgument("JSON parse error", path);
  return FromJson(j, path);
}

nlohmann::json ParallelPlan::ToJson() const {
  return nlohmann::json{{"cp", cp}, {"dp", dp}, {"ep", ep}, {"tp", tp}};
}

std::string ParallelPlan::ToString() const {
  return fmt::format("cp={} dp={} ep={} tp={}", cp, dp, ep, tp);
}

Result<ParallelPlan> ParallelPlan::FromString(std::string_view text, std::string_view where) {
  nlohmann::json j = nlohmann::json::object();
  size_t i = 0;
  while (i < text.size()) {
    size_t k = text.find(',', i);
    if (k == std::string::npos) k = text.size();
    const std::string part(text.substr(i, k - i));
    const size_t eq = part.find('=');
    char* end = nullptr;
    const long v = eq == std::string::npos ? 0 : std::strtol(part.c_str() + eq + 1, &end, 10);
    if (eq == std::string::npos || eq + 1 == part.size() || *end != '\0')
      return Status::InvalidArgument(std::string(where) + ": '" + part + "' is not key=number (e.g. cp=2,ep=2)");
    j[part.substr(0, eq)] = v;
    i = k + 1;
  }
  return FromJson(j, where);
}

}  // namespace pdserve::comm
