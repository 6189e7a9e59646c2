#include "common/logging.h"

#include <cstdlib>
#include <mutex>

#include <spdlog/sinks/stdout_color_sinks.h>

namespace pdserve {

namespace {
std::mutex g_mu;
// An invalid PDSERVE_LOG_LEVEL leaves the default here; InitLogLevelFromEnv reports it.
spdlog::level::level_enum g_level = [] {
  const char* env = std::getenv("PDSERVE_LOG_LEVEL");
  if (env == nullptr || *env == '\0') return spdlog::level::info;
  auto parsed = ParseLogLevel(env);
  return parsed.ok() ? parsed.value() : spdlog::level::info;
}();
}  // namespace

Result<spdlog::level::level_enum> ParseLogLevel(std::string_view level) {
  static const std::pair<std::string_view, spdlog::level::level_enum> kNames[] = {
      {"trace", spdlog::level::trace}, {"debug", spdlog::level::debug},  {"info", spdlog::level::info},
      {"warn", spdlog::level::warn},   {"warning", spdlog::level::warn}, {"error", spdlog::level::err},
      {"err", spdlog::level::err},     {"critical", spdlog::level::critical}, {"off", spdlog::level::off}};
  for (const auto& [name, value] : kNames)
    if (name == level) return value;
  return Status::InvalidArgument("unknown log level '" + std::string(level) +
                                 "' (trace, debug, info, warn, error, critical or off)");
}

std::shared_ptr<spdlog::logger> GetLogger(const std::string& module) {
  std::lock_guard<std::mutex> lock(g_mu);
  if (auto existing = spdlog::get(module)) return existing;
  auto logger = spdlog::stderr_color_mt(module);
  logger->set_pattern("[%Y-%m-%d %H:%M:%S.%e] [%n] [%^%l%$] %v");
  logger->set_level(g_level);
  return logger;
}

Status SetLogLevel(const std::string& level) {
  PDSERVE_ASSIGN_OR_RETURN(spdlog::level::level_enum parsed, ParseLogLevel(level));
  std::lock_guard<std::mutex> lock(g_mu);
  g_level = parsed;
  spdlog::apply_all([](const std::shared_ptr<spdlog::logger>& l) { l->set_level(g_level); });
  return Status::Ok();
}

Status InitLogLevelFromEnv() {
  const char* env = std::getenv("PDSERVE_LOG_LEVEL");
  if (env == nullptr || *env == '\0') return Status::Ok();
  auto parsed = ParseLogLevel(env);
  if (!parsed.ok()) return Status::InvalidArgument("PDSERVE_LOG_LEVEL: " + parsed.status().message());
  return Status::Ok();
}

}  // namespace pdserve
