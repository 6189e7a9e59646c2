// Multi-process KV transfer tests: a decode process and 1-4 prefill processes
// (kv_transfer_peer) talk over real UCX endpoints, with UCX_TLS=tcp (loopback) and
// UCX_TLS=shm. Byte-exact checks over random layouts, block sizes and lengths; context-
// parallel and replicated prefill sides; failure injection (killed peers, bad descriptors, a
// stalled peer, torn transfers). Every wait has a deadline; children are killed on failure.
#include <signal.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <filesystem>

#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <thread>

#include "services/testing/child_process.h"

namespace pdserve::kvtransfer::testing {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;
using services::testing::ChildProcess;

// Waits until the kernel reports `pid` stopped (state 'T' in /proc/<pid>/stat): SIGSTOP is
// asynchronous, and a fault test must know its fault is in place before it goes on.
bool WaitStopped(pid_t pid, std::chrono::milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  while (Clock::now() < deadline) {
    std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
    std::string stat;
    std::getline(in, stat);
    const size_t paren = stat.rfind(')');  // the state follows the command name
    if (paren != std::string::npos && paren + 2 < stat.size() && stat[paren + 2] == 'T') return true;
    std::this_thread::sleep_for(1ms);
  }
  return false;
}

std::map<std::string, std::string> Fields(const std::string& line) {
  std::map<std::string, std::string> out;
  std::istringstream in(line);
  std::string token;
  while (in >> token) {
    const size_t eq = token.find('=');
    if (eq != std::string::npos) out[token.substr(0, eq)] = token.substr(eq + 1);
  }
  return out;
}

std::vector<std::map<std::string, std::string>> Results(const ChildProcess& child,
                                                        const std::string& prefix = "RESULT") {
  std::vector<std::map<std::string, std::string>> out;
  for (const std::string& line : child.lines()) {
    if (line.rfind(prefix, 0) == 0) out.push_back(Fields(line));
  }
  return out;
}

std::string Dump(const ChildProcess& child) {
  std::string out;
  for (const std::string& line : child.lines()) out += "  | " + line + "\n";
  return out;
}

class KvTransferMpTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    // UCX's tcp transport enumerates interfaces through /sys/class/net; a root without sysfs
    // (a bare chroot) has no usable tcp device at all.
    if (GetParam() == "tcp" && !std::filesystem::exists("/sys/class/net"))
      GTEST_SKIP() << "no /sys/class/net here: UCX's tcp transport has no device to use";
  }

  std::vector<std::string> Env() const {
    const char* level = std::getenv("KVMP_LOG_LEVEL");  // e.g. "debug" when investigating
    std::vector<std::string> env = {std::string("PDSERVE_LOG_LEVEL=") + (level ? level : "warn")};
    if (GetParam() == "tcp") {
      env.push_back("UCX_TLS=tcp");
      env.push_back("UCX_NET_DEVICES=lo");
    } else {
      env.push_back("UCX_TLS=shm");
    }
    return env;
  }

  // A fresh ZeroMQ ipc endpoint; its socket file is removed when the test ends (a killed
  // decode process cannot remove it itself).
  std::string NewControlEndpoint() {
    static std::atomic<int> counter{0};
    const char* tmp = std::getenv("TMPDIR");
    const std::string path = std::string(tmp ? tmp : "/tmp") + "/pdserve-kvmp-" +
                             std::to_string(getpid()) + "-" + std::to_string(counter++) + ".ipc";
    ipc_files_.push_back(path);
    return "ipc://" + path;
  }

  void TearDown() override {
    for (const std::string& path : ipc_files_) std::filesystem::remove(path);
  }

  std::vector<std::string> ipc_files_;

  std::unique_ptr<ChildProcess> Spawn(std::vector<std::string> args) {
    args.insert(args.begin(), KV_PEER_PATH);
    auto child = ChildProcess::SpawnPiped(args, Env());
    EXPECT_TRUE(child.ok()) << child.status().ToString();
    return child.ok() ? std::move(child).value() : nullptr;
  }

  // Starts the decode process and waits until it serves descriptors.
  std::unique_ptr<ChildProcess> StartDecode(const std::string& control,
                                            std::vector<std::string> extra) {
    std::vector<std::string> args = {"--role=decode", "--control=" + control};
    args.insert(args.end(), extra.begin(), extra.end());
    auto decode = Spawn(args);
    if (decode == nullptr) return nullptr;
    auto ready = decode->WaitForLine("READY", Clock::now() + 20s);
    EXPECT_TRUE(ready.ok()) << ready.status().ToString() << "\n" << Dump(*decode);
    return decode;
  }

  std::unique_ptr<ChildProcess> StartPrefill(const std::string& control, uint32_t rank,
                                             std::vector<std::string> extra) {
    std::vector<std::string> args = {"--role=prefill", "--control=" + control,
                                     "--rank=" + std::to_string(rank)};
    args.insert(args.end(), extra.begin(), extra.end());
    return Spawn(args);
  }

  static void ExpectExit0(ChildProcess& child, std::chrono::seconds within) {
    const std::optional<int> code = child.WaitExit(within);
    ASSERT_TRUE(code.has_value()) << "still running after " << within.count() << " s\n" << Dump(child);
    EXPECT_EQ(*code, 0) << Dump(child);
  }

  static void ExpectAllBlocksBack(const ChildProcess& decode) {
    auto finals = Results(decode, "FINAL");
    ASSERT_EQ(finals.size(), 1u) << Dump(decode);
    EXPECT_EQ(finals[0]["free"], finals[0]["total"]) << Dump(decode);
    EXPECT_EQ(finals[0]["held"], "0");
    EXPECT_EQ(finals[0]["idle"], "1");
    ASSERT_EQ(decode.lines().back(), "REGIONS 0") << Dump(decode);
  }

  // A run in which every request must arrive byte-exact.
  void RunGoodTransfers(uint64_t seed, uint32_t requests, uint32_t cp, bool replicated,
                        const std::string& write_protocol = "auto") {
    const std::string control = NewControlEndpoint();
    std::vector<std::string> common = {"--seed=" + std::to_string(seed),
                                       "--requests=" + std::to_string(requests),
                                       "--cp=" + std::to_string(cp),
                                       "--write_protocol=" + write_protocol};
    if (replicated) common.push_back("--mode=replicated");
    auto decode = StartDecode(control, common);
    ASSERT_NE(decode, nullptr);
    std::vector<std::unique_ptr<ChildProcess>> prefills;
    for (uint32_t r = 0; r < cp; ++r) prefills.push_back(StartPrefill(control, r, common));
    for (auto& p : prefills) {
      ASSERT_NE(p, nullptr);
      ExpectExit0(*p, 60s);
    }
    ExpectExit0(*decode, 30s);
    auto results = Results(*decode);
    ASSERT_EQ(results.size(), requests) << Dump(*decode);
    for (auto& r : results) {
      EXPECT_EQ(r["state"], "complete") << Dump(*decode);
      EXPECT_EQ(r["check"], "exact") << Dump(*decode);
    }
    for (uint32_t rank = 0; rank < cp; ++rank) {
      auto sent = Results(*prefills[rank]);
      ASSERT_EQ(sent.size(), requests) << Dump(*prefills[rank]);
      for (auto& s : sent) {
        EXPECT_EQ(s["code"], "OK") << Dump(*prefills[rank]);
        if (replicated && rank > 0) {
          EXPECT_EQ(s["bytes"], "0") << "a replica wrote";
        }
      }
    }
    ExpectAllBlocksBack(*decode);
  }
};

TEST_P(KvTransferMpTest, RandomLayoutsOneRank) {
  for (uint64_t seed : {11, 12}) RunGoodTransfers(seed, 4, 1, false);
}

// ucp_put_nbx on every transport (over tcp UCX emulates it; auto mode avoids that there).
TEST_P(KvTransferMpTest, RandomLayoutsWithUcpPut) { RunGoodTransfers(13, 4, 2, false, "put"); }

TEST_P(KvTransferMpTest, ContextParallelTwoRanks) { RunGoodTransfers(21, 4, 2, false); }

TEST_P(KvTransferMpTest, ContextParallelFourRanks) { RunGoodTransfers(31, 4, 4, false); }

TEST_P(KvTransferMpTest, ReplicatedRanksWriteOnce) { RunGoodTransfers(41, 2, 2, true); }

TEST_P(KvTransferMpTest, KilledPrefillFreesTheBlocks) {
  const std::string control = NewControlEndpoint();
  std::vector<std::string> common = {"--seed=51", "--requests=1", "--cp=1"};
  std::vector<std::string> decode_args = common;
  decode_args.push_back("--timeout_ms=1500");
  decode_args.push_back("--lease_ms=1500");
  auto decode = StartDecode(control, decode_args);
  ASSERT_NE(decode, nullptr);
  std::vector<std::string> prefill_args = common;
  prefill_args.push_back("--pause_after_first_layer");
  auto prefill = StartPrefill(control, 0, prefill_args);
  ASSERT_NE(prefill, nullptr);
  ASSERT_TRUE(prefill->WaitForLine("PAUSED", Clock::now() + 20s).ok()) << Dump(*prefill);
  prefill->Signal(SIGKILL);
  const auto killed = Clock::now();
  auto line = decode->WaitForLine("RESULT", killed + 30s);
  ASSERT_TRUE(line.ok()) << Dump(*decode);
  // Freed by the transfer deadline (1.5 s) or sooner, not by a much later timeout; the slack
  // is generous so a loaded machine does not fail the test, a missing deadline still does.
  EXPECT_LT(Clock::now() - killed, 1500ms + 6s);
  auto r = Fields(line.value());
  EXPECT_EQ(r["state"], "aborted");
  EXPECT_TRUE(r["code"] == "Unavailable" || r["code"] == "DeadlineExceeded") << line.value();
  ExpectExit0(*decode, 20s);
  ExpectAllBlocksBack(*decode);
}

TEST_P(KvTransferMpTest, KilledDecodeFailsThePrefillInTime) {
  const std::string control = NewControlEndpoint();
  std::vector<std::string> common = {"--seed=52", "--requests=1", "--cp=1"};
  std::vector<std::string> decode_args = common;
  decode_args.push_back("--timeout_ms=2000");
  auto decode = StartDecode(control, decode_args);
  ASSERT_NE(decode, nullptr);
  std::vector<std::string> prefill_args = common;
  prefill_args.push_back("--pause_after_first_layer");
  auto prefill = StartPrefill(control, 0, prefill_args);
  ASSERT_NE(prefill, nullptr);
  ASSERT_TRUE(prefill->WaitForLine("PAUSED", Clock::now() + 20s).ok()) << Dump(*prefill);
  decode->Signal(SIGKILL);
  ASSERT_TRUE(decode->WaitExit(10s).has_value());
  ASSERT_TRUE(prefill->WriteLine("go").ok());
  ExpectExit0(*prefill, 20s);
  auto results = Results(*prefill);
  ASSERT_EQ(results.size(), 1u) << Dump(*prefill);
  EXPECT_TRUE(results[0]["code"] == "Unavailable" || results[0]["code"] == "DeadlineExceeded")
      << Dump(*prefill);
  EXPECT_LT(std::stod(results[0]["ms"]), 2000 + 6000) << Dump(*prefill);  // the deadline, with load slack
  auto stats = Results(*prefill, "STATS");
  ASSERT_EQ(stats.size(), 1u);
  // Nothing in flight, no key or connection left to the dead peer, no request state.
  EXPECT_EQ(stats[0]["pending"], "0") << Dump(*prefill);
  EXPECT_EQ(stats[0]["inflight"], "0");
  EXPECT_EQ(stats[0]["remote_keys"], "0");
  EXPECT_EQ(stats[0]["peers"], "0");
  EXPECT_EQ(stats[0]["active"], "0");
}

TEST_P(KvTransferMpTest, DescriptorOutsideTheRegionIsRejectedBeforeAnyWrite) {
  const std::string control = NewControlEndpoint();
  std::vector<std::string> common = {"--seed=53", "--requests=2", "--cp=1"};
  std::vector<std::string> decode_args = common;
  decode_args.push_back("--fault=bad_descriptor");
  auto decode = StartDecode(control, decode_args);
  ASSERT_NE(decode, nullptr);
  auto prefill = StartPrefill(control, 0, common);
  ASSERT_NE(prefill, nullptr);
  ExpectExit0(*prefill, 30s);
  ExpectExit0(*decode, 30s);
  for (auto& r : Results(*prefill)) {
    EXPECT_EQ(r["code"], "InvalidArgument") << Dump(*prefill);
    EXPECT_EQ(r["stage"], "start");
  }
  auto results = Results(*decode);
  ASSERT_EQ(results.size(), 2u) << Dump(*decode);
  for (auto& r : results) {
    EXPECT_EQ(r["state"], "aborted");
    EXPECT_EQ(r["code"], "InvalidArgument");
    EXPECT_EQ(r["check"], "canary_ok") << Dump(*decode);
  }
  ExpectAllBlocksBack(*decode);
}

TEST_P(KvTransferMpTest, StalledDecodeHitsTheDeadlineOnBothSides) {
  const std::string control = NewControlEndpoint();
  std::vector<std::string> common = {"--seed=54", "--requests=1", "--cp=1"};
  std::vector<std::string> decode_args = common;
  decode_args.push_back("--timeout_ms=1000");
  auto decode = StartDecode(control, decode_args);
  ASSERT_NE(decode, nullptr);
  std::vector<std::string> prefill_args = common;
  prefill_args.push_back("--pause_after_first_layer");
  auto prefill = StartPrefill(control, 0, prefill_args);
  ASSERT_NE(prefill, nullptr);
  ASSERT_TRUE(prefill->WaitForLine("PAUSED", Clock::now() + 20s).ok()) << Dump(*prefill);
  decode->Signal(SIGSTOP);  // alive but unresponsive
  ASSERT_TRUE(WaitStopped(decode->pid(), 10s)) << "the decode process never stopped";
  ASSERT_TRUE(prefill->WriteLine("go").ok());
  auto line = prefill->WaitForLine("RESULT", Clock::now() + 30s);
  decode->Signal(SIGCONT);
  ASSERT_TRUE(line.ok()) << Dump(*prefill);
  auto r = Fields(line.value());
  EXPECT_TRUE(r["code"] == "DeadlineExceeded" || r["code"] == "Unavailable") << line.value();
  EXPECT_LT(std::stod(r["ms"]), 1000 + 6000) << line.value();  // the deadline, with load slack
  ExpectExit0(*prefill, 20s);
  ExpectExit0(*decode, 30s);
  // The last word on the request (a completion accepted just before the writer gave up is
  // turned into an abort when the writer's abort arrives: complete -> aborted).
  auto results = Results(*decode);
  ASSERT_GE(results.size(), 1u) << Dump(*decode);
  EXPECT_EQ(results.back()["state"], "aborted") << Dump(*decode);
  ExpectAllBlocksBack(*decode);
}

TEST_P(KvTransferMpTest, TornTransferIsDataLossOnBothSides) {
  const std::string control = NewControlEndpoint();
  std::vector<std::string> common = {"--seed=55", "--requests=2", "--cp=1"};
  auto decode = StartDecode(control, common);
  ASSERT_NE(decode, nullptr);
  std::vector<std::string> prefill_args = common;
  prefill_args.push_back("--fault=torn");
  auto prefill = StartPrefill(control, 0, prefill_args);
  ASSERT_NE(prefill, nullptr);
  ExpectExit0(*prefill, 30s);
  ExpectExit0(*decode, 30s);
  for (auto& r : Results(*prefill)) EXPECT_EQ(r["code"], "DataLoss") << Dump(*prefill);
  auto results = Results(*decode);
  ASSERT_EQ(results.size(), 2u) << Dump(*decode);
  for (auto& r : results) {
    EXPECT_EQ(r["state"], "aborted");
    EXPECT_EQ(r["code"], "DataLoss");
  }
  EXPECT_EQ(Results(*decode, "FINAL")[0]["digest_failures"], "2");
  ExpectAllBlocksBack(*decode);
}

INSTANTIATE_TEST_SUITE_P(Ucx, KvTransferMpTest, ::testing::Values("tcp", "shm"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace pdserve::kvtransfer::testing
