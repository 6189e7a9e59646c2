// MappedFile: a read-only mmap of a whole file, unmapped in the destructor (RAII, move-only).
// Checkpoint tensors point straight into these mappings, so weights are never copied unless a
// conversion (FP8 -> BF16 dequantization, transposition) needs new storage.
// Thread-safety: immutable after Open(); data() may be read from any thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "common/status.h"

namespace pdserve {

class MappedFile {
 public:
  // Errors: NotFound if the file is missing, Internal on mmap failure.
  static Result<std::unique_ptr<MappedFile>> Open(const std::string& path);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& path() const { return path_; }

 private:
  MappedFile(std::string path, const uint8_t* data, size_t size)
      : path_(std::move(path)), data_(data), size_(size) {}
  std::string path_;
  const uint8_t* data_;
  size_t size_;
};

// Reads a whole (small) file into a string. Errors: NotFound, Internal.
Result<std::string> ReadFileToString(const std::string& path);
// Writes a file atomically (temp file + rename). Errors: Internal with errno text.
Status WriteStringToFile(const std::string& path, const std::string& contents);

}  // namespace pdserve
