// SafetensorsFile: one mmap'd `.safetensors` file and its parsed, validated header.
//
// File layout (Hugging Face safetensors):
//   [8 bytes] N, little-endian u64: length of the JSON header
//   [N bytes] JSON: {"<tensor name>": {"dtype": "BF16", "shape": [..], "data_offsets": [b, e]},
//                    "__metadata__": {...optional string map...}}
//   [rest]    tensor bytes; offsets are relative to the end of the header
// Every entry is checked at open: known dtype, non-negative shape, offsets inside the data
// region and (e - b) == numel * dtype size, so later reads never leave the mapping.
// Thread-safety: immutable after Open().
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "common/dtype.h"
#include "common/mapped_file.h"
#include "common/status.h"

namespace pdserve::model {

struct TensorInfo {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
  const uint8_t* data = nullptr;  // points into the mapping
  size_t n_bytes = 0;
  std::string file;               // path of the file holding it (for error messages)
  int64_t numel() const {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return n;
  }
  std::string ShapeString() const;
};

class SafetensorsFile {
 public:
  // Errors: NotFound (missing file), InvalidArgument (bad header length, invalid JSON, bad
  // entry, offsets outside the file) -- each naming the file and the tensor.
  static Result<std::unique_ptr<SafetensorsFile>> Open(const std::string& path);

  // Parses and validates the header of a safetensors image held in memory (`bytes` is the whole
  // file; TensorInfo::data points into it). `path` only names the file in errors and in
  // TensorInfo::file. Same errors as Open() but NotFound. Open() is this on the mapping; the
  // fuzzer (tests/fuzz/) calls it directly.
  static Result<std::map<std::string, TensorInfo>> ParseHeader(const uint8_t* bytes, size_t size,
                                                               const std::string& path);

  const std::map<std::string, TensorInfo>& tensors() const { return tensors_; }
  const std::string& path() const { return file_->path(); }

 private:
  explicit SafetensorsFile(std::unique_ptr<MappedFile> f) : file_(std::move(f)) {}
  std::unique_ptr<MappedFile> file_;
  std::map<std::string, TensorInfo> tensors_;
};

// Writes tensors to a safetensors file (used by make-model and tests). Data is copied as is.
struct TensorToWrite {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
  std::vector<uint8_t> bytes;
};
Status WriteSafetensors(const std::string& path, const std::vector<TensorToWrite>& tensors);

}  // namespace pdserve::model
