#include "planner/hardware_profile.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <sstream>

#include <yaml-cpp/yaml.h>

#include "planner/builtin_profiles.h"

namespace pdserve::planner {

namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

// A mapping node plus its key path, for error messages.
struct Node {
  YAML::Node node;
  std::string path;

  std::string Key(std::string_view k) const { return path.empty() ? std::string(k) : path + "." + std::string(k); }

  Status CheckKeys(std::initializer_list<std::string_view> allowed) const {
    if (!node || node.IsNull()) return Status::Ok();
    if (!node.IsMap()) return Status::InvalidArgument((path.empty() ? "<top>" : path) + ": expected a mapping");
    for (const auto& kv : node) {
      const std::string key = kv.first.as<std::string>();
      if (std::find(allowed.begin(), allowed.end(), key) == allowed.end()) {
        std::string list;
        for (auto a : allowed) list += (list.empty() ? "" : ", ") + std::string(a);
        return Status::InvalidArgument(Key(key) + ": unknown key (expected one of: " + list + ")");
      }
    }
    return Status::Ok();
  }
  Result<Node> Sub(std::string_view k) const {
    Node n{node[std::string(k)], Key(k)};
    if (n.node && !n.node.IsNull() && !n.node.IsMap()) return Status::InvalidArgument(n.path + ": expected a mapping");
    return n;
  }
  bool Has(std::string_view k) const { return node && node.IsMap() && node[std::string(k)] && !node[std::string(k)].IsNull(); }

  // A finite number >= min_value (strictly > when `positive`).
  Status Number(std::string_view k, double* out, bool required, bool positive = false) const {
    if (!Has(k)) {
      if (required) return Status::InvalidArgument(Key(k) + ": missing");
      return Status::Ok();
    }
    const YAML::Node v = node[std::string(k)];
    double x = 0;
    try {
      if (!v.IsScalar()) throw std::runtime_error("not a scalar");
      x = v.as<double>();
    } catch (const std::exception&) {
      return Status::InvalidArgument(Key(k) + ": expected a number");
    }
    if (!std::isfinite(x) || x < 0 || (positive && x <= 0))
      return Status::InvalidArgument(Key(k) + ": expected a " + (positive ? "positive" : "non-negative") +
                                     " number, got " + v.as<std::string>());
    *out = x;
    return Status::Ok();
  }
  Status String(std::string_view k, std::string* out, bool required) const {
    if (!Has(k)) {
      if (required) return Status::InvalidArgument(Key(k) + ": missing");
      return Status::Ok();
    }
    const YAML::Node v = node[std::string(k)];
    if (!v.IsScalar()) return Status::InvalidArgument(Key(k) + ": expected a string");
    *out = v.as<std::string>();
    return Status::Ok();
  }
};

Result<MathType> ParseMath(const std::string& name, const std::string& where) {
  if (name == "bf16") return MathType::kBf16;
  if (name == "fp8") return MathType::kFp8;
  if (name == "int8") return MathType::kInt8;
  return Status::InvalidArgument(where + ": unknown data type '" + name + "' (bf16, fp8, int8)");
}

// {bf16: x, fp8: y, int8: z} in TFLOP/s -> FLOP/s times `eff`.
Status ReadRates(const Node& parent, std::string_view key, double eff, std::map<MathType, double>* out) {
  if (!parent.Has(key)) return Status::Ok();
  PDSERVE_ASSIGN_OR_RETURN(Node n, parent.Sub(key));
  for (const auto& kv : n.node) {
    const std::string k = kv.first.as<std::string>();
    PDSERVE_ASSIGN_OR_RETURN(MathType t, ParseMath(k, n.Key(k)));
    double tflops = 0;
    PDSERVE_RETURN_IF_ERROR(n.Number(k, &tflops, true, true));
    (*out)[t] = tflops * 1e12 * eff;
  }
  return Status::Ok();
}

Status ReadLink(const Node& parent, std::string_view key, double eff, bool required, LinkSpec* out) {
  if (!parent.Has(key)) {
    if (required) return Status::InvalidArgument(parent.Key(key) + ": missing");
    return Status::Ok();
  }
  PDSERVE_ASSIGN_OR_RETURN(Node n, parent.Sub(key));
  PDSERVE_RETURN_IF_ERROR(n.CheckKeys({"bandwidth_gbs", "latency_us"}));
  double gbs = 0, us = 0;
  PDSERVE_RETURN_IF_ERROR(n.Number("bandwidth_gbs", &gbs, true, true));
  PDSERVE_RETURN_IF_ERROR(n.Number("latency_us", &us, true));
  out->bandwidth_bps = gbs * 1e9 * eff;
  out->latency_s = us * 1e-6;
  return Status::Ok();
}

Result<HardwareProfile> ParseImpl(const YAML::Node& root, const std::string& origin) {
  if (!root || !root.IsMap()) return Status::InvalidArgument("a hardware profile must be a YAML mapping", origin);
  HardwareProfile p;
  Node top{root, ""};
  PDSERVE_RETURN_IF_ERROR(top.CheckKeys(
      {"name", "description", "sources", "cost_per_device_hour", "device", "node", "kv_transfer", "runtime", "engine"}));
  PDSERVE_RETURN_IF_ERROR(top.String("name", &p.name, true));
  PDSERVE_RETURN_IF_ERROR(top.String("description", &p.description, false));
  if (top.Has("sources")) {
    const YAML::Node s = root["sources"];
    if (!s.IsSequence()) return Status::InvalidArgument("sources: expected a list of strings");
    for (const auto& e : s) p.sources.push_back(e.as<std::string>());
  }
  PDSERVE_RETURN_IF_ERROR(top.Number("cost_per_device_hour", &p.cost_per_device_hour, false));

  PDSERVE_ASSIGN_OR_RETURN(Node dev, top.Sub("device"));
  if (!top.Has("device")) return Status::InvalidArgument("device: missing");
  PDSERVE_RETURN_IF_ERROR(dev.CheckKeys({"name", "memory_gib", "memory_bandwidth_gbs", "matmul_tflops", "gemv_tflops",
                                         "matmul_tflops_by_rows",
                                         "small_m_max", "attention_tflops", "expanded_attention_tflops", "indexer_tflops", "topk_keys_per_s",
                                         "efficiency"}));
  double eff_matmul = 1, eff_memory = 1, eff_attention = 1, eff_indexer = 1, eff_network = 1;
  if (dev.Has("efficiency")) {
    PDSERVE_ASSIGN_OR_RETURN(Node e, dev.Sub("efficiency"));
    PDSERVE_RETURN_IF_ERROR(e.CheckKeys({"matmul", "memory", "attention", "indexer", "network"}));
    PDSERVE_RETURN_IF_ERROR(e.Number("matmul", &eff_matmul, false, true));
    PDSERVE_RETURN_IF_ERROR(e.Number("memory", &eff_memory, false, true));
    PDSERVE_RETURN_IF_ERROR(e.Number("attention", &eff_attention, false, true));
    PDSERVE_RETURN_IF_ERROR(e.Number("indexer", &eff_indexer, false, true));
    PDSERVE_RETURN_IF_ERROR(e.Number("network", &eff_network, false, true));
    for (double x : {eff_matmul, eff_memory, eff_attention, eff_indexer, eff_network})
      if (x > 1) return Status::InvalidArgument("device.efficiency: factors must be in (0, 1]");
  }
  double gib = 0, gbs = 0, attn = 0, idx = 0, small_m = 8;
  PDSERVE_RETURN_IF_ERROR(dev.Number("memory_gib", &gib, true, true));
  PDSERVE_RETURN_IF_ERROR(dev.Number("memory_bandwidth_gbs", &gbs, true, true));
  PDSERVE_RETURN_IF_ERROR(dev.Number("attention_tflops", &attn, true, true));
  PDSERVE_RETURN_IF_ERROR(dev.Number("indexer_tflops", &idx, true, true));
  PDSERVE_RETURN_IF_ERROR(dev.Number("topk_keys_per_s", &p.topk_keys_per_s, false));
  PDSERVE_RETURN_IF_ERROR(dev.Number("small_m_max", &small_m, false));
  p.memory_bytes = gib * kGiB;
  p.memory_bandwidth_bps = gbs * 1e9 * eff_memory;
  p.attention_flops = attn * 1e12 * eff_attention;
  double exp_attn = attn;
  PDSERVE_RETURN_IF_ERROR(dev.Number("expanded_attention_tflops", &exp_attn, false, true));
  p.expanded_attention_flops = exp_attn * 1e12 * eff_attention;
  p.indexer_flops = idx * 1e12 * eff_indexer;
  p.small_m_max = static_cast<int64_t>(small_m);
  PDSERVE_RETURN_IF_ERROR(ReadRates(dev, "matmul_tflops", eff_matmul, &p.matmul_flops));
  PDSERVE_RETURN_IF_ERROR(ReadRates(dev, "gemv_tflops", eff_matmul, &p.gemv_flops));
  if (dev.Has("matmul_tflops_by_rows")) {
    PDSERVE_ASSIGN_OR_RETURN(Node by, dev.Sub("matmul_tflops_by_rows"));
    for (const auto& kv : by.node) {
      const std::string k = kv.first.as<std::string>();
      PDSERVE_ASSIGN_OR_RETURN(MathType t, ParseMath(k, by.Key(k)));
      PDSERVE_ASSIGN_OR_RETURN(Node pts, by.Sub(k));
      for (const auto& pt : pts.node) {
        const std::string rows = pt.first.as<std::string>();
        char* end = nullptr;
        const long long m = std::strtoll(rows.c_str(), &end, 10);
        if (rows.empty() || *end != '\0' || m < 1)
          return Status::InvalidArgument(pts.Key(rows) + ": expected a row count (a positive integer) as the key");
        double tflops = 0;
        PDSERVE_RETURN_IF_ERROR(pts.Number(rows, &tflops, true, true));
        p.matmul_flops_by_rows[t][m] = tflops * 1e12 * eff_matmul;
      }
    }
  }
  if (!p.HasMath(MathType::kBf16)) return Status::InvalidArgument("device.matmul_tflops.bf16: missing");

  PDSERVE_ASSIGN_OR_RETURN(Node node, top.Sub("node"));
  if (!top.Has("node")) return Status::InvalidArgument("node: missing");
  PDSERVE_RETURN_IF_ERROR(node.CheckKeys({"devices", "intra", "inter"}));
  double devices = 0;
  PDSERVE_RETURN_IF_ERROR(node.Number("devices", &devices, true, true));
  if (devices != std::floor(devices) || devices > 65536)
    return Status::InvalidArgument("node.devices: expected a whole number in [1, 65536]");
  p.devices_per_node = static_cast<int64_t>(devices);
  PDSERVE_RETURN_IF_ERROR(ReadLink(node, "intra", eff_network, true, &p.intra));
  PDSERVE_RETURN_IF_ERROR(ReadLink(node, "inter", eff_network, true, &p.inter));
  PDSERVE_RETURN_IF_ERROR(ReadLink(top, "kv_transfer", eff_network, true, &p.kv_transfer));

  PDSERVE_ASSIGN_OR_RETURN(Node rt, top.Sub("runtime"));
  PDSERVE_RETURN_IF_ERROR(rt.CheckKeys({"step_overhead_us", "row_overhead_us", "row_layer_overhead_us",
                                        "request_overhead_ms", "pd_overhead_ms", "token_delivery_us",
                                        "memory_reserved_gib"}));
  double v = 0;
  PDSERVE_RETURN_IF_ERROR(rt.Number("step_overhead_us", &v, false)); p.step_overhead_s = v * 1e-6; v = 0;
  PDSERVE_RETURN_IF_ERROR(rt.Number("row_overhead_us", &v, false)); p.row_overhead_s = v * 1e-6; v = 0;
  PDSERVE_RETURN_IF_ERROR(rt.Number("row_layer_overhead_us", &v, false)); p.row_layer_overhead_s = v * 1e-6; v = 0;
  PDSERVE_RETURN_IF_ERROR(rt.Number("request_overhead_ms", &v, false)); p.request_overhead_s = v * 1e-3; v = 0;
  PDSERVE_RETURN_IF_ERROR(rt.Number("pd_overhead_ms", &v, false)); p.pd_overhead_s = v * 1e-3; v = 0;
  PDSERVE_RETURN_IF_ERROR(rt.Number("token_delivery_us", &v, false)); p.token_delivery_s = v * 1e-6; v = 0;
  PDSERVE_RETURN_IF_ERROR(rt.Number("memory_reserved_gib", &v, false)); p.memory_reserved_bytes = v * kGiB;

  PDSERVE_ASSIGN_OR_RETURN(Node eng, top.Sub("engine"));
  PDSERVE_RETURN_IF_ERROR(eng.CheckKeys({"first_chunk_attention", "act_bytes", "decode_row_group"}));
  std::string form = "absorbed";
  PDSERVE_RETURN_IF_ERROR(eng.String("first_chunk_attention", &form, false));
  if (form != "absorbed" && form != "expanded")
    return Status::InvalidArgument("engine.first_chunk_attention: expected absorbed or expanded, got '" + form + "'");
  p.first_chunk_expanded = form == "expanded";
  double act = 2;
  PDSERVE_RETURN_IF_ERROR(eng.Number("act_bytes", &act, false, true));
  p.act_bytes = static_cast<int64_t>(act);
  double group = 0;
  PDSERVE_RETURN_IF_ERROR(eng.Number("decode_row_group", &group, false));
  p.decode_row_group = static_cast<int64_t>(group);
  if (p.memory_reserved_bytes >= p.memory_bytes)
    return Status::InvalidArgument("runtime.memory_reserved_gib: not below device.memory_gib");
  return p;
}

}  // namespace

const char* MathTypeName(MathType t) {
  switch (t) {
    case MathType::kBf16: return "bf16";
    case MathType::kFp8: return "fp8";
    case MathType::kInt8: return "int8";
  }
  return "?";
}

double HardwareProfile::GemmFlops(MathType t, int64_t m) const {
  if (m <= small_m_max) {
    auto it = gemv_flops.find(t);
    if (it != gemv_flops.end()) return it->second;
  }
  const double peak = matmul_flops.at(t);
  auto by = matmul_flops_by_rows.find(t);
  if (by == matmul_flops_by_rows.end() || by->second.empty()) return peak;
  // Points (m_i, r_i) plus (4 m_last, peak); linear in log m between them.
  std::vector<std::pair<double, double>> pts;
  for (const auto& [rows, rate] : by->second) pts.emplace_back(std::log(static_cast<double>(rows)), rate);
  pts.emplace_back(pts.back().first + std::log(4.0), peak);
  const double x = std::log(static_cast<double>(std::max<int64_t>(m, 1)));
  if (x <= pts.front().first) return pts.front().second;
  for (size_t i = 1; i < pts.size(); ++i)
    if (x <= pts[i].first) {
      const double f = (x - pts[i - 1].first) / (pts[i].first - pts[i - 1].first);
      return pts[i - 1].second + f * (pts[i].second - pts[i - 1].second);
    }
  return peak;
}

Result<HardwareProfile> HardwareProfile::Parse(std::string_view yaml_text, const std::string& origin) {
  try {
    const YAML::Node root = YAML::Load(std::string(yaml_text));
    auto r = ParseImpl(root, origin);
    if (!r.ok()) return r.status().WithContext("hardware profile " + origin);
    return r;
  } catch (const std::exception& e) {
    return Status::InvalidArgument(std::string("hardware profile is not valid YAML: ") + e.what(), origin);
  }
}

Result<HardwareProfile> HardwareProfile::Load(const std::string& name_or_path) {
  if (const char* text = BuiltinProfileText(name_or_path)) return Parse(text, "builtin:" + name_or_path);
  std::error_code ec;
  if (!std::filesystem::is_regular_file(name_or_path, ec)) {
    std::string names;
    for (const auto& n : BuiltinProfileNames()) names += (names.empty() ? "" : ", ") + n;
    return Status::NotFound("no hardware profile '" + name_or_path + "' (a YAML file, or one of: " + names + ")");
  }
  std::ifstream in(name_or_path);
  std::stringstream ss;
  ss << in.rdbuf();
  if (!in) return Status::NotFound("cannot read hardware profile", name_or_path);
  return Parse(ss.str(), name_or_path);
}

nlohmann::json HardwareProfile::ToJson() const {
  nlohmann::json rates = nlohmann::json::object();
  for (const auto& [t, f] : matmul_flops) rates[MathTypeName(t)] = f;
  nlohmann::json gemv = nlohmann::json::object();
  for (const auto& [t, f] : gemv_flops) gemv[MathTypeName(t)] = f;
  return {{"name", name},
          {"description", description},
          {"devices_per_node", devices_per_node},
          {"memory_bytes", memory_bytes},
          {"memory_bandwidth_bps", memory_bandwidth_bps},
          {"matmul_flops", rates},
          {"gemv_flops", gemv},
          {"attention_flops", attention_flops},
          {"indexer_flops", indexer_flops},
          {"intra_bandwidth_bps", intra.bandwidth_bps},
          {"inter_bandwidth_bps", inter.bandwidth_bps},
          {"kv_transfer_bandwidth_bps", kv_transfer.bandwidth_bps},
          {"cost_per_device_hour", cost_per_device_hour}};
}

std::vector<std::string> BuiltinProfileNames() {
  std::vector<std::string> names;
  for (const auto& e : kBuiltinProfiles) names.emplace_back(e.name);
  std::sort(names.begin(), names.end());
  return names;
}

const char* BuiltinProfileText(std::string_view name) {
  for (const auto& e : kBuiltinProfiles)
    if (name == e.name) return e.yaml;
  return nullptr;
}

}  // namespace pdserve::planner
