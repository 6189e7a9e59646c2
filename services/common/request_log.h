// RequestLog: a logger bound to one request's client-visible id, so that every line about a
// request carries it ("[chatcmpl-5f3a...] prefill worker p0 lost"): grep the id to follow a
// request through the router and every worker it touched.
//
// Thread-safety: as spdlog loggers (thread-safe); the object itself is immutable.
#pragma once

#include <memory>
#include <string>
#include <utility>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "common/logging.h"

namespace pdserve::services {

class RequestLog {
 public:
  RequestLog(std::shared_ptr<spdlog::logger> logger, std::string request_tag)
      : logger_(std::move(logger)), tag_(std::move(request_tag)) {}
  RequestLog(const std::string& module, std::string request_tag)
      : RequestLog(GetLogger(module), std::move(request_tag)) {}

  template <typename... A>
  void Debug(fmt::format_string<A...> f, A&&... a) const { Log(spdlog::level::debug, f, std::forward<A>(a)...); }
  template <typename... A>
  void Info(fmt::format_string<A...> f, A&&... a) const { Log(spdlog::level::info, f, std::forward<A>(a)...); }
  template <typename... A>
  void Warn(fmt::format_string<A...> f, A&&... a) const { Log(spdlog::level::warn, f, std::forward<A>(a)...); }
  template <typename... A>
  void Error(fmt::format_string<A...> f, A&&... a) const { Log(spdlog::level::err, f, std::forward<A>(a)...); }

  const std::string& tag() const { return tag_; }

 private:
  template <typename... A>
  void Log(spdlog::level::level_enum level, fmt::format_string<A...> f, A&&... a) const {
    if (!logger_->should_log(level)) return;  // no formatting cost when filtered out
    logger_->log(level, "[{}] {}", tag_, fmt::format(f, std::forward<A>(a)...));
  }

  std::shared_ptr<spdlog::logger> logger_;
  std::string tag_;
};

}  // namespace pdserve::services
