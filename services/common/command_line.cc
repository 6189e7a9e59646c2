#include "services/common/command_line.h"

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <utility>
#include <algorithm>

namespace pdserve::services {

namespace {

const OptionSpec* FindOption(const CommandSpec& spec, const std::string& name) {
  for (const OptionSpec& o : spec.options)
    if (o.name == name) return &o;
  return nullptr;
}

}  // namespace

Result<CommandLine> CommandLine::Parse(const std::vector<std::string>& args, const CommandSpec& spec) {
  CommandLine cl;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "--help" || a == "-h") {
      cl.help_ = true;
      continue;
    }
    if (a.rfind("--", 0) != 0 || a.size() == 2) {
      if (cl.positionals_.size() >= spec.max_positionals)
        return Status::InvalidArgument("unexpected argument '" + a + "'");
      cl.positionals_.push_back(a);
      continue;
    }
    std::string key = a.substr(2), value;
    const size_t eq = key.find('=');
    const bool inline_value = eq != std::string::npos;
    if (inline_value) {
      value = key.substr(eq + 1);
      key = key.substr(0, eq);
    }
    const OptionSpec* o = FindOption(spec, key);
    if (o == nullptr) return Status::InvalidArgument("unknown option --" + key);
    if (cl.values_.count(key) && !o->repeatable) return Status::InvalidArgument("option --" + key + " given twice");
    if (o->value_name.empty()) {
      if (inline_value) return Status::InvalidArgument("flag --" + key + " takes no value");
      cl.values_[key].push_back("1");
      continue;
    }
    if (!inline_value) {
      if (i + 1 >= args.size()) return Status::InvalidArgument("option --" + key + " needs a value (" + o->value_name + ")");
      value = args[++i];
    }
    cl.values_[key].push_back(value);
  }
  if (!cl.help_) {
    for (const OptionSpec& o : spec.options)
      if (o.required && !cl.Has(o.name)) return Status::InvalidArgument("missing required option --" + o.name);
  }
  return cl;
}

Result<CommandLine> CommandLine::Parse(int argc, char** argv, const CommandSpec& spec) {
  return Parse(std::vector<std::string>(argv + (argc > 0 ? 1 : 0), argv + argc), spec);
}

std::optional<std::string> CommandLine::Get(const std::string& key) const {
  auto it = values_.find(key);
  if (it == values_.end() || it->second.empty()) return std::nullopt;
  return it->second.back();
}

std::vector<std::string> CommandLine::GetAll(const std::string& key) const {
  auto it = values_.find(key);
  return it == values_.end() ? std::vector<std::string>{} : it->second;
}

std::string CommandLine::GetOr(const std::string& key, const std::string& fallback) const {
  auto v = Get(key);
  return v ? *v : fallback;
}

Result<std::string> CommandLine::Require(const std::string& key) const {
  auto v = Get(key);
  if (!v) return Status::InvalidArgument("missing required option --" + key);
  return *v;
}

Result<int64_t> CommandLine::GetInt(const std::string& key, int64_t fallback, int64_t min, int64_t max) const {
  auto v = Get(key);
  if (!v) return fallback;
  char* end = nullptr;
  errno = 0;
  const long long x = std::strtoll(v->c_str(), &end, 10);
  if (v->empty() || *end != '\0' || errno != 0)
    return Status::InvalidArgument("option --" + key + " wants an integer, got '" + *v + "'");
  if (x < min || x > max) {
    std::string range = min == INT64_MIN ? "<= " + std::to_string(max)
                        : max == INT64_MAX ? ">= " + std::to_string(min)
                                           : "in [" + std::to_string(min) + ", " + std::to_string(max) + "]";
    return Status::InvalidArgument("option --" + key + " must be " + range + ", got " + *v);
  }
  return static_cast<int64_t>(x);
}

Result<double> CommandLine::GetDouble(const std::string& key, double fallback, double min, double max) const {
  auto v = Get(key);
  if (!v) return fallback;
  char* end = nullptr;
  errno = 0;
  const double x = std::strtod(v->c_str(), &end);
  if (v->empty() || *end != '\0' || errno != 0 || !std::isfinite(x))
    return Status::InvalidArgument("option --" + key + " wants a number, got '" + *v + "'");
  if (x < min || x > max)
    return Status::InvalidArgument("option --" + key + " is out of range [" + std::to_string(min) + ", " +
                                   std::to_string(max) + "]: " + *v);
  return x;
}

Result<bool> CommandLine::GetBool(const std::string& key, bool fallback) const {
  auto v = Get(key);
  if (!v) return fallback;
  if (*v == "true" || *v == "1" || *v == "yes") return true;
  if (*v == "false" || *v == "0" || *v == "no") return false;
  return Status::InvalidArgument("option --" + key + " must be true or false, got '" + *v + "'");
}

std::string FormatUsage(const CommandSpec& spec) {
  std::string out = "usage: " + spec.program + (spec.synopsis.empty() ? "" : " " + spec.synopsis) + "\n";
  if (!spec.description.empty()) out += "\n" + spec.description + (spec.description.back() == '\n' ? "" : "\n");
  std::vector<std::pair<std::string, std::string>> rows;
  for (const OptionSpec& o : spec.options)
    rows.emplace_back("--" + o.name + (o.value_name.empty() ? "" : " " + o.value_name),
                      o.help + (o.required ? " (required)" : ""));
  rows.emplace_back("--help", "print this text and exit");
  size_t width = 0;
  for (const auto& [head, help] : rows) width = std::max(width, head.size());
  width = std::min<size_t>(width, 34);
  out += "\noptions:\n";
  for (const auto& [head, help] : rows) {
    out += "  " + head;
    out += head.size() > width ? "\n" + std::string(width + 4, ' ') : std::string(width - head.size() + 2, ' ');
    out += help + "\n";
  }
  return out;
}

std::optional<int> ParseCommandLineOrExit(const std::vector<std::string>& args, const CommandSpec& spec,
                                          CommandLine* out) {
  auto parsed = CommandLine::Parse(args, spec);
  if (!parsed.ok()) return ReportCommandError(spec, parsed.status());
  if (parsed.value().help_requested()) {
    std::fputs(FormatUsage(spec).c_str(), stdout);
    return 0;
  }
  *out = std::move(parsed).value();
  return std::nullopt;
}

std::optional<int> ParseCommandLineOrExit(int argc, char** argv, const CommandSpec& spec, CommandLine* out) {
  return ParseCommandLineOrExit(std::vector<std::string>(argv + (argc > 0 ? 1 : 0), argv + argc), spec, out);
}

bool IsUsageError(const Status& status) {
  if (status.code() != StatusCode::kInvalidArgument) return false;
  for (const char* prefix : {"option --", "missing required option", "unknown option", "unexpected argument", "flag --",
                             "missing argument"})
    if (status.message().rfind(prefix, 0) == 0) return true;
  return false;
}

int ReportCommandError(const CommandSpec& spec, const Status& status) {
  if (status.ok()) return 0;
  const bool usage = status.code() == StatusCode::kInvalidArgument;
  std::fprintf(stderr, "%s: %s%s\n", spec.program.c_str(), status.ToString().c_str(),
               usage ? (" (see " + spec.program + " --help)").c_str() : "");
  return usage ? 2 : 1;
}

}  // namespace pdserve::services
