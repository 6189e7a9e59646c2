// pdserve: the command-line entry point (make-model, generate, tokenize, ...).
#include <cstdio>
#include <cstdlib>

#include "common/cpu_features.h"
#include "kernels/isa.h"
#include "services/cli/command.h"

namespace pdserve::cli {

std::map<std::string, Command>& CommandRegistry() {
  static std::map<std::string, Command> registry;
  return registry;
}

Result<Args> Args::Parse(const std::vector<std::string>& argv,
                         const std::vector<std::string>& options,
                         const std::vector<std::string>& flags) {
  Args args;
  auto is_in = [](const std::vector<std::string>& v, const std::string& k) {
    for (const auto& x : v)
      if (x == k) return true;
    return false;
  };
  for (size_t i = 0; i < argv.size(); ++i) {
    const std::string& a = argv[i];
    if (a.rfind("--", 0) != 0) return Status::InvalidArgument("unexpected argument '" + a + "'");
    std::string key = a.substr(2);
    std::string value;
    const size_t eq = key.find('=');
    bool has_inline = eq != std::string::npos;
    if (has_inline) {
      value = key.substr(eq + 1);
      key = key.substr(0, eq);
    }
    if (args.values_.count(key)) return Status::InvalidArgument("option --" + key + " given twice");
    if (is_in(flags, key)) {
      if (has_inline) return Status::InvalidArgument("flag --" + key + " takes no value");
      args.values_[key] = "1";
    } else if (is_in(options, key)) {
      if (!has_inline) {
        if (i + 1 >= argv.size()) return Status::InvalidArgument("option --" + key + " needs a value");
        value = argv[++i];
      }
      args.values_[key] = value;
    } else {
      return Status::InvalidArgument("unknown option --" + key);
    }
  }
  return args;
}

std::optional<std::string> Args::Get(const std::string& key) const {
  auto it = values_.find(key);
  if (it == values_.end()) return std::nullopt;
  return it->second;
}

std::string Args::GetOr(const std::string& key, const std::string& fallback) const {
  auto v = Get(key);
  return v ? *v : fallback;
}

Result<std::string> Args::Require(const std::string& key) const {
  auto v = Get(key);
  if (!v) return Status::InvalidArgument("missing required option --" + key);
  return *v;
}

Result<int64_t> Args::GetInt(const std::string& key, int64_t fallback) const {
  auto v = Get(key);
  if (!v) return fallback;
  char* end = nullptr;
  errno = 0;
  const long long x = std::strtoll(v->c_str(), &end, 10);
  if (v->empty() || *end != '\0' || errno != 0)
    return Status::InvalidArgument("option --" + key + " wants an integer, got '" + *v + "'");
  return static_cast<int64_t>(x);
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
  std::fprintf(stderr, "pdserve %s: %s\n", command.c_str(), status.ToString().c_str());
  return 1;
}

}  // namespace pdserve::cli

int main(int argc, char** argv) {
  pdserve::RequireCpuFeatures();
  pdserve::kernels::RequireIsa();  // a bad PDSERVE_ISA is reported before any command runs
  auto& registry = pdserve::cli::CommandRegistry();
  if (argc < 2 || std::string(argv[1]) == "help" || std::string(argv[1]) == "--help") {
    std::fprintf(stderr, "usage: pdserve <command> [options]\ncommands:\n");
    for (const auto& [name, cmd] : registry)
      std::fprintf(stderr, "  %-16s %s\n", name.c_str(), cmd.summary.c_str());
    return argc < 2 ? 2 : 0;
  }
  auto it = registry.find(argv[1]);
  if (it == registry.end()) {
    std::fprintf(stderr, "pdserve: unknown command '%s' (try 'pdserve help')\n", argv[1]);
    return 2;
  }
  std::vector<std::string> args(argv + 2, argv + argc);
  return it->second.run(args);
}
