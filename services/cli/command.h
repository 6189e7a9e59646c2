// Subcommands of the `pdserve` CLI. Each lives in its own <name>_cmd.cc and registers itself
// with PDSERVE_REGISTER_COMMAND, giving its CommandSpec (options + help) and a function run on
// the parsed command line; main.cc dispatches on argv[1], answers --help from the spec and
// reports parse errors (exit 2) before the command runs.
#pragma once

#include <functional>
#include <map>
#include <string>
#include <vector>

#include "common/status.h"
#include "services/common/command_line.h"

namespace pdserve::cli {

using services::CommandLine;
using services::CommandSpec;

struct Command {
  std::string name;
  std::string summary;  // one line, shown by `pdserve help`
  CommandSpec spec;     // spec.program is "pdserve <name>"
  std::function<int(const CommandLine& args)> run;  // returns the exit code
};

std::map<std::string, Command>& CommandRegistry();

struct CommandRegistrar {
  CommandRegistrar(std::string name, std::string summary, std::string synopsis, std::string description,
                   std::vector<services::OptionSpec> options, size_t max_positionals,
                   std::function<int(const CommandLine&)> run);
};

// The whole `pdserve` command line: dispatch on argv[1] (entry.cc's main calls it; so does the
// test-only pdserve-numerics-fault after switching its fault on). Returns the exit code.
int Main(int argc, char** argv);

// "1,2,3" -> token ids (non-negative int32). Errors: InvalidArgument naming --prompt-ids.
Result<std::vector<int32_t>> ParseTokenIds(const std::string& s);

// Prints "pdserve <cmd>: <status>" to stderr and returns the exit code: 0 for OK, 2 for bad
// usage (services::IsUsageError: an option's value out of range, a missing argument), 1 for
// every other failure.
int ReportStatus(const std::string& command, const Status& status);

}  // namespace pdserve::cli

// PDSERVE_REGISTER_COMMAND(ident, "name", "summary", "synopsis", "description",
//                          {{"opt", "VALUE", "help"}, ...}, max_positionals, RunFn)
#define PDSERVE_REGISTER_COMMAND(ident, name, summary, synopsis, description, options, max_positionals, fn) \
  static ::pdserve::cli::CommandRegistrar ident##_registrar(name, summary, synopsis, description,         \
                                                             std::vector<::pdserve::services::OptionSpec> options, \
                                                             max_positionals, fn)
