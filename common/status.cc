#include "common/status.h"

#include <cstdio>
#include <cstdlib>

namespace pdserve {

namespace internal {
void CheckFailed(const char* file, int line, const char* cond, std::string_view msg) {
  std::fprintf(stderr, "pdserve: check failed at %s:%d: %s %.*s\n", file, line, cond,
               static_cast<int>(msg.size()), msg.data());
  std::fflush(stderr);
  std::abort();
}
}  // namespace internal

std::string_view StatusCodeName(StatusCode code) {
  switch (code) {
    case StatusCode::kOk: return "OK";
    case StatusCode::kCancelled: return "Cancelled";
    case StatusCode::kUnknown: return "Unknown";
    case StatusCode::kInvalidArgument: return "InvalidArgument";
    case StatusCode::kDeadlineExceeded: return "DeadlineExceeded";
    case StatusCode::kNotFound: return "NotFound";
    case StatusCode::kAlreadyExists: return "AlreadyExists";
    case StatusCode::kPermissionDenied: return "PermissionDenied";
    case StatusCode::kResourceExhausted: return "ResourceExhausted";
    case StatusCode::kFailedPrecondition: return "FailedPrecondition";
    case StatusCode::kAborted: return "Aborted";
    case StatusCode::kOutOfRange: return "OutOfRange";
    case StatusCode::kUnimplemented: return "Unimplemented";
    case StatusCode::kInternal: return "Internal";
    case StatusCode::kUnavailable: return "Unavailable";
    case StatusCode::kDataLoss: return "DataLoss";
  }
  return "Unknown";
}

Status::Status(StatusCode code, std::string_view msg, std::string_view where) {
  if (code == StatusCode::kOk) return;
  std::string text(msg);
  if (!where.empty()) {
    text += " (";
    text += where;
    text += ")";
  }
  rep_ = std::make_shared<const Rep>(Rep{code, std::move(text)});
}

const std::string& Status::message() const {
  static const std::string kEmpty;
  return rep_ ? rep_->message : kEmpty;
}

std::string Status::ToString() const {
  if (ok()) return "OK";
  std::string s(StatusCodeName(rep_->code));
  s += ": ";
  s += rep_->message;
  return s;
}

Status Status::WithContext(std::string_view context) const {
  if (ok()) return *this;
  std::string text(context);
  text += ": ";
  text += rep_->message;
  return Status(rep_->code, text);
}

}  // namespace pdserve
