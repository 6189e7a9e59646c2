#include "common/npy.h"

#include <cstring>
#include <fstream>
#include <regex>

#include "common/mapped_file.h"

namespace pdserve {

int64_t NpyArray::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

namespace {
Status WriteNpy(const std::string& path, const char* descr, const void* data, size_t itemsize,
                const std::vector<int64_t>& shape) {
  std::string shape_str = "(";
  size_t n = 1;
  for (size_t i = 0; i < shape.size(); ++i) {
    shape_str += std::to_string(shape[i]);
    shape_str += (shape.size() == 1) ? "," : (i + 1 < shape.size() ? ", " : "");
    n *= static_cast<size_t>(shape[i]);
  }
  shape_str += ")";
  std::string header = std::string("{'descr': '") + descr +
                       "', 'fortran_order': False, 'shape': " + shape_str + ", }";
  // Pad so that magic(6) + version(2) + len(2) + header is a multiple of 64, ending in '\n'.
  const size_t total = 10 + header.size() + 1;
  header.append((64 - total % 64) % 64, ' ');
  header.push_back('\n');
  std::string out("\x93NUMPY\x01\x00", 8);
  const uint16_t hlen = static_cast<uint16_t>(header.size());
  out.push_back(static_cast<char>(hlen & 0xff));
  out.push_back(static_cast<char>(hlen >> 8));
  out += header;
  out.append(static_cast<const char*>(data), n * itemsize);
  return WriteStringToFile(path, out);
}
}  // namespace

Status WriteNpyF32(const std::string& path, const float* data, const std::vector<int64_t>& shape) {
  return WriteNpy(path, "<f4", data, 4, shape);
}
Status WriteNpyI32(const std::string& path, const int32_t* data, const std::vector<int64_t>& shape) {
  return WriteNpy(path, "<i4", data, 4, shape);
}

Result<NpyArray> ReadNpy(const std::string& path) {
  PDSERVE_ASSIGN_OR_RETURN(std::string raw, ReadFileToString(path));
  if (raw.size() < 10 || std::memcmp(raw.data(), "\x93NUMPY", 6) != 0)
    return Status::InvalidArgument("not an .npy file (bad magic)", path);
  const int major = static_cast<uint8_t>(raw[6]);
  size_t hlen, hstart;
  if (major == 1) {
    hlen = static_cast<uint8_t>(raw[8]) | (static_cast<size_t>(static_cast<uint8_t>(raw[9])) << 8);
    hstart = 10;
  } else if (major == 2 || major == 3) {
    if (raw.size() < 12) return Status::InvalidArgument("truncated .npy header", path);
    uint32_t l;
    std::memcpy(&l, raw.data() + 8, 4);
    hlen = l;
    hstart = 12;
  } else {
    return Status::InvalidArgument("unsupported .npy version " + std::to_string(major), path);
  }
  if (hstart + hlen > raw.size()) return Status::InvalidArgument("truncated .npy header", path);
  const std::string header = raw.substr(hstart, hlen);
  NpyArray arr;
  std::smatch m;
  if (!std::regex_search(header, m, std::regex("'descr':\\s*'([^']+)'")))
    return Status::InvalidArgument("npy header has no descr", path);
  arr.descr = m[1];
  if (arr.descr != "<f4" && arr.descr != "<i4")
    return Status::InvalidArgument("npy dtype " + arr.descr + " unsupported (want <f4 or <i4)", path);
  if (header.find("'fortran_order': True") != std::string::npos)
    return Status::InvalidArgument("Fortran-order .npy unsupported", path);
  if (!std::regex_search(header, m, std::regex("'shape':\\s*\\(([^)]*)\\)")))
    return Status::InvalidArgument("npy header has no shape", path);
  const std::string dims = m[1];
  std::regex num("\\d+");
  for (auto it = std::sregex_iterator(dims.begin(), dims.end(), num); it != std::sregex_iterator(); ++it)
    arr.shape.push_back(std::stoll(it->str()));
  const size_t nbytes = static_cast<size_t>(arr.numel()) * 4;
  if (hstart + hlen + nbytes != raw.size())
    return Status::InvalidArgument("npy data size does not match its shape", path);
  arr.bytes.assign(raw.begin() + static_cast<std::ptrdiff_t>(hstart + hlen), raw.end());
  return arr;
}

}  // namespace pdserve
