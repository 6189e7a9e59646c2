// Logging: one named spdlog logger per module ("engine", "kvtransfer", "router", ...), all
// writing to stderr with the same pattern. Level from PDSERVE_LOG_LEVEL (default info).
// Thread-safety: loggers are thread-safe (spdlog _mt sinks).
#pragma once

#include <memory>
#include <string>

#include <spdlog/spdlog.h>

namespace pdserve {

// Returns (creating on first use) the logger for a module.
std::shared_ptr<spdlog::logger> GetLogger(const std::string& module);
// Sets the level of every pdserve logger ("trace", "debug", "info", "warn", "error", "off").
void SetLogLevel(const std::string& level);

}  // namespace pdserve
