#include "model/fingerprint.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <string_view>
#include <vector>

namespace pdserve::model {

namespace {

// FNV-1a 64: stable across processes, builds and machines (it travels in Register messages).
struct Fnv64 {
  uint64_t h = 1469598103934665603ull;
  void Mix(const void* data, size_t n) {
    const auto* p = static_cast<const unsigned char*>(data);
    for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 1099511628211ull;
  }
  void Mix(std::string_view s) {
    Mix(s.data(), s.size());
    const unsigned char sep = 0xff;
    Mix(&sep, 1);
  }
  void Mix(uint64_t v) { Mix(&v, sizeof(v)); }
};

class Fd {
 public:
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() {
    if (fd_ >= 0) close(fd_);
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int get() const { return fd_; }

 private:
  int fd_;
};

bool ReadFully(int fd, void* out, size_t n, uint64_t offset) {
  auto* p = static_cast<char*>(out);
  while (n > 0) {
    const ssize_t r = pread(fd, p, n, static_cast<off_t>(offset));
    if (r <= 0) return false;
    p += r;
    n -= static_cast<size_t>(r);
    offset += static_cast<uint64_t>(r);
  }
  return true;
}

}  // namespace

Result<uint64_t> WeightsFingerprint(const std::string& checkpoint_dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::is_directory(checkpoint_dir, ec)) return Status::NotFound("no checkpoint directory '" + checkpoint_dir + "'");
  std::vector<fs::path> files;
  for (const auto& e : fs::directory_iterator(checkpoint_dir, ec))
    if (e.path().extension() == ".safetensors") files.push_back(e.path());
  if (files.empty()) return Status::NotFound("no .safetensors file in '" + checkpoint_dir + "'");
  std::sort(files.begin(), files.end());
  Fnv64 h;
  for (const fs::path& path : files) {
    Fd fd(open(path.c_str(), O_RDONLY | O_CLOEXEC));
    if (fd.get() < 0) return Status::NotFound("cannot open '" + path.string() + "'");
    const off_t size = lseek(fd.get(), 0, SEEK_END);
    uint64_t header_len = 0;
    if (size < 8 || !ReadFully(fd.get(), &header_len, 8, 0))
      return Status::DataLoss("'" + path.string() + "' is shorter than a safetensors header");
    if (header_len > static_cast<uint64_t>(size) - 8)
      return Status::InvalidArgument("'" + path.string() + "': header length " + std::to_string(header_len) +
                                     " is past the end of the file");
    std::string header(header_len, '\0');
    if (!ReadFully(fd.get(), header.data(), header.size(), 8))
      return Status::DataLoss("cannot read the header of '" + path.string() + "'");
    h.Mix(path.filename().string());
    h.Mix(static_cast<uint64_t>(size));
    h.Mix(header);
    const uint64_t data_begin = 8 + header_len;
    const uint64_t data_bytes = static_cast<uint64_t>(size) - data_begin;
    if (data_bytes == 0) continue;
    char window[kFingerprintWindowBytes];
    for (int i = 0; i < kFingerprintSamples; ++i) {
      const uint64_t n = std::min<uint64_t>(kFingerprintWindowBytes, data_bytes);
      const uint64_t at = data_begin + (data_bytes - n) * static_cast<uint64_t>(i) / (kFingerprintSamples - 1);
      if (!ReadFully(fd.get(), window, n, at)) return Status::DataLoss("cannot read '" + path.string() + "'");
      h.Mix(window, n);
    }
  }
  return h.h == 0 ? 1 : h.h;
}

}  // namespace pdserve::model
