#include "services/router/api_auth.h"

#include <algorithm>

#include "common/mapped_file.h"
#include "services/common/process_util.h"

namespace pdserve::router {

bool ConstantTimeEquals(std::string_view a, std::string_view b) {
  const size_t n = std::max(a.size(), b.size());
  // volatile: the accumulation must not be turned into an early exit.
  volatile unsigned char diff = a.size() != b.size() ? 1 : 0;
  for (size_t i = 0; i < n; ++i) {
    const unsigned char x = i < a.size() ? static_cast<unsigned char>(a[i]) : 0;
    const unsigned char y = i < b.size() ? static_cast<unsigned char>(b[i]) : 0;
    diff = diff | static_cast<unsigned char>(x ^ y);
  }
  return diff == 0;
}

Result<ApiKeyAuth> ApiKeyAuth::FromKeys(std::vector<std::string> keys) {
  if (keys.empty()) return Status::InvalidArgument("no API key given");
  for (const auto& k : keys) {
    if (k.empty()) return Status::InvalidArgument("an API key is empty");
    for (unsigned char c : k)
      if (c <= 0x20 || c == 0x7f) return Status::InvalidArgument("an API key holds whitespace or a control character");
  }
  ApiKeyAuth auth;
  auth.keys_ = std::move(keys);
  return auth;
}

Result<ApiKeyAuth> ApiKeyAuth::LoadFile(const std::string& path) {
  auto contents = ReadFileToString(path);
  if (!contents.ok()) return Status(contents.status().code(), "cannot read the API key file '" + path + "'");
  std::vector<std::string> keys;
  const std::string& s = contents.value();
  int line_number = 0;
  for (size_t pos = 0; pos <= s.size();) {
    size_t end = s.find('\n', pos);
    if (end == std::string::npos) end = s.size();
    std::string line = s.substr(pos, end - pos);
    pos = end + 1;
    ++line_number;
    const size_t b = line.find_first_not_of(" \t\r");
    if (b == std::string::npos || line[b] == '#') continue;
    line = line.substr(b, line.find_last_not_of(" \t\r") - b + 1);
    auto one = FromKeys({line});
    if (!one.ok()) return one.status().WithContext("'" + path + "' line " + std::to_string(line_number));
    keys.push_back(std::move(line));
  }
  if (keys.empty()) return Status::InvalidArgument("no API key in '" + path + "' (one key a line, '#' comments)");
  return FromKeys(std::move(keys));
}

ApiKeyAuth::Verdict ApiKeyAuth::Check(std::string_view authorization) const {
  constexpr std::string_view kBearer = "Bearer ";
  if (authorization.size() <= kBearer.size() || authorization.substr(0, kBearer.size()) != kBearer)
    return Verdict::kMissing;
  std::string_view token = authorization.substr(kBearer.size());
  while (!token.empty() && (token.back() == ' ' || token.back() == '\t')) token.remove_suffix(1);
  return token.empty() ? Verdict::kInvalid : CheckKey(token);
}

ApiKeyAuth::Verdict ApiKeyAuth::CheckKey(std::string_view token) const {
  if (token.empty()) return Verdict::kMissing;
  bool match = false;
  for (const auto& k : keys_) match |= ConstantTimeEquals(token, k);  // every key, no early exit
  return match ? Verdict::kAllowed : Verdict::kInvalid;
}

}  // namespace pdserve::router
