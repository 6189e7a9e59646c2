// YamlSection: typed, path-aware reading of YAML configuration files (yaml-cpp underneath).
//
// Every service config is a struct whose members hold the documented defaults
// (docs/configuration.md); loading overwrites only the keys present. Unknown keys are errors
// (CheckKeys), so a typo never silently falls back to a default, and every error names the full
// key path ("router.routing.decode_policy: expected one of ..."). yaml-cpp exceptions never
// escape: they become InvalidArgument.
//
// Thread-safety: a YamlSection is a read-only view; distinct sections may be used from distinct
// threads. Copies share the underlying document.
#pragma once

#include <chrono>
#include <cstdint>
#include <initializer_list>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include <yaml-cpp/yaml.h>

#include "common/status.h"

namespace pdserve::services {

class YamlSection {
 public:
  // Errors: NotFound (no such file), InvalidArgument (not YAML / not a mapping at the top).
  static Result<YamlSection> LoadFile(const std::string& path);
  static Result<YamlSection> Parse(std::string_view text, std::string origin = "<string>");

  // The sub-mapping at `key`; an absent key gives an empty section (all defaults).
  // Errors: InvalidArgument when the value is not a mapping.
  Result<YamlSection> Section(std::string_view key) const;
  // The list of mappings at `key` (absent: empty list).
  Result<std::vector<YamlSection>> SectionList(std::string_view key) const;

  bool Has(std::string_view key) const;
  // InvalidArgument naming the first key not in `allowed`.
  Status CheckKeys(std::initializer_list<std::string_view> allowed) const;

  // Reads `key` into *out when present (else leaves *out alone). Errors: InvalidArgument
  // naming the key path when the value has the wrong type or is out of range.
  Status Get(std::string_view key, bool* out) const;
  Status Get(std::string_view key, int64_t* out) const;
  Status Get(std::string_view key, int32_t* out) const;
  Status Get(std::string_view key, uint32_t* out) const;
  Status Get(std::string_view key, double* out) const;
  Status Get(std::string_view key, std::string* out) const;
  Status Get(std::string_view key, std::vector<std::string>* out) const;
  // A mapping of scalars (e.g. environment variables).
  Status Get(std::string_view key, std::map<std::string, std::string>* out) const;
  // Integer milliseconds.
  Status Get(std::string_view key, std::chrono::milliseconds* out) const;
  // A string that must be one of `choices`.
  Status GetEnum(std::string_view key, std::initializer_list<std::string_view> choices, std::string* out) const;

  // "router.routing" (or the file name for the root).
  const std::string& path() const { return path_; }
  bool empty() const { return !node_.IsDefined() || node_.IsNull() || node_.size() == 0; }

 private:
  YamlSection(YAML::Node node, std::string path) : node_(std::move(node)), path_(std::move(path)) {}
  std::string KeyPath(std::string_view key) const;
  template <typename T>
  Status GetScalar(std::string_view key, T* out, const char* type_name) const;

  YAML::Node node_;
  std::string path_;
};

}  // namespace pdserve::services
