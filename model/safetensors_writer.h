// SafetensorsWriter: writes one `.safetensors` file tensor by tensor, without ever holding the
// tensors in memory (the converter streams multi-GB shards through a few MB of buffers).
//
// The header (names, dtypes, shapes, hence every offset) is declared up front -- a converter
// knows each output's shape before producing it -- and written first; the data then follows in
// declaration order through Append, in chunks of any size (a chunk may span tensors). The file
// is written as "<path>.tmp" and renamed to <path> by Finish once every declared byte arrived,
// so a crash never leaves a truncated file under the final name.
// File layout as read by SafetensorsFile (model/safetensors.h); the header is padded with
// spaces so the data region starts 8-byte aligned.
// Thread-safety: not thread-safe; one writer per thread.
#pragma once

#include <cstdint>
#include <cstdio>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "common/dtype.h"
#include "common/status.h"

namespace pdserve::model {

struct TensorDecl {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
  uint64_t n_bytes() const;
};

class SafetensorsWriter {
 public:
  // Creates <path>.tmp and writes the header. Errors: InvalidArgument (duplicate or empty name,
  // negative dimension), Internal (I/O, with errno text).
  static Result<std::unique_ptr<SafetensorsWriter>> Create(
      const std::string& path, const std::vector<TensorDecl>& tensors,
      const std::map<std::string, std::string>& metadata = {});
  ~SafetensorsWriter();  // without Finish: closes and deletes the temp file
  SafetensorsWriter(const SafetensorsWriter&) = delete;
  SafetensorsWriter& operator=(const SafetensorsWriter&) = delete;

  // Appends the next n bytes of the data region. Errors: FailedPrecondition (more bytes than
  // declared, or after Finish), Internal (I/O).
  Status Append(const void* data, size_t n);
  // Which declared tensor the next Append byte belongs to (tensors().size() when complete).
  size_t current_tensor() const;
  const std::vector<TensorDecl>& tensors() const { return tensors_; }
  uint64_t data_bytes() const { return total_; }

  // Checks that all declared bytes were written, flushes, closes and renames into place.
  // Errors: FailedPrecondition (bytes missing, naming the first incomplete tensor), Internal.
  Status Finish();

 private:
  SafetensorsWriter(std::string path, std::vector<TensorDecl> t) : path_(std::move(path)), tensors_(std::move(t)) {}
  std::string path_;
  std::vector<TensorDecl> tensors_;
  std::vector<uint64_t> ends_;  // cumulative end offset of each tensor
  uint64_t total_ = 0, written_ = 0;
  std::FILE* file_ = nullptr;
  std::unique_ptr<char[]> buffer_;
  bool finished_ = false;
};

}  // namespace pdserve::model
