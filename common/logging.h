// Logging: one named spdlog logger per module ("engine", "kvtransfer", "router", ...), all
// writing to stderr with the same pattern. Level from PDSERVE_LOG_LEVEL (default info), then
// the binary's --log-level.
// Thread-safety: loggers are thread-safe (spdlog _mt sinks); SetLogLevel may run on any thread.
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include <spdlog/spdlog.h>

#include "common/status.h"

namespace pdserve {

// Returns (creating on first use) the logger for a module.
std::shared_ptr<spdlog::logger> GetLogger(const std::string& module);

// "trace", "debug", "info", "warn" (or "warning"), "error", "critical", "off". Errors:
// InvalidArgument naming the bad value and listing the good ones (spdlog itself silently maps an
// unknown name to "off", which hides every log).
Result<spdlog::level::level_enum> ParseLogLevel(std::string_view level);
// Sets the level of every pdserve logger. Errors: those of ParseLogLevel (the level is unchanged).
Status SetLogLevel(const std::string& level);
// Checks PDSERVE_LOG_LEVEL (already applied at start-up when valid). Every binary calls this
// first thing in main() and exits with the error, so a typo in the variable is not a silent
// change of level. Errors: InvalidArgument naming the variable.
Status InitLogLevelFromEnv();

}  // namespace pdserve
