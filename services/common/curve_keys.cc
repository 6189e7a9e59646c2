#include "services/common/curve_keys.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <zmq.h>

#include "common/mapped_file.h"
#include "services/common/process_util.h"

namespace pdserve::services {

namespace {

constexpr size_t kZ85KeyChars = 40;

// The non-comment lines of a key file, trimmed, with their 1-based line numbers. A '#' line is
// never a key: the first Z85 digit of a 32-bit group is at most 82 ('%'), and '#' is digit 84.
struct KeyLine {
  std::string text;
  int line;
};

Result<std::vector<KeyLine>> ReadKeyLines(const std::string& path) {
  auto contents = ReadFileToString(path);
  if (!contents.ok()) return Status(contents.status().code(), "cannot read the CURVE key file '" + path + "'");
  std::vector<KeyLine> lines;
  int number = 0;
  size_t pos = 0;
  const std::string& s = contents.value();
  while (pos <= s.size()) {
    size_t end = s.find('\n', pos);
    if (end == std::string::npos) end = s.size();
    std::string line = s.substr(pos, end - pos);
    ++number;
    const size_t b = line.find_first_not_of(" \t\r");
    const size_t e = line.find_last_not_of(" \t\r");
    line = b == std::string::npos ? std::string() : line.substr(b, e - b + 1);
    if (!line.empty() && line[0] != '#') lines.push_back({line, number});
    pos = end + 1;
  }
  return lines;
}

Status WriteKeyFile(const std::string& path, const std::string& text, mode_t mode) {
  const int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, mode);
  if (fd < 0) {
    if (errno == EEXIST) return Status::AlreadyExists("refusing to overwrite the existing key file '" + path + "'");
    return Status::Internal("cannot create '" + path + "': " + std::strerror(errno));
  }
  const ssize_t n = write(fd, text.data(), text.size());
  const bool ok = n == static_cast<ssize_t>(text.size());
  const int err = errno;
  close(fd);
  if (!ok) return Status::Internal("cannot write '" + path + "': " + std::strerror(err));
  return Status::Ok();
}

}  // namespace

bool CurveAvailable() { return zmq_has("curve") == 1; }

Result<CurveKeyPair> GenerateCurveKeyPair() {
  if (!CurveAvailable()) return Status::Unimplemented("this libzmq was built without CURVE");
  char pub[kZ85KeyChars + 1], sec[kZ85KeyChars + 1];
  if (zmq_curve_keypair(pub, sec) != 0) return Status::Internal(std::string("zmq_curve_keypair: ") + zmq_strerror(zmq_errno()));
  return CurveKeyPair{pub, sec};
}

Status CheckCurveKey(const std::string& key, const std::string& where) {
  if (key.size() != kZ85KeyChars)
    return Status::InvalidArgument("a CURVE key is 40 Z85 characters, got " + std::to_string(key.size()), where);
  uint8_t raw[32];
  if (zmq_z85_decode(raw, key.c_str()) == nullptr)
    return Status::InvalidArgument("not a Z85-encoded CURVE key", where);
  return Status::Ok();
}

Result<std::vector<std::string>> ReadCurveKeyListFile(const std::string& path) {
  PDSERVE_ASSIGN_OR_RETURN(std::vector<KeyLine> lines, ReadKeyLines(path));
  if (lines.empty()) return Status::InvalidArgument("no CURVE key in '" + path + "'");
  std::vector<std::string> keys;
  for (const KeyLine& l : lines) {
    PDSERVE_RETURN_IF_ERROR(CheckCurveKey(l.text, "'" + path + "' line " + std::to_string(l.line)));
    keys.push_back(l.text);
  }
  return keys;
}

Result<std::string> ReadCurveKeyFile(const std::string& path) {
  PDSERVE_ASSIGN_OR_RETURN(std::vector<std::string> keys, ReadCurveKeyListFile(path));
  if (keys.size() != 1)
    return Status::InvalidArgument("'" + path + "' holds " + std::to_string(keys.size()) + " keys, expected one");
  return keys[0];
}

Result<CurveKeyPair> ReadCurveSecretKeyFile(const std::string& path) {
  PDSERVE_ASSIGN_OR_RETURN(std::string secret, ReadCurveKeyFile(path));
  char pub[kZ85KeyChars + 1];
  if (zmq_curve_public(pub, secret.c_str()) != 0)
    return Status::InvalidArgument(std::string("cannot derive the public key: ") + zmq_strerror(zmq_errno()),
                                   "'" + path + "'");
  return CurveKeyPair{pub, secret};
}

Result<CurveOptions> LoadServerCurveOptions(const std::string& secret_key_file, const std::string& allowed_clients_file) {
  if (!CurveAvailable()) return Status::InvalidArgument("CURVE is configured but this libzmq was built without it");
  CurveOptions o;
  o.enabled = true;
  PDSERVE_ASSIGN_OR_RETURN(o.own, ReadCurveSecretKeyFile(secret_key_file));
  if (!allowed_clients_file.empty()) {
    PDSERVE_ASSIGN_OR_RETURN(o.allowed_client_keys, ReadCurveKeyListFile(allowed_clients_file));
  }
  return o;
}

Result<CurveOptions> LoadClientCurveOptions(const std::string& secret_key_file,
                                            const std::string& server_public_key_file) {
  if (!CurveAvailable()) return Status::InvalidArgument("CURVE is configured but this libzmq was built without it");
  if (secret_key_file.empty() || server_public_key_file.empty())
    return Status::InvalidArgument("CURVE needs both the worker's secret key file and the router's public key file");
  CurveOptions o;
  o.enabled = true;
  PDSERVE_ASSIGN_OR_RETURN(o.own, ReadCurveSecretKeyFile(secret_key_file));
  PDSERVE_ASSIGN_OR_RETURN(o.server_public_key, ReadCurveKeyFile(server_public_key_file));
  return o;
}

Result<CurveKeyPair> WriteCurveKeyPairFiles(const std::string& dir, const std::string& name) {
  PDSERVE_ASSIGN_OR_RETURN(CurveKeyPair keys, GenerateCurveKeyPair());
  const std::string base = dir + "/" + name;
  PDSERVE_RETURN_IF_ERROR(WriteKeyFile(base + ".secret",
                                       "# pdserve CURVE secret key '" + name + "': keep private (mode 0600)\n" +
                                           keys.secret_key + "\n",
                                       0600));
  PDSERVE_RETURN_IF_ERROR(WriteKeyFile(base + ".public",
                                       "# pdserve CURVE public key '" + name + "'\n" + keys.public_key + "\n", 0644));
  return keys;
}

}  // namespace pdserve::services
