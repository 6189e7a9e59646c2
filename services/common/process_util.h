// Process-level helpers for the service binaries: termination signals and atomically written
// files (ready files read by tests and the launcher). The command line: command_line.h.
//
// Thread-safety: BlockTerminationSignals must run in main() before any thread starts (threads
// inherit the mask, so only the waiting thread ever receives SIGINT/SIGTERM). The rest is pure
// or touches only its arguments.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "common/status.h"

namespace pdserve::services {

// Blocks SIGINT, SIGTERM, SIGHUP and SIGUSR1 in the calling thread (and so in threads it starts
// later) and ignores SIGPIPE (a client that hangs up must not kill a server). SIGUSR1 is the
// stop request mpirun forwards to every rank unchanged (its own SIGTERM turns into SIGCONT,
// SIGTERM and SIGKILL a second apart, too soon for a drain).
void BlockTerminationSignals();
// Waits up to `timeout` for one of those signals; returns it, or 0 on timeout.
int WaitForTerminationSignal(std::chrono::milliseconds timeout);

// Whole-file reads and atomic writes: ReadFileToString / WriteStringToFile (common/mapped_file.h).

// The first executable `name` in $PATH ("" when there is none), e.g. mpirun.
std::string FindInPath(const std::string& name);

// A random non-zero 64-bit value (incarnations, request-id prefixes).
uint64_t RandomU64();

// Wall-clock milliseconds since the Unix epoch.
int64_t UnixMillis();

}  // namespace pdserve::services
