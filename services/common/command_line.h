// CommandLine: the one command-line parser of every pdserve binary and `pdserve` subcommand.
//
// Syntax: "--key value", "--key=value", "--flag", and (where a command takes them) positional
// arguments. Unknown keys, repeated keys, a flag given a value and an option without one are
// errors naming the key, so a typo never silently falls back to a default. "--help" / "-h"
// anywhere asks for the usage text, which is generated from the same CommandSpec the parser
// checks against, so the two cannot drift apart.
//
//   static const CommandSpec kSpec{"pdserve-router", "[--config FILE] [options]", "...",
//                                  {{"config", "FILE", "the cluster/router YAML file"}, ...}};
//   CommandLine cl;
//   if (auto exit_code = ParseCommandLineOrExit(argc, argv, kSpec, &cl)) return *exit_code;
//
// Thread-safety: value types; pure functions.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "common/status.h"

namespace pdserve::services {

struct OptionSpec {
  std::string name;        // without the leading "--"
  std::string value_name;  // shown in the usage ("N", "FILE"); empty: a flag taking no value
  std::string help;        // one line (may name the default)
  bool repeatable = false; // may be given several times (GetAll); otherwise twice is an error
  bool required = false;   // missing is a parse error (unless --help)
};

struct CommandSpec {
  std::string program;      // "pdserve-router", "pdserve generate"
  std::string synopsis;     // the usage line after the program name
  std::string description;  // printed between the usage line and the options (may be empty)
  std::vector<OptionSpec> options;
  // Positional arguments accepted (0: none); named in `synopsis`.
  size_t max_positionals = 0;
};

class CommandLine {
 public:
  // Parses `args` (argv without the program name / subcommand). Errors: InvalidArgument naming
  // the offending argument.
  static Result<CommandLine> Parse(const std::vector<std::string>& args, const CommandSpec& spec);
  // The same over main()'s argv (argv[0] skipped).
  static Result<CommandLine> Parse(int argc, char** argv, const CommandSpec& spec);

  bool help_requested() const { return help_; }
  bool empty() const { return values_.empty() && positionals_.empty() && !help_; }
  const std::vector<std::string>& positionals() const { return positionals_; }

  bool Has(const std::string& key) const { return values_.count(key) > 0; }
  // The value (the last one of a repeatable option).
  std::optional<std::string> Get(const std::string& key) const;
  // Every value of a repeatable option, in order.
  std::vector<std::string> GetAll(const std::string& key) const;
  std::string GetOr(const std::string& key, const std::string& fallback) const;
  // Errors: InvalidArgument "missing required option --key".
  Result<std::string> Require(const std::string& key) const;
  // Errors: InvalidArgument when the value is not an integer, or outside [min, max].
  Result<int64_t> GetInt(const std::string& key, int64_t fallback, int64_t min = INT64_MIN,
                         int64_t max = INT64_MAX) const;
  // Errors: InvalidArgument when the value is not a finite number, or outside [min, max].
  Result<double> GetDouble(const std::string& key, double fallback, double min = -1e308, double max = 1e308) const;
  // "true|false|1|0|yes|no". Errors: InvalidArgument otherwise.
  Result<bool> GetBool(const std::string& key, bool fallback) const;

 private:
  std::map<std::string, std::vector<std::string>> values_;
  std::vector<std::string> positionals_;
  bool help_ = false;
};

// The usage text: "usage: PROGRAM SYNOPSIS", the description, then every option with its help.
std::string FormatUsage(const CommandSpec& spec);

// The standard handling at the top of a main(): --help prints the usage on stdout and returns
// 0; a parse error prints "PROGRAM: <error> (see PROGRAM --help)" on stderr and returns 2;
// otherwise stores the result in *out and returns nullopt (go on).
std::optional<int> ParseCommandLineOrExit(const std::vector<std::string>& args, const CommandSpec& spec,
                                          CommandLine* out);
std::optional<int> ParseCommandLineOrExit(int argc, char** argv, const CommandSpec& spec, CommandLine* out);

// True for the errors of CommandLine itself (an unknown, missing, repeated or malformed option,
// a missing argument): bad usage, exit 2.
bool IsUsageError(const Status& status);

// Prints "PROGRAM: <status>" (and the --help hint for InvalidArgument) on stderr; returns the
// exit code: 2 for InvalidArgument (bad usage or configuration), 1 otherwise.
int ReportCommandError(const CommandSpec& spec, const Status& status);

}  // namespace pdserve::services
