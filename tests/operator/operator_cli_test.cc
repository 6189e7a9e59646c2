// Command lines as a new user types them: `--help` on every binary and subcommand prints its
// usage and exits 0; a bad option exits 2 naming it; a service started with no arguments binds
// no default port and dials no default router; a log level typo is an error, not silence;
// pdserve-loadgen validates its lists and needs a target; and a port another process listens on
// is "address in use" and exit, for every listener (router HTTP, control, request API, worker
// metrics).
//
// To add a binary or subcommand: add it to the lists below.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cctype>
#include <filesystem>
#include <fstream>
#include <set>

#include <gtest/gtest.h>

#include "services/testing/child_process.h"
#include "services/testing/http_test_client.h"
#include "tests/operator/operator_util.h"

namespace pdserve::operator_test {
namespace {

using namespace std::chrono_literals;
using services::testing::ChildProcess;
using services::testing::MakeTempDir;

const std::vector<std::string> kBinaries = {"pdserve-router",    "pdserve-worker",      "pdserve-colocated",
                                            "pdserve-prefill",   "pdserve-decode",      "pdserve-launch",
                                            "pdserve-loadgen",   "pdserve-echo-worker", "pdserve"};
const std::vector<std::string> kSubcommands = {"batch-generate", "chat-template", "client",  "compare",  "convert",
                                               "generate",       "keygen",        "make-model", "tokenize", "version"};

TEST(OperatorCliTest, EveryBinaryAndSubcommandAnswersHelp) {
  std::vector<std::string> commands;
  for (const auto& b : kBinaries) commands.push_back(Bin(b) + " --help");
  for (const auto& c : kSubcommands) commands.push_back(Bin("pdserve") + " " + c + " --help");
  for (const auto& cmd : commands) {
    SCOPED_TRACE(cmd);
    const CommandResult r = RunCommand(cmd);
    EXPECT_EQ(r.status, 0) << r.output;
    EXPECT_EQ(r.output.rfind("usage: ", 0), 0u) << r.output;
    EXPECT_EQ(r.output.find("unknown option"), std::string::npos) << r.output;
  }
  // The subcommand's usage names its own options.
  EXPECT_NE(RunCommand(Bin("pdserve") + " make-model --help").output.find("--vocab N"), std::string::npos);
  EXPECT_NE(RunCommand(Bin("pdserve-router") + " --help").output.find("--control ENDPOINT"), std::string::npos);
}

TEST(OperatorCliTest, BadOptionsExit2NamingTheOption) {
  std::vector<std::string> commands;
  for (const auto& b : kBinaries)
    if (b != "pdserve") commands.push_back(Bin(b) + " --no-such-option 1");
  for (const auto& c : kSubcommands) commands.push_back(Bin("pdserve") + " " + c + " --no-such-option 1");
  for (const auto& cmd : commands) {
    SCOPED_TRACE(cmd);
    const CommandResult r = RunCommand(cmd);
    EXPECT_EQ(r.status, 2) << r.output;
    EXPECT_NE(r.output.find("unknown option --no-such-option"), std::string::npos) << r.output;
  }
  struct Case {
    std::string command, says;
  };
  for (const Case& c : std::vector<Case>{
           {Bin("pdserve") + " make-model --preset tiny", "missing required option --out"},
           {Bin("pdserve") + " make-model --out /nonexistent/x --vocab -5", "option --vocab must be in [0, 16777216]"},
           {Bin("pdserve") + " keygen --out /tmp", "missing required option --name"},
           {Bin("pdserve") + " client --chat hi", "missing required option --endpoint"},
           {Bin("pdserve") + " compare only-one-dir", "wants two dump directories"},
           {Bin("pdserve-router") + " --port 0 --max-migrations x", "option --max-migrations wants an integer"},
           {Bin("pdserve-colocated") + " --model /x", "--router (or worker.router) is required"},
           {Bin("pdserve-colocated") + " --router tcp://127.0.0.1:1 --model /x --kv-stream-layers maybe",
            "option --kv-stream-layers must be true or false"},
           {Bin("pdserve-echo-worker") + " --worker-id x", "--router is required"},
           {Bin("pdserve-launch"), "missing the cluster file CONFIG.yaml"},
           {Bin("pdserve-loadgen"), "give the target: --url http://HOST:PORT or --ready-file F"},
           {Bin("pdserve-loadgen") + " --url http://127.0.0.1:1 --request-rates 2,abc,-1",
            "--request-rates: 'abc' is not a rate > 0 or 'inf'"},
           {Bin("pdserve-loadgen") + " --url http://127.0.0.1:1 --request-rates -1", "'-1' is not a rate > 0"},
           {Bin("pdserve-loadgen") + " --url http://127.0.0.1:1 --concurrency x", "--concurrency: 'x' is not a count"},
           {Bin("pdserve-loadgen") + " --url http://127.0.0.1:1 --num-requests 0", "option --num-requests is out of range"},
           {Bin("pdserve-loadgen") + " --url 127.0.0.1:8000", "--url must look like http://HOST:PORT"},
       }) {
    SCOPED_TRACE(c.command);
    const CommandResult r = RunCommand(c.command);
    EXPECT_EQ(r.status, 2) << r.output;
    EXPECT_NE(r.output.find(c.says), std::string::npos) << r.output;
  }
}

TEST(OperatorCliTest, LogLevelTyposAreErrorsNotSilence) {
  for (const std::string& cmd :
       {Bin("pdserve-router") + " --port 0 --log-level bogus", Bin("pdserve-echo-worker") + " --router tcp://x:1 --log-level bogus",
        "PDSERVE_LOG_LEVEL=bogus " + Bin("pdserve-router") + " --port 0",
        "PDSERVE_LOG_LEVEL=bogus " + Bin("pdserve-launch") + " /nonexistent.yaml",
        "PDSERVE_LOG_LEVEL=bogus " + Bin("pdserve") + " version"}) {
    SCOPED_TRACE(cmd);
    const CommandResult r = RunCommand(cmd);
    EXPECT_NE(r.status, 0) << r.output;
    EXPECT_NE(r.output.find("unknown log level 'bogus'"), std::string::npos) << r.output;
  }
  // The good spellings still work ("warning" as spdlog's users write it).
  EXPECT_EQ(RunCommand("PDSERVE_LOG_LEVEL=warning " + Bin("pdserve") + " version").status, 0);
}

TEST(OperatorCliTest, ServicesWithoutArgumentsBindNothingAndDialNothing) {
  const CommandResult router = RunCommand("timeout 10 " + Bin("pdserve-router"));
  EXPECT_EQ(router.status, 2) << router.output;
  EXPECT_NE(router.output.find("give --config FILE or the listen options"), std::string::npos) << router.output;
  for (const std::string b : {"pdserve-worker", "pdserve-colocated", "pdserve-prefill", "pdserve-decode",
                               "pdserve-echo-worker"}) {
    SCOPED_TRACE(b);
    const CommandResult r = RunCommand("timeout 10 " + Bin(b));
    EXPECT_EQ(r.status, 2) << r.output;  // not 124: it did not sit there dialling a default router
    EXPECT_NE(r.output.find("is required"), std::string::npos) << r.output;
  }
}

// Nobody listens: `pdserve client` says so within its connect timeout instead of waiting out
// the request timeout, and a worker keeps retrying with warnings instead of one line and silence.
TEST(OperatorCliTest, DeadEndpointsAreReportedPromptly) {
  const int nobody = services::testing::FreeTcpPort();
  const auto t0 = std::chrono::steady_clock::now();
  const CommandResult client = RunCommand(Bin("pdserve") + " client --endpoint tcp://127.0.0.1:" +
                                          std::to_string(nobody) + " --chat hi --connect-timeout-ms 1000");
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 5s);
  EXPECT_EQ(client.status, 1) << client.output;
  EXPECT_NE(client.output.find("no answer from a router at tcp://127.0.0.1:" + std::to_string(nobody)),
            std::string::npos)
      << client.output;

  const std::string dir = MakeTempDir("pdserve-op-noroute");
  auto worker = ChildProcess::Spawn({Bin("pdserve-echo-worker"), "--router",
                                     "tcp://127.0.0.1:" + std::to_string(nobody), "--worker-id", "lonely"},
                                    dir + "/worker.log");
  ASSERT_TRUE(worker.ok());
  auto warnings = [&] {
    const std::string log = (*worker)->Log();
    size_t n = 0;
    for (size_t at = 0; (at = log.find("no answer from router", at)) != std::string::npos; ++at) ++n;
    return n;
  };
  // Warnings at about 1 s, 3 s, 7 s ... after the first attempt.
  EXPECT_TRUE(services::testing::WaitFor([&] { return warnings() >= 2; }, 8s)) << (*worker)->Log();
  EXPECT_NE((*worker)->Log().find("[warning] worker lonely: no answer from router tcp://127.0.0.1:"), std::string::npos)
      << (*worker)->Log();
  (*worker)->Signal(SIGTERM);
  EXPECT_EQ((*worker)->WaitExit(10s), std::optional<int>(0));
}

// Every series the shipped Grafana dashboard reads exists from the start (a counter that
// appears only at its first increment shows "No data", e.g. worker removals).
TEST(OperatorCliTest, EveryDashboardSeriesIsExportedFromStartUp) {
  std::ifstream in(std::string(PDSERVE_SOURCE_DIR) + "/deploy/grafana/dashboard.json");
  const std::string dashboard((std::istreambuf_iterator<char>(in)), {});
  std::set<std::string> names;
  for (size_t at = 0; (at = dashboard.find("pdserve_", at)) != std::string::npos;) {
    size_t end = at;
    while (end < dashboard.size() && (std::isalnum(static_cast<unsigned char>(dashboard[end])) || dashboard[end] == '_'))
      ++end;
    names.insert(dashboard.substr(at, end - at));
    at = end;
  }
  ASSERT_GT(names.size(), 10u);
  const std::string dir = MakeTempDir("pdserve-op-dashboard");
  const std::string endpoint = "tcp://127.0.0.1:" + std::to_string(services::testing::FreeTcpPort());
  auto router = ChildProcess::Spawn({Bin("pdserve-router"), "--port", "0", "--control", endpoint, "--ready-file",
                                     dir + "/router.ready"},
                                    dir + "/router.log");
  ASSERT_TRUE(router.ok());
  auto r = services::testing::WaitForReadyFile(dir + "/router.ready", router->get(), 30s);
  ASSERT_TRUE(r.ok());
  auto worker = ChildProcess::Spawn({Bin("pdserve-echo-worker"), "--router", endpoint, "--ready-file",
                                     dir + "/worker.ready"},
                                    dir + "/worker.log");
  ASSERT_TRUE(worker.ok());
  auto w = services::testing::WaitForReadyFile(dir + "/worker.ready", worker->get(), 30s);
  ASSERT_TRUE(w.ok());
  const std::string exported = services::testing::HttpGet((*r)["http_port"], "/metrics").body +
                               services::testing::HttpGet((*w)["metrics_port"], "/metrics").body;
  for (const std::string& name : names) {
    SCOPED_TRACE(name);
    EXPECT_NE(exported.find("\n" + name), std::string::npos) << name << " is not exported before any traffic";
  }
}

// A listening socket of the test's own on a free port.
class HeldPort {
 public:
  HeldPort() {
    fd_ = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = 0;
    EXPECT_EQ(bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
    EXPECT_EQ(listen(fd_, 4), 0);
    socklen_t len = sizeof(a);
    getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len);
    port_ = ntohs(a.sin_port);
  }
  ~HeldPort() { close(fd_); }
  int port() const { return port_; }

 private:
  int fd_ = -1;
  int port_ = 0;
};

TEST(OperatorCliTest, EveryListenerRefusesATakenPort) {
  const std::string dir = MakeTempDir("pdserve-op-ports");
  struct Case {
    std::string what;
    std::function<std::vector<std::string>(int taken)> argv;
    std::string says;
  };
  const std::vector<Case> cases = {
      {"router HTTP",
       [](int p) {
         return std::vector<std::string>{Bin("pdserve-router"), "--port", std::to_string(p), "--control",
                                         "tcp://127.0.0.1:*"};
       },
       "(HTTP): address in use"},
      {"router control",
       [](int p) {
         return std::vector<std::string>{Bin("pdserve-router"), "--port", "0", "--control",
                                         "tcp://127.0.0.1:" + std::to_string(p)};
       },
       "Address already in use"},
      {"router request API",
       [](int p) {
         return std::vector<std::string>{Bin("pdserve-router"), "--port", "0", "--control", "tcp://127.0.0.1:*",
                                         "--request-endpoint", "tcp://127.0.0.1:" + std::to_string(p)};
       },
       "Address already in use"},
      {"echo worker metrics",
       [](int p) {
         return std::vector<std::string>{Bin("pdserve-echo-worker"), "--router", "tcp://127.0.0.1:1",
                                         "--metrics-port", std::to_string(p)};
       },
       "address in use"},
      {"engine worker metrics",
       [](int p) {
         return std::vector<std::string>{Bin("pdserve-colocated"), "--router", "tcp://127.0.0.1:1", "--model",
                                         services::testing::CachedTestModel(PDSERVE_BIN_DIR, "tiny", 128815, 3),
                                         "--threads", "1", "--kv-gib", "0.0625", "--metrics-port", std::to_string(p)};
       },
       "address in use"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    HeldPort held;
    auto child = ChildProcess::Spawn(c.argv(held.port()), dir + "/" + std::to_string(held.port()) + ".log");
    ASSERT_TRUE(child.ok());
    const auto status = (*child)->WaitExit(60s);
    ASSERT_TRUE(status.has_value()) << "it kept running on a port another process owns:\n" << (*child)->Log();
    EXPECT_NE(*status, 0);
    EXPECT_NE((*child)->Log().find(c.says), std::string::npos) << (*child)->Log();
  }
  // And two routers on one HTTP port: the second refuses instead of splitting the traffic.
  const int port = services::testing::FreeTcpPort();
  auto first = ChildProcess::Spawn({Bin("pdserve-router"), "--port", std::to_string(port), "--control",
                                    "tcp://127.0.0.1:*", "--ready-file", dir + "/first.ready"},
                                   dir + "/first.log");
  ASSERT_TRUE(first.ok());
  ASSERT_TRUE(services::testing::WaitForReadyFile(dir + "/first.ready", first->get(), 30s).ok());
  auto second = ChildProcess::Spawn({Bin("pdserve-router"), "--port", std::to_string(port), "--control",
                                     "tcp://127.0.0.1:*"},
                                    dir + "/second.log");
  ASSERT_TRUE(second.ok());
  EXPECT_EQ((*second)->WaitExit(30s), std::optional<int>(1)) << (*second)->Log();
  EXPECT_NE((*second)->Log().find("address in use"), std::string::npos) << (*second)->Log();
  EXPECT_TRUE((*first)->Running());
}

}  // namespace
}  // namespace pdserve::operator_test
