// Checkpoint: a Hugging Face model directory (config.json + one or many safetensors shards,
// with `model.safetensors.index.json` when sharded), every shard mmap'd once.
//
// Tensors are looked up by their HF names; the loader marks what it consumed so that tensors
// nobody asked for can be reported (a wrong architecture or a truncated conversion shows up as
// "unexpected tensors: ..." instead of silently running with defaults).
// Thread-safety: not thread-safe (Find marks tensors as used); owned by the loading thread.
#pragma once

#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "model/config.h"
#include "model/safetensors.h"

namespace pdserve::model {

class Checkpoint {
 public:
  // Errors: NotFound (no config.json or no safetensors), InvalidArgument (bad index JSON, a
  // shard named by the index is missing, the index names a tensor its shard lacks, the same
  // tensor in two shards, or any SafetensorsFile error).
  // `index_name`: the index file to read when it exists (an expert-parallel rank opens its own
  // "model-ep{r}-of-{N}.safetensors.index.json", which lists only the shards it needs).
  static Result<std::unique_ptr<Checkpoint>> Open(
      const std::string& dir, const std::string& index_name = "model.safetensors.index.json");

  const ModelConfig& config() const { return config_; }
  const std::string& dir() const { return dir_; }

  // Returns the tensor or nullptr; marks it used.
  const TensorInfo* Find(const std::string& name);
  // Every tensor by name, without marking any used (for size accounting).
  const std::map<std::string, const TensorInfo*>& tensors() const { return by_name_; }
  // Tensor names not consumed by Find (sorted).
  std::vector<std::string> UnusedNames() const;

 private:
  std::string dir_;
  ModelConfig config_;
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::string, const TensorInfo*> by_name_;
  std::set<std::string> used_;
};

}  // namespace pdserve::model
