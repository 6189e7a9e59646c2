#include "services/launch/host_command.h"

#include "common/check.h"

namespace pdserve::launch {

std::string ShellQuote(const std::string& word) {
  if (!word.empty() && word.find_first_not_of("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_./:=@%+,-") ==
                           std::string::npos)
    return word;
  std::string out = "'";
  for (char ch : word) {
    if (ch == '\'')
      out += "'\"'\"'";
    else
      out += ch;
  }
  return out + "'";
}

LocalCommand CommandOnHost(const HostConfig* host, const std::vector<std::string>& argv,
                           const std::map<std::string, std::string>& env, const std::string& cwd) {
  LocalCommand out;
  if (host == nullptr || host->run == HostConfig::Run::kLocal) {
    out.argv = argv;
    out.env = env;
    return out;
  }
  if (host->run == HostConfig::Run::kPrefix) {
    // env(1) after the prefix: a prefix such as sudo may not pass the launcher's environment on.
    out.argv = host->prefix;
    if (!env.empty()) {
      out.argv.push_back("env");
      for (const auto& [k, v] : env) out.argv.push_back(k + "=" + v);
    }
    out.argv.insert(out.argv.end(), argv.begin(), argv.end());
    return out;
  }
  std::string remote = "cd " + ShellQuote(cwd) + " && exec";
  if (!env.empty()) {
    remote += " env";
    for (const auto& [k, v] : env) remote += " " + ShellQuote(k + "=" + v);
  }
  for (const std::string& a : argv) remote += " " + ShellQuote(a);
  out.argv = {"ssh"};
  out.argv.insert(out.argv.end(), host->ssh_options.begin(), host->ssh_options.end());
  out.argv.push_back(host->ssh_target.empty() ? host->address : host->ssh_target);
  out.argv.push_back("--");
  out.argv.push_back(remote);
  return out;
}

std::string MpiLaunchAgentScript(const std::vector<HostConfig>& hosts) {
  std::string s =
      "#!/bin/sh\n"
      "# Written by pdserve-launch: Open MPI's launch agent (plm_rsh_agent) for this cluster's hosts.\n"
      "# Usage: agent HOST WORD... runs the words as one shell command on HOST.\n"
      "host=\"$1\"\n"
      "shift\n"
      "case \"$host\" in\n";
  for (const HostConfig& h : hosts) {
    s += "  " + ShellQuote(h.address) + "|" + ShellQuote(h.name) + ")\n    exec";
    switch (h.run) {
      case HostConfig::Run::kLocal:
        s += " /bin/sh -c \"$*\"";
        break;
      case HostConfig::Run::kPrefix:
        for (const std::string& p : h.prefix) s += " " + ShellQuote(p);
        s += " /bin/sh -c \"$*\"";
        break;
      case HostConfig::Run::kSsh:
        // No pty (-tt) for MPI's daemons; the rest of the host's options apply.
        s += " ssh";
        for (const std::string& o : h.ssh_options)
          if (o != "-tt" && o != "-t") s += " " + ShellQuote(o);
        s += " -x " + ShellQuote(h.ssh_target.empty() ? h.address : h.ssh_target) + " \"$*\"";
        break;
    }
    s += "\n    ;;\n";
  }
  s += "  *)\n    echo \"pdserve launch agent: '$host' is not a host of the cluster's inventory\" >&2\n"
       "    exit 255\n    ;;\nesac\n";
  return s;
}

std::string MpiHostfile(const std::vector<const HostConfig*>& hosts, uint32_t ranks) {
  PDSERVE_CHECK(!hosts.empty() && ranks % hosts.size() == 0);
  std::string s;
  for (const HostConfig* h : hosts) s += h->address + " slots=" + std::to_string(ranks / hosts.size()) + "\n";
  return s;
}

}  // namespace pdserve::launch
