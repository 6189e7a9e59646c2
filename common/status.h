// Status and Result<T>: the one error type that crosses every pdserve module boundary.
//
// A Status is a code plus a message saying what went wrong and where ("file x.safetensors:
// tensor 'a.b' has dtype BF16, config implies F32"). OK costs nothing (no allocation).
// Codes follow Abseil's meanings; choose them by what the caller should do next:
//   kInvalidArgument  the input is wrong: do not retry (HTTP 400)
//   kNotFound         a named thing does not exist
//   kUnavailable      retry the same call elsewhere / later (peer down, saturated)
//   kAborted          retry the whole request (lease expired, preempted)
//   kDeadlineExceeded a deadline passed; the effect may still have happened
//   kDataLoss         bytes arrived corrupted (digest mismatch, torn file)
//   kResourceExhausted out of blocks / memory / queue space (HTTP 429)
//   kFailedPrecondition the system is not in a state for this call
//   kInternal         a bug or an unexpected library failure
//
// Thread-safety: value types; distinct objects may be used from any thread.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

#include "common/check.h"

namespace pdserve {

enum class StatusCode : int {
  kOk = 0,
  kCancelled = 1,
  kUnknown = 2,
  kInvalidArgument = 3,
  kDeadlineExceeded = 4,
  kNotFound = 5,
  kAlreadyExists = 6,
  kPermissionDenied = 7,
  kResourceExhausted = 8,
  kFailedPrecondition = 9,
  kAborted = 10,
  kOutOfRange = 11,
  kUnimplemented = 12,
  kInternal = 13,
  kUnavailable = 14,
  kDataLoss = 15,
};

std::string_view StatusCodeName(StatusCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;  // OK
  Status(StatusCode code, std::string_view msg, std::string_view where = {});

  static Status Ok() { return Status(); }
  static Status Cancelled(std::string_view m, std::string_view w = {}) { return {StatusCode::kCancelled, m, w}; }
  static Status InvalidArgument(std::string_view m, std::string_view w = {}) { return {StatusCode::kInvalidArgument, m, w}; }
  static Status DeadlineExceeded(std::string_view m, std::string_view w = {}) { return {StatusCode::kDeadlineExceeded, m, w}; }
  static Status NotFound(std::string_view m, std::string_view w = {}) { return {StatusCode::kNotFound, m, w}; }
  static Status AlreadyExists(std::string_view m, std::string_view w = {}) { return {StatusCode::kAlreadyExists, m, w}; }
  static Status PermissionDenied(std::string_view m, std::string_view w = {}) { return {StatusCode::kPermissionDenied, m, w}; }
  static Status ResourceExhausted(std::string_view m, std::string_view w = {}) { return {StatusCode::kResourceExhausted, m, w}; }
  static Status FailedPrecondition(std::string_view m, std::string_view w = {}) { return {StatusCode::kFailedPrecondition, m, w}; }
  static Status Aborted(std::string_view m, std::string_view w = {}) { return {StatusCode::kAborted, m, w}; }
  static Status OutOfRange(std::string_view m, std::string_view w = {}) { return {StatusCode::kOutOfRange, m, w}; }
  static Status Unimplemented(std::string_view m, std::string_view w = {}) { return {StatusCode::kUnimplemented, m, w}; }
  static Status Internal(std::string_view m, std::string_view w = {}) { return {StatusCode::kInternal, m, w}; }
  static Status Unavailable(std::string_view m, std::string_view w = {}) { return {StatusCode::kUnavailable, m, w}; }
  static Status DataLoss(std::string_view m, std::string_view w = {}) { return {StatusCode::kDataLoss, m, w}; }

  bool ok() const { return rep_ == nullptr; }
  StatusCode code() const { return rep_ ? rep_->code : StatusCode::kOk; }
  // The message without the code prefix ("" when OK).
  const std::string& message() const;
  // "InvalidArgument: <message>" or "OK".
  std::string ToString() const;

  // Returns a copy whose message is "<context>: <message>" (OK stays OK).
  Status WithContext(std::string_view context) const;

 private:
  struct Rep {
    StatusCode code;
    std::string message;
  };
  std::shared_ptr<const Rep> rep_;  // null == OK; shared so copies are cheap
};

// A value or a non-OK Status. Holding an OK status without a value is a bug (checked).
template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : value_(std::move(value)) {}  // NOLINT: implicit by design
  Result(Status status) : status_(std::move(status)) {  // NOLINT
    PDSERVE_CHECK(!status_.ok(), "Result constructed from an OK Status without a value");
  }

  bool ok() const { return status_.ok(); }
  const Status& status() const { return status_; }

  T& value() & { PDSERVE_CHECK(ok(), status_.ToString()); return *value_; }
  const T& value() const& { PDSERVE_CHECK(ok(), status_.ToString()); return *value_; }
  T&& value() && { PDSERVE_CHECK(ok(), status_.ToString()); return std::move(*value_); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }

 private:
  Status status_;
  std::optional<T> value_;
};

}  // namespace pdserve

#define PDSERVE_CONCAT_INNER_(a, b) a##b
#define PDSERVE_CONCAT_(a, b) PDSERVE_CONCAT_INNER_(a, b)

#define PDSERVE_RETURN_IF_ERROR(expr)                \
  do {                                               \
    ::pdserve::Status pdserve_status_ = (expr);      \
    if (!pdserve_status_.ok()) return pdserve_status_; \
  } while (0)

#define PDSERVE_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                                  \
  if (!tmp.ok()) return tmp.status();                 \
  lhs = std::move(tmp).value()

#define PDSERVE_ASSIGN_OR_RETURN(lhs, expr) \
  PDSERVE_ASSIGN_OR_RETURN_IMPL_(PDSERVE_CONCAT_(pdserve_result_, __LINE__), lhs, expr)
