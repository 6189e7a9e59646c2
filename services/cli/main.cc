// pdserve: the command-line entry point (make-model, generate, tokenize, ...).
#include <cstdio>
#include <cstdlib>

#include "common/cpu_features.h"
#include "common/logging.h"
#include "kernels/isa.h"
#include "services/cli/command.h"

namespace pdserve::cli {

std::map<std::string, Command>& CommandRegistry() {
  static std::map<std::string, Command> registry;
  return registry;
}

CommandRegistrar::CommandRegistrar(std::string name, std::string summary, std::string synopsis,
                                   std::string description, std::vector<services::OptionSpec> options,
                                   size_t max_positionals, std::function<int(const CommandLine&)> run) {
  Command c;
  c.name = name;
  c.summary = std::move(summary);
  c.spec = CommandSpec{"pdserve " + name, std::move(synopsis), std::move(description), std::move(options),
                       max_positionals};
  c.run = std::move(run);
  CommandRegistry()[name] = std::move(c);
}

Result<std::vector<int32_t>> ParseTokenIds(const std::string& s) {
  std::vector<int32_t> ids;
  size_t i = 0;
  while (i < s.size()) {
    size_t j = s.find(',', i);
    if (j == std::string::npos) j = s.size();
    const std::string part = s.substr(i, j - i);
    char* end = nullptr;
    const long v = std::strtol(part.c_str(), &end, 10);
    if (part.empty() || *end != '\0' || v < 0 || v > INT32_MAX)
      return Status::InvalidArgument("--prompt-ids: '" + part + "' is not a token id");
    ids.push_back(static_cast<int32_t>(v));
    i = j + 1;
  }
  if (ids.empty()) return Status::InvalidArgument("--prompt-ids is empty");
  return ids;
}

int ReportStatus(const std::string& command, const Status& status) {
  if (status.ok()) return 0;
  const bool usage = services::IsUsageError(status);
  std::fprintf(stderr, "pdserve %s: %s%s\n", command.c_str(), status.ToString().c_str(),
               usage ? (" (see pdserve " + command + " --help)").c_str() : "");
  return usage ? 2 : 1;
}

}  // namespace pdserve::cli

int pdserve::cli::Main(int argc, char** argv) {
  pdserve::RequireCpuFeatures();
  pdserve::kernels::RequireIsa();  // a bad PDSERVE_ISA is reported before any command runs
  auto& registry = pdserve::cli::CommandRegistry();
  const std::string first = argc >= 2 ? argv[1] : "";
  if (argc < 2 || first == "help" || first == "--help" || first == "-h") {
    std::FILE* out = argc < 2 ? stderr : stdout;
    std::fprintf(out, "usage: pdserve <command> [options]   (pdserve <command> --help for its options)\ncommands:\n");
    for (const auto& [name, cmd] : registry) std::fprintf(out, "  %-16s %s\n", name.c_str(), cmd.summary.c_str());
    return argc < 2 ? 2 : 0;
  }
  auto it = registry.find(first);
  if (it == registry.end()) {
    std::fprintf(stderr, "pdserve: unknown command '%s' (try 'pdserve help')\n", argv[1]);
    return 2;
  }
  if (pdserve::Status s = pdserve::InitLogLevelFromEnv(); !s.ok()) return pdserve::cli::ReportStatus(first, s);
  pdserve::services::CommandLine args;
  if (auto exit_code = pdserve::services::ParseCommandLineOrExit(std::vector<std::string>(argv + 2, argv + argc),
                                                                 it->second.spec, &args))
    return *exit_code;
  return it->second.run(args);
}
