#include "common/mapped_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

namespace pdserve {

Result<std::unique_ptr<MappedFile>> MappedFile::Open(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) return Status::NotFound("no such file", path);
    return Status::Internal(std::string("cannot open: ") + std::strerror(errno), path);
  }
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    int err = errno;
    ::close(fd);
    return Status::Internal(std::string("fstat failed: ") + std::strerror(err), path);
  }
  const size_t size = static_cast<size_t>(st.st_size);
  const uint8_t* data = nullptr;
  if (size > 0) {
    void* p = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      int err = errno;
      ::close(fd);
      return Status::Internal(std::string("mmap failed: ") + std::strerror(err), path);
    }
    data = static_cast<const uint8_t*>(p);
  }
  ::close(fd);  // the mapping keeps the file alive
  return std::unique_ptr<MappedFile>(new MappedFile(path, data, size));
}

MappedFile::~MappedFile() {
  if (data_ != nullptr) ::munmap(const_cast<uint8_t*>(data_), size_);
}

Result<std::string> ReadFileToString(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    if (errno == ENOENT) return Status::NotFound("no such file", path);
    return Status::Internal(std::string("cannot open: ") + std::strerror(errno), path);
  }
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

Status WriteStringToFile(const std::string& path, const std::string& contents) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) return Status::Internal(std::string("cannot create: ") + std::strerror(errno), tmp);
    out.write(contents.data(), static_cast<std::streamsize>(contents.size()));
    if (!out) return Status::Internal(std::string("write failed: ") + std::strerror(errno), tmp);
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0)
    return Status::Internal(std::string("rename failed: ") + std::strerror(errno), path);
  return Status::Ok();
}

}  // namespace pdserve
