#include "common/logging.h"

#include <cstdlib>
#include <mutex>

#include <spdlog/sinks/stdout_color_sinks.h>

namespace pdserve {

namespace {
std::mutex g_mu;
spdlog::level::level_enum g_level = [] {
  const char* env = std::getenv("PDSERVE_LOG_LEVEL");
  return env ? spdlog::level::from_str(env) : spdlog::level::info;
}();
}  // namespace

std::shared_ptr<spdlog::logger> GetLogger(const std::string& module) {
  std::lock_guard<std::mutex> lock(g_mu);
  if (auto existing = spdlog::get(module)) return existing;
  auto logger = spdlog::stderr_color_mt(module);
  logger->set_pattern("[%Y-%m-%d %H:%M:%S.%e] [%n] [%^%l%$] %v");
  logger->set_level(g_level);
  return logger;
}

void SetLogLevel(const std::string& level) {
  std::lock_guard<std::mutex> lock(g_mu);
  g_level = spdlog::level::from_str(level);
  spdlog::apply_all([](const std::shared_ptr<spdlog::logger>& l) { l->set_level(g_level); });
}

}  // namespace pdserve
