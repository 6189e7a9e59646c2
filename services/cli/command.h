// Subcommands of the `pdserve` CLI. Each lives in its own <name>_cmd.cc and registers itself
// with PDSERVE_REGISTER_COMMAND; main.cc dispatches on argv[1].
#pragma once

#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "common/status.h"

namespace pdserve::cli {

// Parsed "--key value" / "--flag" arguments of one subcommand.
// Unknown or repeated keys are errors, so a typo never silently falls back to a default.
class Args {
 public:
  // `flags` take no value; `options` take one value. Errors: InvalidArgument naming the key.
  static Result<Args> Parse(const std::vector<std::string>& argv,
                            const std::vector<std::string>& options,
                            const std::vector<std::string>& flags);
  bool Has(const std::string& key) const { return values_.count(key) > 0; }
  std::optional<std::string> Get(const std::string& key) const;
  std::string GetOr(const std::string& key, const std::string& fallback) const;
  // Errors: InvalidArgument when missing (if required) or not an integer.
  Result<std::string> Require(const std::string& key) const;
  Result<int64_t> GetInt(const std::string& key, int64_t fallback) const;

 private:
  std::map<std::string, std::string> values_;
};

struct Command {
  std::string name;
  std::string summary;  // one line, shown by `pdserve help`
  std::function<int(const std::vector<std::string>& args)> run;  // returns the exit code
};

std::map<std::string, Command>& CommandRegistry();

struct CommandRegistrar {
  explicit CommandRegistrar(Command c) { CommandRegistry()[c.name] = std::move(c); }
};

// "1,2,3" -> token ids (non-negative int32). Errors: InvalidArgument naming --prompt-ids.
Result<std::vector<int32_t>> ParseTokenIds(const std::string& s);

// Prints "pdserve <cmd>: <status>" to stderr and returns 1 (or 0 for OK).
int ReportStatus(const std::string& command, const Status& status);

}  // namespace pdserve::cli

#define PDSERVE_REGISTER_COMMAND(ident, name, summary, fn) \
  static ::pdserve::cli::CommandRegistrar ident##_registrar({name, summary, fn})
