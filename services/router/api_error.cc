#include "services/router/api_error.h"

namespace pdserve::router {

ApiError ApiError::BadRequest(std::string message, std::string param, std::string code) {
  return {400, "invalid_request_error", std::move(message), std::move(param), std::move(code)};
}
ApiError ApiError::NotFound(std::string message, std::string code) {
  return {404, "invalid_request_error", std::move(message), {}, std::move(code)};
}
ApiError ApiError::Unauthorized(std::string message) {
  return {401, "invalid_request_error", std::move(message), {}, "invalid_api_key"};
}
ApiError ApiError::TooLarge(std::string message) {
  return {413, "invalid_request_error", std::move(message), {}, "request_too_large"};
}
ApiError ApiError::Saturated(std::string message) {
  return {429, "rate_limit_error", std::move(message), {}, "server_saturated"};
}
ApiError ApiError::Unavailable(std::string message, std::string code) {
  return {503, "service_unavailable", std::move(message), {}, std::move(code)};
}
ApiError ApiError::Timeout(std::string message) { return {504, "timeout_error", std::move(message), {}, "timeout"}; }
ApiError ApiError::Internal(std::string message, const std::string& request_id) {
  return {500, "internal_error", std::move(message) + " (request id " + request_id + ")", {}, {}};
}

ApiError ApiError::FromStatus(const Status& s, const std::string& request_id) {
  switch (s.code()) {
    case StatusCode::kInvalidArgument:
    case StatusCode::kOutOfRange: return BadRequest(s.message());
    case StatusCode::kNotFound: return NotFound(s.message());
    case StatusCode::kResourceExhausted: return Saturated(s.message());
    case StatusCode::kUnavailable:
    case StatusCode::kAborted: return Unavailable(s.message() + " (request id " + request_id + ")");
    case StatusCode::kDeadlineExceeded: return Timeout(s.message() + " (request id " + request_id + ")");
    default: return Internal(s.ToString(), request_id);
  }
}

nlohmann::json ApiError::ToJson() const {
  nlohmann::json e = {{"message", message}, {"type", type}, {"param", nullptr}, {"code", nullptr}};
  if (!param.empty()) e["param"] = param;
  if (!code.empty()) e["code"] = code;
  return {{"error", e}};
}

std::string ApiError::Body() const { return DumpJson(ToJson()); }

std::string DumpJson(const nlohmann::json& j) {
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace pdserve::router
