// How the launcher reaches inventory hosts (host_command.h): the local argv for each kind of
// host, shell quoting where a shell reads the words, and the launch agent mpirun uses, run for
// real with /bin/sh on local and prefix hosts.
#include "services/launch/host_command.h"

#include <sys/wait.h>

#include <cstdio>
#include <filesystem>

#include <gtest/gtest.h>

#include "common/mapped_file.h"
#include "services/testing/child_process.h"

namespace pdserve::launch {
namespace {

using Argv = std::vector<std::string>;

HostConfig Host(const std::string& name, HostConfig::Run run, Argv prefix = {}) {
  HostConfig h;
  h.name = name;
  h.address = "10.9.0." + std::to_string(name.size());
  h.run = run;
  h.prefix = std::move(prefix);
  return h;
}

TEST(HostCommandTest, LocalPrefixAndSshCommands) {
  const Argv argv = {"/opt/bin/pdserve-decode", "--model", "my models/x"};
  const std::map<std::string, std::string> env = {{"UCX_TLS", "tcp"}};
  auto here = CommandOnHost(nullptr, argv, env, "/w");
  EXPECT_EQ(here.argv, argv);
  EXPECT_EQ(here.env, env);
  const HostConfig local = Host("a", HostConfig::Run::kLocal);
  EXPECT_EQ(CommandOnHost(&local, argv, env, "/w").argv, argv);

  const HostConfig ns = Host("bb", HostConfig::Run::kPrefix, {"ip", "netns", "exec", "pdmh1-h1"});
  auto in_ns = CommandOnHost(&ns, argv, env, "/w");
  EXPECT_EQ(in_ns.argv, (Argv{"ip", "netns", "exec", "pdmh1-h1", "env", "UCX_TLS=tcp", "/opt/bin/pdserve-decode",
                              "--model", "my models/x"}));
  EXPECT_TRUE(in_ns.env.empty());

  HostConfig ssh = Host("ccc", HostConfig::Run::kSsh);
  ssh.ssh_target = "me@node-c";
  auto over_ssh = CommandOnHost(&ssh, argv, {{"X", "it's"}}, "/work dir");
  EXPECT_EQ(over_ssh.argv, (Argv{"ssh", "-tt", "-o", "BatchMode=yes", "me@node-c", "--",
                                 "cd '/work dir' && exec env 'X=it'\"'\"'s' /opt/bin/pdserve-decode --model 'my models/x'"}));
  ssh.ssh_target.clear();
  EXPECT_EQ(CommandOnHost(&ssh, argv, {}, "/w").argv.at(4), "10.9.0.3");  // the address by default
}

TEST(HostCommandTest, ShellQuoting) {
  EXPECT_EQ(ShellQuote("plain-word_1.2:3=x@y%z+a,b/c"), "plain-word_1.2:3=x@y%z+a,b/c");
  EXPECT_EQ(ShellQuote(""), "''");
  EXPECT_EQ(ShellQuote("a b"), "'a b'");
  EXPECT_EQ(ShellQuote("$(rm -rf /)"), "'$(rm -rf /)'");
  EXPECT_EQ(ShellQuote("it's"), "'it'\"'\"'s'");
}

TEST(HostCommandTest, HostfileSpreadsRanksEvenly) {
  const HostConfig b = Host("b", HostConfig::Run::kLocal), c = Host("cc", HostConfig::Run::kLocal);
  EXPECT_EQ(MpiHostfile({&b, &c}, 4), "10.9.0.1 slots=2\n10.9.0.2 slots=2\n");
  EXPECT_EQ(MpiHostfile({&c}, 1), "10.9.0.2 slots=1\n");
}

// Runs the agent script as mpirun would: `agent HOST WORD...`.
std::pair<int, std::string> RunAgent(const std::string& script, const Argv& args) {
  const std::string dir = services::testing::MakeTempDir("agent");
  const std::string path = dir + "/agent.sh";
  EXPECT_TRUE(WriteStringToFile(path, script).ok());
  std::filesystem::permissions(path, std::filesystem::perms::owner_all, std::filesystem::perm_options::add);
  std::string cmd = path;
  for (const std::string& a : args) cmd += " " + ShellQuote(a);
  FILE* p = popen((cmd + " 2>&1").c_str(), "r");
  std::string out;
  char buf[256];
  while (p != nullptr && fgets(buf, sizeof(buf), p) != nullptr) out += buf;
  const int status = p == nullptr ? -1 : pclose(p);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

TEST(HostCommandTest, LaunchAgentRunsTheWordsOnTheNamedHost) {
  // A prefix that marks where the command ran: env(1) setting a variable, as `ip netns exec` would
  // switch namespaces.
  std::vector<HostConfig> hosts = {Host("a", HostConfig::Run::kLocal),
                                   Host("bb", HostConfig::Run::kPrefix, {"env", "WHERE=on-bb"})};
  const std::string script = MpiLaunchAgentScript(hosts);
  // Words are joined as ssh joins them: the shell on the host sees one command line.
  auto [rc_a, out_a] = RunAgent(script, {"10.9.0.1", "echo", "ran;", "echo", "${WHERE:-here}"});
  EXPECT_EQ(rc_a, 0) << out_a;
  EXPECT_EQ(out_a, "ran\nhere\n");
  auto [rc_b, out_b] = RunAgent(script, {"bb", "echo", "${WHERE}"});  // by name too
  EXPECT_EQ(rc_b, 0) << out_b;
  EXPECT_EQ(out_b, "on-bb\n");
  auto [rc_x, out_x] = RunAgent(script, {"10.9.9.9", "true"});
  EXPECT_EQ(rc_x, 255);
  EXPECT_NE(out_x.find("'10.9.9.9' is not a host of the cluster's inventory"), std::string::npos) << out_x;
  // ssh hosts get no pty from the agent.
  HostConfig ssh = Host("s", HostConfig::Run::kSsh);
  const std::string with_ssh = MpiLaunchAgentScript({ssh});
  EXPECT_NE(with_ssh.find("exec ssh -o BatchMode=yes -x 10.9.0.1 \"$*\""), std::string::npos) << with_ssh;
}

}  // namespace
}  // namespace pdserve::launch
