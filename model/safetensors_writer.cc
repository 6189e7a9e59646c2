#include "model/safetensors_writer.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <set>

#include <nlohmann/json.hpp>

namespace pdserve::model {

namespace {
// stdio buffer: large sequential writes without a syscall per row block.
constexpr size_t kBufferBytes = 8 << 20;

Status IoError(const std::string& what, const std::string& path) {
  return Status::Internal(what + ": " + std::strerror(errno), path);
}
}  // namespace

uint64_t TensorDecl::n_bytes() const {
  uint64_t n = DTypeSize(dtype);
  for (int64_t d : shape) n *= static_cast<uint64_t>(d);
  return n;
}

Result<std::unique_ptr<SafetensorsWriter>> SafetensorsWriter::Create(
    const std::string& path, const std::vector<TensorDecl>& tensors,
    const std::map<std::string, std::string>& metadata) {
  std::unique_ptr<SafetensorsWriter> w(new SafetensorsWriter(path, tensors));
  nlohmann::json header = nlohmann::json::object();
  nlohmann::json meta = {{"format", "pt"}};
  for (const auto& [k, v] : metadata) meta[k] = v;
  header["__metadata__"] = meta;
  std::set<std::string> seen;
  for (const auto& t : tensors) {
    if (t.name.empty() || t.name == "__metadata__" || !seen.insert(t.name).second)
      return Status::InvalidArgument("bad or duplicate tensor name '" + t.name + "'", path);
    for (int64_t d : t.shape)
      if (d < 0) return Status::InvalidArgument("tensor '" + t.name + "' has a negative dimension", path);
    const uint64_t begin = w->total_;
    w->total_ += t.n_bytes();
    w->ends_.push_back(w->total_);
    header[t.name] = {{"dtype", std::string(DTypeName(t.dtype))}, {"shape", t.shape}, {"data_offsets", {begin, w->total_}}};
  }
  std::string h = header.dump();
  h.append((8 - h.size() % 8) % 8, ' ');
  w->file_ = std::fopen((path + ".tmp").c_str(), "wb");
  if (!w->file_) return IoError("cannot create file", path + ".tmp");
  w->buffer_.reset(new char[kBufferBytes]);
  std::setvbuf(w->file_, w->buffer_.get(), _IOFBF, kBufferBytes);
  const uint64_t n = h.size();
  if (std::fwrite(&n, 8, 1, w->file_) != 1 || std::fwrite(h.data(), 1, h.size(), w->file_) != h.size())
    return IoError("write failed", path + ".tmp");
  return w;
}

SafetensorsWriter::~SafetensorsWriter() {
  if (file_) std::fclose(file_);
  if (!finished_) std::remove((path_ + ".tmp").c_str());
}

size_t SafetensorsWriter::current_tensor() const {
  return static_cast<size_t>(std::upper_bound(ends_.begin(), ends_.end(), written_) - ends_.begin());
}

Status SafetensorsWriter::Append(const void* data, size_t n) {
  if (finished_ || !file_) return Status::FailedPrecondition("append after Finish", path_);
  if (written_ + n > total_)
    return Status::FailedPrecondition("append of " + std::to_string(n) + " bytes overruns the declared " +
                                          std::to_string(total_) + " (" + std::to_string(written_) + " written)",
                                      path_);
  if (n > 0 && std::fwrite(data, 1, n, file_) != n) return IoError("write failed", path_ + ".tmp");
  written_ += n;
  return Status::Ok();
}

Status SafetensorsWriter::Finish() {
  if (finished_) return Status::FailedPrecondition("Finish called twice", path_);
  if (written_ != total_) {
    const size_t t = current_tensor();
    return Status::FailedPrecondition("only " + std::to_string(written_) + " of " + std::to_string(total_) +
                                          " data bytes written; tensor '" + tensors_[t].name + "' is incomplete",
                                      path_);
  }
  const bool ok = std::fflush(file_) == 0;
  const bool closed = std::fclose(file_) == 0;
  file_ = nullptr;
  if (!ok || !closed) return IoError("flush/close failed", path_ + ".tmp");
  if (std::rename((path_ + ".tmp").c_str(), path_.c_str()) != 0) return IoError("rename failed", path_);
  finished_ = true;
  return Status::Ok();
}

}  // namespace pdserve::model
