// ApiError: an OpenAI-shaped error reply,
//   {"error": {"message": ..., "type": ..., "param": ... | null, "code": ... | null}}
// with its HTTP status. Every error the router returns (parsing, routing, worker failures,
// unknown paths, oversized bodies) goes through here so clients see one shape; the request id
// is in the X-Request-Id header and, for 5xx, in the message too.
//
//   400 invalid_request_error   malformed JSON, wrong types, bad values, context too long
//   401 invalid_request_error   missing or wrong API key (code invalid_api_key; api_keys_file)
//   404 invalid_request_error   unknown model (code model_not_found) or path
//   413 invalid_request_error   body over router.max_body_bytes (code request_too_large)
//   429 rate_limit_error        saturated: outstanding cap, no KV capacity, worker full
//   503 service_unavailable     no ready worker for the request (code no_workers), shutting down
//   504 timeout_error           router-side request / first-token deadline
//   500 internal_error          anything else (a bug or a worker failure)
//
// Thread-safety: value types and pure functions.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "common/status.h"

namespace pdserve::router {

struct ApiError {
  int http_status = 500;
  std::string type = "internal_error";
  std::string message;
  std::string param;  // empty: null
  std::string code;   // empty: null

  static ApiError BadRequest(std::string message, std::string param = {}, std::string code = {});
  static ApiError NotFound(std::string message, std::string code = {});
  static ApiError Unauthorized(std::string message);
  static ApiError TooLarge(std::string message);
  static ApiError Saturated(std::string message);
  static ApiError Unavailable(std::string message, std::string code = {});
  static ApiError Timeout(std::string message);
  static ApiError Internal(std::string message, const std::string& request_id);

  // Maps a Status from routing or a worker: InvalidArgument 400, NotFound 404,
  // ResourceExhausted 429, Unavailable / Aborted 503, DeadlineExceeded 504, else 500.
  static ApiError FromStatus(const Status& status, const std::string& request_id);

  nlohmann::json ToJson() const;
  std::string Body() const;  // ToJson().dump()
};

// nlohmann dump that never throws on invalid UTF-8 (token pieces may hold partial characters).
std::string DumpJson(const nlohmann::json& j);

}  // namespace pdserve::router
