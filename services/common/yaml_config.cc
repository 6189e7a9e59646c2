#include "services/common/yaml_config.h"

#include <filesystem>
#include <limits>

namespace pdserve::services {

Result<YamlSection> YamlSection::LoadFile(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) return Status::NotFound("config file '" + path + "' does not exist");
  try {
    YAML::Node root = YAML::LoadFile(path);
    if (root.IsNull()) root = YAML::Node(YAML::NodeType::Map);
    if (!root.IsMap()) return Status::InvalidArgument(path + ": the top level must be a mapping");
    return YamlSection(root, "");
  } catch (const YAML::Exception& e) {
    return Status::InvalidArgument(path + ": " + e.what());
  }
}

Result<YamlSection> YamlSection::Parse(std::string_view text, std::string origin) {
  try {
    YAML::Node root = YAML::Load(std::string(text));
    if (root.IsNull()) root = YAML::Node(YAML::NodeType::Map);
    if (!root.IsMap()) return Status::InvalidArgument(origin + ": the top level must be a mapping");
    return YamlSection(root, "");
  } catch (const YAML::Exception& e) {
    return Status::InvalidArgument(origin + ": " + e.what());
  }
}

std::string YamlSection::KeyPath(std::string_view key) const {
  return path_.empty() ? std::string(key) : path_ + "." + std::string(key);
}

bool YamlSection::Has(std::string_view key) const {
  if (!node_.IsDefined() || !node_.IsMap()) return false;
  try {
    const YAML::Node& self = node_;
    const YAML::Node v = self[std::string(key)];
    return v.IsDefined() && !v.IsNull();
  } catch (const YAML::Exception&) {
    return false;
  }
}

Result<YamlSection> YamlSection::Section(std::string_view key) const {
  if (!Has(key)) return YamlSection(YAML::Node(YAML::NodeType::Map), KeyPath(key));
  try {
    const YAML::Node& self = node_;
    YAML::Node v = self[std::string(key)];
    if (!v.IsMap()) return Status::InvalidArgument(KeyPath(key) + ": expected a mapping");
    return YamlSection(v, KeyPath(key));
  } catch (const YAML::Exception& e) {
    return Status::InvalidArgument(KeyPath(key) + ": " + e.what());
  }
}

Result<std::vector<YamlSection>> YamlSection::SectionList(std::string_view key) const {
  std::vector<YamlSection> out;
  if (!Has(key)) return out;
  try {
    const YAML::Node& self = node_;
    YAML::Node v = self[std::string(key)];
    if (!v.IsSequence()) return Status::InvalidArgument(KeyPath(key) + ": expected a list");
    for (size_t i = 0; i < v.size(); ++i) {
      const std::string at = KeyPath(key) + "[" + std::to_string(i) + "]";
      if (!v[i].IsMap()) return Status::InvalidArgument(at + ": expected a mapping");
      out.push_back(YamlSection(v[i], at));
    }
    return out;
  } catch (const YAML::Exception& e) {
    return Status::InvalidArgument(KeyPath(key) + ": " + e.what());
  }
}

Status YamlSection::CheckKeys(std::initializer_list<std::string_view> allowed) const {
  if (!node_.IsDefined() || !node_.IsMap()) return Status::Ok();
  try {
    for (const auto& kv : node_) {
      const std::string key = kv.first.as<std::string>();
      bool known = false;
      for (auto a : allowed) known = known || a == key;
      if (!known) {
        std::string list;
        for (auto a : allowed) list += (list.empty() ? "" : ", ") + std::string(a);
        return Status::InvalidArgument(KeyPath(key) + ": unknown key (known keys: " + list + ")");
      }
    }
  } catch (const YAML::Exception& e) {
    return Status::InvalidArgument((path_.empty() ? "config" : path_) + ": " + e.what());
  }
  return Status::Ok();
}

template <typename T>
Status YamlSection::GetScalar(std::string_view key, T* out, const char* type_name) const {
  if (!Has(key)) return Status::Ok();
  try {
    const YAML::Node& self = node_;
    YAML::Node v = self[std::string(key)];
    if (!v.IsScalar()) return Status::InvalidArgument(KeyPath(key) + ": expected " + type_name);
    *out = v.as<T>();
    return Status::Ok();
  } catch (const YAML::Exception&) {
    return Status::InvalidArgument(KeyPath(key) + ": expected " + type_name);
  }
}

Status YamlSection::Get(std::string_view key, bool* out) const { return GetScalar(key, out, "true or false"); }
Status YamlSection::Get(std::string_view key, int64_t* out) const { return GetScalar(key, out, "an integer"); }
Status YamlSection::Get(std::string_view key, double* out) const { return GetScalar(key, out, "a number"); }
Status YamlSection::Get(std::string_view key, std::string* out) const { return GetScalar(key, out, "a string"); }

Status YamlSection::Get(std::string_view key, int32_t* out) const {
  int64_t v = *out;
  PDSERVE_RETURN_IF_ERROR(Get(key, &v));
  if (v < std::numeric_limits<int32_t>::min() || v > std::numeric_limits<int32_t>::max())
    return Status::InvalidArgument(KeyPath(key) + ": out of range");
  *out = static_cast<int32_t>(v);
  return Status::Ok();
}

Status YamlSection::Get(std::string_view key, uint32_t* out) const {
  int64_t v = *out;
  PDSERVE_RETURN_IF_ERROR(Get(key, &v));
  if (v < 0 || v > std::numeric_limits<uint32_t>::max())
    return Status::InvalidArgument(KeyPath(key) + ": expected a non-negative integer below 2^32");
  *out = static_cast<uint32_t>(v);
  return Status::Ok();
}

Status YamlSection::Get(std::string_view key, std::chrono::milliseconds* out) const {
  int64_t v = out->count();
  PDSERVE_RETURN_IF_ERROR(Get(key, &v));
  if (v < 0) return Status::InvalidArgument(KeyPath(key) + ": expected a non-negative number of milliseconds");
  *out = std::chrono::milliseconds(v);
  return Status::Ok();
}

Status YamlSection::Get(std::string_view key, std::vector<std::string>* out) const {
  if (!Has(key)) return Status::Ok();
  try {
    const YAML::Node& self = node_;
    YAML::Node v = self[std::string(key)];
    if (!v.IsSequence()) return Status::InvalidArgument(KeyPath(key) + ": expected a list of strings");
    std::vector<std::string> items;
    for (size_t i = 0; i < v.size(); ++i) {
      if (!v[i].IsScalar()) return Status::InvalidArgument(KeyPath(key) + "[" + std::to_string(i) + "]: expected a string");
      items.push_back(v[i].as<std::string>());
    }
    *out = std::move(items);
    return Status::Ok();
  } catch (const YAML::Exception&) {
    return Status::InvalidArgument(KeyPath(key) + ": expected a list of strings");
  }
}

Status YamlSection::Get(std::string_view key, std::map<std::string, std::string>* out) const {
  if (!Has(key)) return Status::Ok();
  try {
    const YAML::Node& self = node_;
    YAML::Node v = self[std::string(key)];
    if (!v.IsMap()) return Status::InvalidArgument(KeyPath(key) + ": expected a mapping of strings");
    std::map<std::string, std::string> items;
    for (const auto& kv : v) {
      if (!kv.second.IsScalar())
        return Status::InvalidArgument(KeyPath(key) + "." + kv.first.as<std::string>() + ": expected a string");
      items[kv.first.as<std::string>()] = kv.second.as<std::string>();
    }
    *out = std::move(items);
    return Status::Ok();
  } catch (const YAML::Exception&) {
    return Status::InvalidArgument(KeyPath(key) + ": expected a mapping of strings");
  }
}

Status YamlSection::GetEnum(std::string_view key, std::initializer_list<std::string_view> choices,
                            std::string* out) const {
  std::string v = *out;
  PDSERVE_RETURN_IF_ERROR(Get(key, &v));
  for (auto c : choices)
    if (c == v) {
      *out = v;
      return Status::Ok();
    }
  std::string list;
  for (auto c : choices) list += (list.empty() ? "" : ", ") + std::string(c);
  return Status::InvalidArgument(KeyPath(key) + ": '" + v + "' is not one of " + list);
}

}  // namespace pdserve::services
