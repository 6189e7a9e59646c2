#include "model/safetensors.h"

#include <cstring>
#include <fstream>
#include <limits>

#include <nlohmann/json.hpp>

#include "common/json_excerpt.h"

namespace pdserve::model {

std::string TensorInfo::ShapeString() const {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

namespace {
// A header larger than this is certainly corrupt (the real V3.2 index headers are < 1 MB).
constexpr uint64_t kMaxHeaderBytes = 100ull << 20;
}  // namespace

Result<std::unique_ptr<SafetensorsFile>> SafetensorsFile::Open(const std::string& path) {
  PDSERVE_ASSIGN_OR_RETURN(auto mapped, MappedFile::Open(path));
  PDSERVE_ASSIGN_OR_RETURN(auto tensors, ParseHeader(mapped->data(), mapped->size(), path));
  std::unique_ptr<SafetensorsFile> file(new SafetensorsFile(std::move(mapped)));
  file->tensors_ = std::move(tensors);
  return file;
}

Result<std::map<std::string, TensorInfo>> SafetensorsFile::ParseHeader(const uint8_t* bytes, size_t file_size,
                                                                       const std::string& path) {
  if (file_size < 8) return Status::InvalidArgument("file shorter than the 8-byte header length", path);
  uint64_t header_len;
  std::memcpy(&header_len, bytes, 8);
  if (header_len > kMaxHeaderBytes || header_len > file_size - 8)
    return Status::InvalidArgument("header length " + std::to_string(header_len) +
                                       " exceeds the file size " + std::to_string(file_size),
                                   path);
  const char* hdr = reinterpret_cast<const char*>(bytes + 8);
  nlohmann::json j = nlohmann::json::parse(hdr, hdr + header_len, nullptr, false);
  if (j.is_discarded() || !j.is_object())
    return Status::InvalidArgument("header is not a valid JSON object", path);
  const uint8_t* data_start = bytes + 8 + header_len;
  const uint64_t data_size = file_size - 8 - header_len;

  std::map<std::string, TensorInfo> tensors;
  for (auto it = j.begin(); it != j.end(); ++it) {
    if (it.key() == "__metadata__") continue;
    const std::string where = path + ": tensor '" + it.key() + "'";
    const auto& e = it.value();
    if (!e.is_object() || !e.contains("dtype") || !e.contains("shape") || !e.contains("data_offsets"))
      return Status::InvalidArgument("entry needs dtype, shape and data_offsets", where);
    TensorInfo info;
    info.name = it.key();
    info.file = path;
    if (!e["dtype"].is_string() || !ParseDType(e["dtype"].get<std::string>(), &info.dtype))
      return Status::InvalidArgument("unsupported dtype " + JsonExcerpt(e["dtype"]), where);
    if (!e["shape"].is_array()) return Status::InvalidArgument("shape is not an array", where);
    uint64_t numel = 1;
    for (const auto& d : e["shape"]) {
      if (!d.is_number_unsigned()) return Status::InvalidArgument("bad shape " + JsonExcerpt(e["shape"]), where);
      const uint64_t dim = d.get<uint64_t>();
      if (dim > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
        return Status::InvalidArgument("shape dimension " + std::to_string(dim) + " is out of range", where);
      if (dim != 0 && numel > std::numeric_limits<uint64_t>::max() / 16 / dim)
        return Status::InvalidArgument("shape overflows " + JsonExcerpt(e["shape"]), where);
      numel *= dim;
      info.shape.push_back(static_cast<int64_t>(dim));
    }
    const auto& off = e["data_offsets"];
    if (!off.is_array() || off.size() != 2 || !off[0].is_number_unsigned() || !off[1].is_number_unsigned())
      return Status::InvalidArgument("bad data_offsets " + JsonExcerpt(off), where);
    const uint64_t begin = off[0].get<uint64_t>(), end = off[1].get<uint64_t>();
    if (begin > end || end > data_size)
      return Status::InvalidArgument("data_offsets " + JsonExcerpt(off) + " outside the data region of " +
                                         std::to_string(data_size) + " bytes",
                                     where);
    if (end - begin != numel * DTypeSize(info.dtype))
      return Status::InvalidArgument("data_offsets span " + std::to_string(end - begin) +
                                         " bytes but shape x dtype needs " +
                                         std::to_string(numel * DTypeSize(info.dtype)),
                                     where);
    info.data = data_start + begin;
    info.n_bytes = end - begin;
    tensors.emplace(info.name, std::move(info));
  }
  return tensors;
}

Status WriteSafetensors(const std::string& path, const std::vector<TensorToWrite>& tensors) {
  nlohmann::json header = nlohmann::json::object();
  header["__metadata__"] = {{"format", "pt"}};
  uint64_t offset = 0;
  for (const auto& t : tensors) {
    header[t.name] = {{"dtype", std::string(DTypeName(t.dtype))},
                      {"shape", t.shape},
                      {"data_offsets", {offset, offset + t.bytes.size()}}};
    offset += t.bytes.size();
  }
  std::string h = header.dump();
  h.append((8 - h.size() % 8) % 8, ' ');  // keep the data 8-byte aligned
  std::ofstream out(path + ".tmp", std::ios::binary | std::ios::trunc);
  if (!out) return Status::Internal("cannot create file", path);
  const uint64_t n = h.size();
  out.write(reinterpret_cast<const char*>(&n), 8);
  out.write(h.data(), static_cast<std::streamsize>(h.size()));
  for (const auto& t : tensors)
    out.write(reinterpret_cast<const char*>(t.bytes.data()), static_cast<std::streamsize>(t.bytes.size()));
  out.close();
  if (!out) return Status::Internal("write failed", path);
  if (std::rename((path + ".tmp").c_str(), path.c_str()) != 0) return Status::Internal("rename failed", path);
  return Status::Ok();
}

}  // namespace pdserve::model
