#include "model/checkpoint.h"

#include <algorithm>
#include <filesystem>

#include "common/mapped_file.h"

namespace pdserve::model {

namespace fs = std::filesystem;

Result<std::unique_ptr<Checkpoint>> Checkpoint::Open(const std::string& dir, const std::string& index_name) {
  if (!fs::is_directory(dir)) return Status::NotFound("model directory does not exist", dir);
  auto ckpt = std::make_unique<Checkpoint>();
  ckpt->dir_ = dir;
  PDSERVE_ASSIGN_OR_RETURN(ckpt->config_, ModelConfig::Load((fs::path(dir) / "config.json").string()));

  // Which files to open, and (when sharded) which tensor each must hold.
  std::vector<std::string> shard_names;
  std::map<std::string, std::string> expected_shard;  // tensor -> shard, from the index
  const fs::path index_path = fs::path(dir) / index_name;
  if (fs::exists(index_path)) {
    PDSERVE_ASSIGN_OR_RETURN(std::string text, ReadFileToString(index_path.string()));
    auto j = nlohmann::json::parse(text, nullptr, false);
    if (j.is_discarded() || !j.is_object() || !j.contains("weight_map") || !j["weight_map"].is_object())
      return Status::InvalidArgument("index is not JSON with a 'weight_map' object", index_path.string());
    for (auto it = j["weight_map"].begin(); it != j["weight_map"].end(); ++it) {
      if (!it.value().is_string())
        return Status::InvalidArgument("weight_map entry '" + it.key() + "' is not a file name", index_path.string());
      const std::string shard = it.value().get<std::string>();
      if (shard.find('/') != std::string::npos || shard == "..")
        return Status::InvalidArgument("weight_map names a file outside the directory: " + shard, index_path.string());
      expected_shard[it.key()] = shard;
      if (std::find(shard_names.begin(), shard_names.end(), shard) == shard_names.end())
        shard_names.push_back(shard);
    }
  } else {
    for (const auto& e : fs::directory_iterator(dir))
      if (e.path().extension() == ".safetensors") shard_names.push_back(e.path().filename().string());
    std::sort(shard_names.begin(), shard_names.end());
  }
  if (shard_names.empty()) return Status::NotFound("no *.safetensors files", dir);

  for (const auto& shard : shard_names) {
    const std::string path = (fs::path(dir) / shard).string();
    if (!fs::exists(path))
      return Status::InvalidArgument("shard named by model.safetensors.index.json is missing", path);
    PDSERVE_ASSIGN_OR_RETURN(auto file, SafetensorsFile::Open(path));
    for (const auto& [name, info] : file->tensors()) {
      if (ckpt->by_name_.count(name))
        return Status::InvalidArgument("tensor '" + name + "' appears in two shards: " +
                                       ckpt->by_name_[name]->file + " and " + path);
      if (!expected_shard.empty()) {
        auto it = expected_shard.find(name);
        if (it == expected_shard.end())
          return Status::InvalidArgument("tensor '" + name + "' is not listed in the index", path);
        if (it->second != shard)
          return Status::InvalidArgument("tensor '" + name + "' is in " + shard + " but the index says " + it->second, path);
      }
      ckpt->by_name_[name] = &info;
    }
    ckpt->files_.push_back(std::move(file));
  }
  for (const auto& [name, shard] : expected_shard)
    if (!ckpt->by_name_.count(name))
      return Status::InvalidArgument("the index lists tensor '" + name + "' but " + shard + " does not hold it", dir);
  return ckpt;
}

const TensorInfo* Checkpoint::Find(const std::string& name) {
  auto it = by_name_.find(name);
  if (it == by_name_.end()) return nullptr;
  used_.insert(name);
  return it->second;
}

std::vector<std::string> Checkpoint::UnusedNames() const {
  std::vector<std::string> out;
  for (const auto& [name, info] : by_name_)
    if (!used_.count(name)) out.push_back(name);
  return out;
}

}  // namespace pdserve::model
