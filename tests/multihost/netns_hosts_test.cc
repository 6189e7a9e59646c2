// The test bed itself (scripts/netns_hosts.sh, services/testing/netns_hosts.h): hosts reach each
// other and the root namespace; `down` (the NetnsHosts destructor) leaves no namespace, link or
// process behind; a failing `up` removes what it made; a bed whose owner died is collected by
// the next `up`. Skips, saying why, where namespaces cannot be made.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include "services/testing/child_process.h"
#include "services/testing/netns_hosts.h"

namespace pdserve::multihost {
namespace {

using services::testing::NetnsHosts;
const std::string kScript = std::string(PDSERVE_SOURCE_DIR) + "/scripts/netns_hosts.sh";

// Whether anything named with `prefix` exists: a namespace or a link.
bool AnythingNamed(const std::string& prefix) {
  const std::string ns = NetnsHosts::Run({"ip", "netns", "list"}).value();
  const std::string links = NetnsHosts::Run({"ip", "-o", "link", "show"}).value();
  return ns.find(prefix) != std::string::npos || links.find(prefix) != std::string::npos;
}

#define SKIP_UNLESS_NAMESPACES()                                                                   \
  do {                                                                                             \
    auto ok_ = NetnsHosts::Run({kScript, "check"});                                                \
    if (!ok_.ok()) {                                                                               \
      std::fprintf(stderr, "*** MULTIHOST TEST SKIPPED: %s\n", ok_.status().message().c_str());    \
      GTEST_SKIP() << "MULTIHOST TEST SKIPPED: " << ok_.status().message();                        \
    }                                                                                              \
  } while (0)

TEST(NetnsHostsTest, HostsTalkAndDownLeavesNothing) {
  SKIP_UNLESS_NAMESPACES();
  std::string prefix;
  pid_t sleeper = -1;
  {
    auto bed = NetnsHosts::Create(kScript, 2);
    ASSERT_TRUE(bed.ok()) << bed.status().ToString();
    prefix = (*bed)->prefix();
    const auto& h = (*bed)->hosts();
    EXPECT_NE(h[0].address, h[1].address);
    EXPECT_EQ(h[0].interface, "eth0");
    // Each host has its own loopback, up; the hosts route to each other over eth0, and the root
    // namespace to each host over the bridge (the multi-host tests send real traffic).
    std::vector<std::string> lo_up = (*bed)->Exec(0);
    lo_up.insert(lo_up.end(), {"ip", "-o", "addr", "show", "lo", "up"});
    auto lo = NetnsHosts::Run(lo_up);
    ASSERT_TRUE(lo.ok()) << lo.status().ToString();
    EXPECT_NE(lo.value().find("127.0.0.1"), std::string::npos) << lo.value();
    std::vector<std::string> route = (*bed)->Exec(0);
    route.insert(route.end(), {"ip", "route", "get", h[1].address});
    EXPECT_NE(NetnsHosts::Run(route).value().find("dev eth0"), std::string::npos);
    EXPECT_NE(NetnsHosts::Run({"ip", "route", "get", h[0].address}).value().find(prefix + "br"), std::string::npos);
    // A process left running on a host goes with the bed.
    const pid_t child = fork();
    if (child == 0) {
      std::vector<std::string> argv = (*bed)->Exec(1);
      argv.insert(argv.end(), {"sleep", "600"});
      std::vector<char*> args;
      for (auto& a : argv) args.push_back(a.data());
      args.push_back(nullptr);
      execvp(args[0], args.data());
      _exit(127);
    }
    sleeper = child;
    ASSERT_TRUE(services::testing::WaitFor(
        [&] { return !NetnsHosts::Run({"ip", "netns", "pids", h[1].netns}).value().empty(); },
        std::chrono::seconds(5)));
  }
  int status = 0;
  EXPECT_EQ(waitpid(sleeper, &status, 0), sleeper);
  EXPECT_TRUE(WIFSIGNALED(status)) << "the host's process was not stopped";
  EXPECT_FALSE(AnythingNamed(prefix)) << NetnsHosts::Run({"ip", "-o", "link", "show"}).value();
}

TEST(NetnsHostsTest, FailedUpRemovesWhatItMade) {
  SKIP_UNLESS_NAMESPACES();
  const std::string prefix = "pdmht" + std::to_string(getpid() % 100000);
  // A link in the way of host 1's: `up` fails there, after making the bridge and host 0.
  ASSERT_TRUE(NetnsHosts::Run({"ip", "link", "add", prefix + "v1", "type", "bridge"}).ok());
  auto up = NetnsHosts::Run({kScript, "up", "3", "--prefix", prefix, "--owner", std::to_string(getpid())});
  EXPECT_FALSE(up.ok());
  EXPECT_NE(up.status().message().find("up failed; removing bed " + prefix), std::string::npos) << up.status().ToString();
  EXPECT_FALSE(AnythingNamed(prefix));
}

TEST(NetnsHostsTest, ABedWhoseOwnerDiedIsCollected) {
  SKIP_UNLESS_NAMESPACES();
  const pid_t owner = fork();
  if (owner == 0) _exit(0);
  waitpid(owner, nullptr, 0);  // a pid that is gone
  const std::string prefix = "pdmho" + std::to_string(getpid() % 100000);
  ASSERT_TRUE(NetnsHosts::Run({kScript, "up", "1", "--prefix", prefix, "--owner", std::to_string(owner)}).ok());
  EXPECT_TRUE(AnythingNamed(prefix));
  ASSERT_TRUE(NetnsHosts::Run({kScript, "gc"}).ok());
  EXPECT_FALSE(AnythingNamed(prefix));
}

}  // namespace
}  // namespace pdserve::multihost
