// How pdserve-launch runs a command on an inventory host (cluster_config.h HostConfig,
// docs/deploy.md "Many hosts"), and the two files mpirun needs to spread an instance's ranks
// over hosts: a hostfile and a launch agent (Open MPI's plm_rsh_agent) that reaches each host
// the same way the launcher does.
//
// Thread-safety: pure functions.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "services/launch/cluster_config.h"

namespace pdserve::launch {

// What the launcher execs on its own machine: argv, and the environment added to its own.
struct LocalCommand {
  std::vector<std::string> argv;
  std::map<std::string, std::string> env;
};

// `argv` with `env` on `host` (nullptr or a local host: this machine, env passed as is):
//   prefix host: <prefix...> env K=V... <argv...>   (the prefix inherits the launcher's cwd)
//   ssh host:    ssh <ssh_options> <target> -- 'cd <cwd> && exec env K=V... <argv...>'
// Words are shell-quoted where a shell reads them (ssh); env values never leak into a shell
// unquoted.
LocalCommand CommandOnHost(const HostConfig* host, const std::vector<std::string>& argv,
                           const std::map<std::string, std::string>& env, const std::string& cwd);

// `word` quoted for a POSIX shell ('it'"'"'s'); plain words ([A-Za-z0-9_./:=@%+,-]) unquoted.
std::string ShellQuote(const std::string& word);

// The plm_rsh_agent script: Open MPI runs `<agent> HOST WORD...` to start its daemon on HOST
// (a hostfile entry: a host's address, or its name); the script runs the words as one shell
// command there, through the host's prefix, ssh (without a pty: MPI's daemons must not get
// one) or locally. An unknown HOST fails (exit 255) with a message.
std::string MpiLaunchAgentScript(const std::vector<HostConfig>& hosts);

// A hostfile putting `ranks` ranks evenly on `hosts` (in order): "<address> slots=<k>" lines.
// REQUIRES: ranks % hosts.size() == 0, hosts non-empty.
std::string MpiHostfile(const std::vector<const HostConfig*>& hosts, uint32_t ranks);

}  // namespace pdserve::launch
