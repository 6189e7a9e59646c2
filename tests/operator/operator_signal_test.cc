// Start/stop races: every service, signalled (SIGTERM or SIGINT) at 0-500 ms after it was
// started, 100 runs each, must exit cleanly within a deadline and leave no process behind. The
// router used to hang for ever when the signal came in its first ~0.3 s (its HTTP listener
// thread had not yet entered its loop when stop() was called).
//
// To add a service: a RaceTarget with the argv of one run (fresh ports each time).
#include <signal.h>

#include <algorithm>
#include <atomic>
#include <mutex>
#include <filesystem>
#include <random>
#include <thread>

#include <gtest/gtest.h>

#include "services/testing/child_process.h"
#include "tests/operator/operator_util.h"

namespace pdserve::operator_test {
namespace {

using namespace std::chrono_literals;
using services::testing::ChildProcess;
using services::testing::MakeTempDir;

constexpr int kRuns = 100;

struct RaceTarget {
  std::string name;
  std::function<std::vector<std::string>(const std::string& run_dir)> argv;
  std::vector<std::string> env;
};

// Runs kRuns starts of the target, each signalled after a delay spread over 0-500 ms (shuffled,
// so the early and late delays are interleaved), two at a time. Every run must exit within
// `deadline` of its signal with status 0 or 128 + the signal (interrupted start-up), and its
// whole process group must be gone.
void Race(const RaceTarget& target, std::chrono::milliseconds deadline) {
  std::vector<int> delays_ms(kRuns);
  for (int i = 0; i < kRuns; ++i) delays_ms[i] = i * 500 / (kRuns - 1);
  std::shuffle(delays_ms.begin(), delays_ms.end(), std::mt19937(7));
  const std::string dir = MakeTempDir("pdserve-race-" + target.name);
  int hangs = 0, bad_status = 0;
  std::mutex mu;
  auto one = [&](int i) {
    const std::string run_dir = dir + "/run-" + std::to_string(i);
    std::filesystem::create_directories(run_dir);
    auto child = ChildProcess::Spawn(target.argv(run_dir), run_dir + "/log", target.env);
    if (!child.ok()) {
      std::lock_guard<std::mutex> lock(mu);
      ADD_FAILURE() << child.status().ToString();
      return;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(delays_ms[i]));
    const int sig = i % 2 == 0 ? SIGTERM : SIGINT;
    (*child)->Signal(sig);
    const auto status = (*child)->WaitExit(deadline);
    std::lock_guard<std::mutex> lock(mu);
    if (!status) {
      ++hangs;
      ADD_FAILURE() << target.name << " run " << i << " (signal " << sig << " after " << delays_ms[i]
                    << " ms) did not exit within " << deadline.count() << " ms:\n" << (*child)->Log();
    } else if (*status != 0 && *status != 128 + sig) {
      ++bad_status;
      ADD_FAILURE() << target.name << " run " << i << " (signal " << sig << " after " << delays_ms[i]
                    << " ms) exited with status " << *status << ":\n" << (*child)->Log();
    }
    // Nothing of its process group survives (a launcher's children, a worker's threads).
    EXPECT_NE(kill(-(*child)->pid(), 0), 0) << target.name << " run " << i << " left processes behind";
  };
  for (int i = 0; i < kRuns; i += 2) {
    std::thread a([&, i] { one(i); });
    std::thread b([&, i] { one(i + 1); });
    a.join();
    b.join();
  }
  ::testing::Test::RecordProperty("hangs", hangs);
  EXPECT_EQ(hangs, 0);
  EXPECT_EQ(bad_status, 0);
}

TEST(OperatorSignalTest, Router) {
  Race({"router",
        [](const std::string&) {
          return std::vector<std::string>{Bin("pdserve-router"), "--port", "0", "--control", "tcp://127.0.0.1:*",
                                          "--request-endpoint", "tcp://127.0.0.1:*", "--log-level", "warn"};
        },
        {}},
       10s);
}

TEST(OperatorSignalTest, EchoWorker) {
  Race({"echo",
        [](const std::string&) {
          // Its router is not running: a signal must stop the registration retries too.
          return std::vector<std::string>{Bin("pdserve-echo-worker"), "--router",
                                          "tcp://127.0.0.1:" + std::to_string(services::testing::FreeTcpPort()),
                                          "--log-level", "warn"};
        },
        {}},
       15s);
}

TEST(OperatorSignalTest, EngineWorker) {
  const std::string model = services::testing::CachedTestModel(PDSERVE_BIN_DIR, "tiny", 128815, 3);
  ASSERT_FALSE(model.empty());
  // A live router, so that late signals land on a registered worker that must drain first.
  const std::string dir = MakeTempDir("pdserve-race-engine-router");
  const int control = services::testing::FreeTcpPort();
  const std::string endpoint = "tcp://127.0.0.1:" + std::to_string(control);
  auto router = ChildProcess::Spawn({Bin("pdserve-router"), "--port", "0", "--control", endpoint, "--ready-file",
                                     dir + "/router.ready", "--log-level", "warn"},
                                    dir + "/router.log");
  ASSERT_TRUE(router.ok());
  ASSERT_TRUE(services::testing::WaitForReadyFile(dir + "/router.ready", router->get(), 30s).ok());
  std::atomic<int> id{0};
  Race({"colocated",
        [&](const std::string&) {
          return std::vector<std::string>{Bin("pdserve-colocated"), "--router", endpoint, "--worker-id",
                                          "race-" + std::to_string(id++), "--model", model, "--threads", "1",
                                          "--kv-gib", "0.0625", "--log-level", "warn"};
        },
        {}},
       30s);
}

// Prefill and decode workers also bring up the UCX transport (and decode its KV region and
// receiver thread): a signal at any moment of that must end them as cleanly.
void RaceKvWorker(const std::string& binary) {
  if (!std::filesystem::exists("/sys/class/net"))
    GTEST_SKIP() << "SKIPPED LOUDLY: no /sys/class/net here, so UCX tcp has no device for " << binary;
  const std::string model = services::testing::CachedTestModel(PDSERVE_BIN_DIR, "tiny", 128815, 3);
  ASSERT_FALSE(model.empty());
  const std::string dir = MakeTempDir("pdserve-race-kv-router");
  const std::string endpoint = "tcp://127.0.0.1:" + std::to_string(services::testing::FreeTcpPort());
  auto router = ChildProcess::Spawn({Bin("pdserve-router"), "--port", "0", "--control", endpoint, "--ready-file",
                                     dir + "/router.ready", "--log-level", "warn"},
                                    dir + "/router.log");
  ASSERT_TRUE(router.ok());
  ASSERT_TRUE(services::testing::WaitForReadyFile(dir + "/router.ready", router->get(), 30s).ok());
  std::atomic<int> id{0};
  Race({binary,
        [&](const std::string&) {
          return std::vector<std::string>{Bin(binary), "--router", endpoint, "--worker-id",
                                          binary + "-" + std::to_string(id++), "--model", model, "--threads", "1",
                                          "--kv-gib", "0.0625", "--log-level", "warn"};
        },
        {"UCX_TLS=tcp", "UCX_NET_DEVICES=lo"}},
       30s);
}

TEST(OperatorSignalTest, PrefillWorker) { RaceKvWorker("pdserve-prefill"); }
TEST(OperatorSignalTest, DecodeWorker) { RaceKvWorker("pdserve-decode"); }

TEST(OperatorSignalTest, Launcher) {
  Race({"launch",
        [](const std::string& run_dir) {
          const int control = services::testing::FreeTcpPort();
          WriteFile(run_dir + "/cluster.yaml",
                    "cluster:\n  bin_dir: " + std::string(PDSERVE_BIN_DIR) +
                        "\n  stop_grace_ms: 5000\nrouter:\n  port: 0\n  control_endpoint: tcp://127.0.0.1:" +
                        std::to_string(control) + "\nworkers:\n  - {name: c, role: colocated, type: echo}\n");
          return std::vector<std::string>{Bin("pdserve-launch"), run_dir + "/cluster.yaml"};
        },
        {"PDSERVE_LOG_LEVEL=warn"}},
       30s);
}

}  // namespace
}  // namespace pdserve::operator_test
