// ApiKeyAuth: optional API-key authentication of the router's fronts (router.api_keys_file,
// docs/configuration.md): the HTTP front's `Authorization: Bearer KEY` header and the ZeroMQ
// request API's submit.apiKey field (request_api_server.h) check against the same keys.
//
// The key file holds one key a line; empty lines and lines starting with '#' are comments;
// surrounding whitespace is trimmed. A request is let in when its `Authorization` header is
// `Bearer KEY` for one of the keys. Every configured key is compared, each in time that depends
// only on the lengths (never on where the first differing byte is), so response timing does
// not reveal a key prefix.
//
// Thread-safety: immutable after Load; Check from any thread.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace pdserve::router {

class ApiKeyAuth {
 public:
  // Errors: NotFound (no such file), InvalidArgument (no key in the file, or a key with
  // whitespace or control characters inside; naming the file and line).
  static Result<ApiKeyAuth> LoadFile(const std::string& path);
  static Result<ApiKeyAuth> FromKeys(std::vector<std::string> keys);

  enum class Verdict { kAllowed, kMissing, kInvalid };
  // `authorization` is the header's value ("" when absent).
  Verdict Check(std::string_view authorization) const;
  // `key` is the bare key ("" when absent: kMissing).
  Verdict CheckKey(std::string_view key) const;
  size_t key_count() const { return keys_.size(); }

 private:
  std::vector<std::string> keys_;
};

// Equality in time that depends only on the two lengths.
bool ConstantTimeEquals(std::string_view a, std::string_view b);

}  // namespace pdserve::router
