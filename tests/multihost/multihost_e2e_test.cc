// The cluster across hosts (docs/deploy.md "Many hosts"): network namespaces on a bridge stand
// for machines (services/testing/netns_hosts.h: each its own loopback and address, real TCP
// between distinct addresses), pdserve-launch places the router and the workers on them from
// an inventory, and requests come from the root namespace to the router's host. Every reply is
// compared with the single-process engine's greedy output.
//   * router on host A, a prefill worker on B, a decode worker on C: exact streams, /v1/workers
//     shows each worker at its host's address, the KV transfer crossed the B-C link over UCX
//     tcp on eth0, Ctrl-C (SIGINT to the launcher) stops every host's processes;
//   * 20 ms delay and 1% loss on the decode host's link (netem's job, done in user space by
//     ImpairedLink: this kernel has no sch_netem): every request still completes exactly; the
//     TTFT it costs is printed;
//   * a decode host's link cut mid-stream (ip link set down): its streams migrate exactly, no
//     KV block stays used anywhere, the host rejoins after the heal and serves exactly, and no
//     stale token of the cut worker reaches a client;
//   * the router unreachable from a decode host past the heartbeat timeout, healed while the
//     moved streams still run: the cut worker's late output is dropped, no duplicate tokens;
//   * the same link cut while long prompts' KV is streaming to it: the transfers fail, the
//     requests are placed again and complete exactly, the reservations come back;
//   * a CP=2 prefill instance over hosts B+C and a DP=2 (EP=2) decode instance over D+E, each
//     run by mpirun through the launch agent: exact streams, each DP rank registered at its own
//     host's address; then host E's processes killed mid-stream (a rank lost inside the
//     instance's collectives): the instance ends, its streams move to the spare decode worker
//     on F and complete exactly, nothing hangs, and the launcher brings the instance back;
//     Ctrl-C stops both instances through their mpirun (SIGUSR1, forwarded to every rank), with
//     nothing left on any host.
//
// These tests need root (network namespaces); elsewhere they SKIP with the reason. To add a
// case: make the hosts with MakeHostsOrSkip, write a topology with Topology(), Launch it, then
// drive requests with StreamAll / StreamWithFault and check the replies with ExpectExact.
#include <signal.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <functional>
#include <thread>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "common/mapped_file.h"
#include "services/testing/child_process.h"
#include "services/testing/cluster_fixture.h"
#include "services/testing/http_test_client.h"
#include "services/testing/impaired_link.h"
#include "services/testing/netns_hosts.h"
#include "services/testing/worker_test_cluster.h"

namespace pdserve::multihost {
namespace {

using namespace std::chrono_literals;
using nlohmann::json;
using router::testing::MetricValue;
using services::testing::ChildProcess;
using services::testing::HttpGet;
using services::testing::HttpPostSse;
using services::testing::NetnsHosts;
using services::testing::WaitFor;
using namespace services::worker::e2e;  // NOLINT: the shared e2e helpers (prompts, reference)
using Clock = std::chrono::steady_clock;

const std::string kBin = PDSERVE_BIN_DIR;
const std::string kScript = std::string(PDSERVE_SOURCE_DIR) + "/scripts/netns_hosts.sh";

// The worker settings of every test: one compute thread, a small KV pool, short leases, KV
// over UCX tcp only (between namespaces UCX would otherwise find shared memory, which real
// hosts do not share).
std::string WorkerArgs(int lease_ms = 4000) {
  return "[--threads, '1', --kv-gib, '0.0625', --kv-lease-ms, '" + std::to_string(lease_ms) +
         "', --kv-transfer-timeout-ms, '4000', --register-retry-ms, '50', --ucx-tls, tcp]";
}
const std::string kWorkerArgs = WorkerArgs();

// A pdserve-launch cluster over a bed of namespace hosts.
class HostCluster {
 public:
  ~HostCluster() {
    // The launcher first (it stops its processes on every host), then the bed (whatever is left).
    if (launcher_ && launcher_->Running()) {
      launcher_->Signal(SIGINT);
      launcher_->WaitExit(20s);
    }
    launcher_.reset();
    hosts_.reset();
  }
  // Makes `n` hosts. Unavailable: namespaces cannot be made here (the caller skips).
  Status MakeHosts(int n) {
    PDSERVE_ASSIGN_OR_RETURN(hosts_, NetnsHosts::Create(kScript, n));
    dir_ = services::testing::MakeTempDir("multihost");
    return Status::Ok();
  }
  NetnsHosts& hosts() { return *hosts_; }
  const std::string& dir() const { return dir_; }  // removed when the test process exits
  // The YAML of hosts h0.. as names a, b, c, ... (run through `ip netns exec`), with the router on
  // a and `workers` (a YAML list) placed by name.
  std::string Topology(const std::string& workers) const {
    std::string y = "cluster:\n  name: multihost\n  bin_dir: " + kBin + "\n  model_dir: " + ModelDir() +
                    "\n  generate_model: {enabled: false}\n  router_host: a\n  network: " + hosts_->subnet() +
                    "\n  stop_grace_ms: 6000\n  ready_timeout_ms: 120000\n"
                    "router:\n  host: 0.0.0.0\n  port: 0\n  control_endpoint: tcp://0.0.0.0:7000\n"
                    "  heartbeat_interval_ms: 200\n  heartbeat_timeout_ms: 1500\n  first_token_timeout_ms: 60000\n"
                    "hosts:\n";
    for (size_t i = 0; i < hosts_->hosts().size(); ++i)
      y += "  - {name: " + std::string(1, static_cast<char>('a' + i)) + ", address: " + hosts_->host(i).address +
           ", run: [ip, netns, exec, " + hosts_->host(i).netns + "]}\n";
    return y + "workers:\n" + workers;
  }
  // Starts pdserve-launch on `yaml` and waits for its ready file.
  Status Launch(const std::string& yaml, std::vector<std::string> env = {}) {
    const std::string path = dir_ + "/cluster.yaml";
    PDSERVE_RETURN_IF_ERROR(WriteStringToFile(path, yaml));
    ready_path_ = dir_ + "/launch.ready";
    env.push_back("PDSERVE_NUM_THREADS=1");
    PDSERVE_ASSIGN_OR_RETURN(launcher_, ChildProcess::Spawn({kBin + "/pdserve-launch", path, "--ready-file", ready_path_},
                                                            dir_ + "/launch.log", env));
    PDSERVE_ASSIGN_OR_RETURN(ready_, services::testing::WaitForReadyFile(ready_path_, launcher_.get(), 180s));
    http_host_ = ready_["http_host"].get<std::string>();
    http_port_ = ready_["http_port"].get<int>();
    return Status::Ok();
  }
  const std::string& http_host() const { return http_host_; }
  int http_port() const { return http_port_; }
  const json& ready() const { return ready_; }
  ChildProcess* launcher() { return launcher_.get(); }
  std::string Log() const { return launcher_ ? launcher_->Log() : std::string("(no launcher)"); }

  // /v1/workers entries by id.
  std::map<std::string, json> Workers() {
    std::map<std::string, json> out;
    const json view = json::parse(HttpGet(http_host_, http_port_, "/v1/workers", 5s).body, nullptr, false);
    if (view.is_discarded() || !view.contains("data")) return out;
    for (const json& w : view["data"]) out[w["id"].get<std::string>()] = w;
    return out;
  }
  bool WaitForWorkers(size_t n, std::chrono::milliseconds timeout) {
    return WaitFor([&] { return Workers().size() == n; }, timeout, 100ms);
  }
  // A worker's /metrics, read from the root namespace at the address it registered.
  std::string WorkerMetrics(const std::string& id) {
    auto all = Workers();
    if (!all.count(id)) return "";
    const std::string addr = all[id]["address"]["metrics"].get<std::string>();
    const size_t colon = addr.rfind(':');
    return HttpGet(addr.substr(0, colon), std::stoi(addr.substr(colon + 1)), "/metrics", 5s).body;
  }
  bool NoBlocksUsed(const std::string& id, std::chrono::milliseconds timeout) {
    return WaitFor(
        [&] {
          const std::string m = WorkerMetrics(id);
          return !m.empty() && MetricValue(m, "pdserve_worker_kv_blocks", "used") == 0;
        },
        timeout, 100ms);
  }
  double RouterMetric(const std::string& name, const std::string& label = "") {
    return MetricValue(HttpGet(http_host_, http_port_, "/metrics", 5s).body, name, label);
  }
  bool RouterIdle() {
    return WaitFor(
        [&] {
          const std::string m = HttpGet(http_host_, http_port_, "/metrics", 5s).body;
          return MetricValue(m, "pdserve_router_running_requests") == 0 &&
                 MetricValue(m, "pdserve_router_waiting_requests") == 0;
        },
        15s, 50ms);
  }

 private:
  std::unique_ptr<NetnsHosts> hosts_;
  std::string dir_;
  std::string ready_path_;
  std::unique_ptr<ChildProcess> launcher_;
  json ready_;
  std::string http_host_;
  int http_port_ = 0;
};

// Makes the hosts, or skips the test saying why (never silently).
#define MAKE_HOSTS_OR_SKIP(cluster, n)                                                                       \
  do {                                                                                                       \
    const Status made_ = (cluster).MakeHosts(n);                                                             \
    if (made_.code() == StatusCode::kUnavailable) {                                                          \
      std::fprintf(stderr, "*** MULTIHOST TEST SKIPPED: %s\n", made_.message().c_str());                    \
      GTEST_SKIP() << "MULTIHOST TEST SKIPPED: cannot make network-namespace hosts here: " << made_.message(); \
    }                                                                                                        \
    ASSERT_TRUE(made_.ok()) << made_.ToString();                                                             \
  } while (0)

struct StreamRun {
  std::vector<Streamed> got;
  std::vector<double> ttft_s;  // first event's arrival, per request
  int ended_before_fault = 0;
};

// Streams requests Prompt(first + k), k < n, at once from this (the root) namespace; once every
// stream has `events_before` events, runs `fault` (if any).
StreamRun StreamWithFault(HostCluster& c, int first, int n, int max_tokens, int events_before,
                    const std::function<void()>& fault) {
  StreamRun run;
  run.got.resize(n);
  run.ttft_s.assign(n, -1);
  std::vector<std::atomic<int>> events(n);
  std::vector<std::thread> threads;
  for (int k = 0; k < n; ++k)
    threads.emplace_back([&, k] {
      auto r = HttpPostSse(c.http_host(), c.http_port(), "/v1/completions", Body(Prompt(first + k), max_tokens, true),
                           120s, [&](const std::string&) {
                             events[k].fetch_add(1);
                             return true;
                           });
      events[k].store(1 << 20);
      if (!r.arrival_seconds.empty()) run.ttft_s[k] = r.arrival_seconds.front();
      run.got[k] = Collect(r);
    });
  if (fault) {
    const bool streaming = WaitFor(
        [&] {
          for (auto& e : events)
            if (e.load() < events_before) return false;
          return true;
        },
        60s, 5ms);
    EXPECT_TRUE(streaming) << "not every stream reached " << events_before << " events; the fault came anyway";
    for (auto& e : events) run.ended_before_fault += e.load() >= (1 << 20);
    fault();
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(run.ended_before_fault, 0) << "streams ended before the fault; raise max_tokens";
  return run;
}

void ExpectExact(const StreamRun& run, int first, int max_tokens) {
  for (size_t k = 0; k < run.got.size(); ++k) {
    const auto prompt = Prompt(first + static_cast<int>(k));
    EXPECT_FALSE(run.got[k].error) << "request " << k << ": " << run.got[k].error_message;
    EXPECT_EQ(run.got[k].text, Text(Reference(prompt, max_tokens))) << "request " << k;
    ASSERT_FALSE(run.got[k].usage.is_null()) << "request " << k;
    EXPECT_EQ(run.got[k].usage["completion_tokens"].get<int>(), max_tokens) << k;
    EXPECT_EQ(run.got[k].usage["prompt_tokens"].get<int>(), static_cast<int>(prompt.size())) << k;
  }
}

// The address part of "HOST:PORT".
std::string HostOf(const std::string& host_port) { return host_port.substr(0, host_port.rfind(':')); }

TEST(MultiHostTest, RouterPrefillAndDecodeOnThreeHosts) {
  HostCluster c;
  MAKE_HOSTS_OR_SKIP(c, 3);
  NetnsHosts& h = c.hosts();
  const std::string workers = std::string("  - {name: prefill, role: prefill, host: b, args: ") + kWorkerArgs +
                              "}\n  - {name: decode, role: decode, host: c, args: " + kWorkerArgs + "}\n";
  ASSERT_TRUE(c.Launch(c.Topology(workers)).ok()) << c.Log();
  // The API is at host A's address, reached from the root namespace.
  EXPECT_EQ(c.http_host(), h.host(0).address);
  EXPECT_EQ(c.ready()["control_endpoint"], "tcp://" + h.host(0).address + ":7000");
  EXPECT_EQ(c.ready()["instances"]["decode-0"]["hosts"], json::array({"c"}));
  ASSERT_TRUE(c.WaitForWorkers(2, 30s)) << c.Log();

  // /v1/workers shows every worker at its own host's address.
  auto view = c.Workers();
  EXPECT_EQ(HostOf(view["prefill-0"]["address"]["metrics"].get<std::string>()), h.host(1).address);
  EXPECT_EQ(HostOf(view["decode-0"]["address"]["metrics"].get<std::string>()), h.host(2).address);
  EXPECT_TRUE(view["decode-0"]["address"]["transfer"].get<bool>());

  // The link between B and C carries the KV transfer: count the bytes B's link sends.
  auto tx_bytes = [&](size_t i) {
    auto text = ReadFileToString("/sys/class/net/" + h.LinkOf(i) + "/statistics/rx_bytes");
    return text.ok() ? std::stoll(text.value()) : -1;
  };
  const long long b_before = tx_bytes(1);
  constexpr int kN = 8, kMax = 12;
  const StreamRun run = StreamWithFault(c, 0, kN, kMax, 0, nullptr);
  ExpectExact(run, 0, kMax);
  const long long b_sent = tx_bytes(1) - b_before;
  const std::string decode_metrics = c.WorkerMetrics("decode-0");
  const double kv_bytes = MetricValue(decode_metrics, "pdserve_worker_kv_transfer_bytes_total");
  EXPECT_EQ(MetricValue(decode_metrics, "pdserve_worker_kv_transfers_total", "ok"), kN) << decode_metrics;
  EXPECT_GT(kv_bytes, 0);
  EXPECT_GE(static_cast<double>(b_sent), kv_bytes) << "the KV bytes did not leave host B over its link";
  // UCX ran on the inter-host interface (--network resolved to eth0 on each host).
  EXPECT_NE(c.Log().find("UCX on eth0"), std::string::npos) << c.Log();
  EXPECT_TRUE(c.RouterIdle());
  EXPECT_TRUE(c.NoBlocksUsed("decode-0", 10s));

  // Ctrl-C stops every host's processes.
  c.launcher()->Signal(SIGINT);
  const auto code = c.launcher()->WaitExit(30s);
  ASSERT_TRUE(code.has_value()) << c.Log();
  EXPECT_EQ(*code, 0) << c.Log();
  for (size_t i = 0; i < 3; ++i) {
    auto pids = NetnsHosts::Run({"ip", "netns", "pids", h.host(i).netns});
    ASSERT_TRUE(pids.ok());
    EXPECT_EQ(pids.value(), "") << "processes left on host " << i;
  }
  if (HasFailure()) ADD_FAILURE() << c.Log();
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? -1 : v[v.size() / 2];
}

TEST(MultiHostTest, DelayAndLossOnTheDecodeLinkCostTimeNotExactness) {
  HostCluster c;
  MAKE_HOSTS_OR_SKIP(c, 3);
  const std::string workers = std::string("  - {name: prefill, role: prefill, host: b, args: ") + kWorkerArgs +
                              "}\n  - {name: decode, role: decode, host: c, args: " + kWorkerArgs + "}\n";
  ASSERT_TRUE(c.Launch(c.Topology(workers)).ok()) << c.Log();
  ASSERT_TRUE(c.WaitForWorkers(2, 30s)) << c.Log();
  constexpr int kN = 8, kMax = 16;
  for (int k = 0; k < kN; ++k) {
    Reference(Prompt(200 + k), kMax);
    Reference(Prompt(300 + k), kMax);
  }
  // One request at a time, so TTFT is the path's latency, not queueing.
  auto one_by_one = [&](int first) {
    StreamRun all;
    for (int k = 0; k < kN; ++k) {
      StreamRun one = StreamWithFault(c, first + k, 1, kMax, 0, nullptr);
      all.got.push_back(one.got[0]);
      all.ttft_s.push_back(one.ttft_s[0]);
    }
    return all;
  };
  const StreamRun clean = one_by_one(200);
  ExpectExact(clean, 200, kMax);

  services::testing::ImpairedLink::Options o;
  o.delay = 20ms;
  o.loss = 0.01;
  auto link = services::testing::ImpairedLink::Insert(&c.hosts(), 2, o);
  ASSERT_TRUE(link.ok()) << link.status().ToString();
  const StreamRun slow = one_by_one(300);
  ExpectExact(slow, 300, kMax);
  const auto counters = (*link)->counters();
  EXPECT_GT(counters.forwarded, 100u) << "the decode host's traffic did not cross the impaired link";
  const double ttft_clean = Median(clean.ttft_s), ttft_slow = Median(slow.ttft_s);
  std::printf("[multihost] TTFT median over %d requests: %.1f ms clean, %.1f ms with 20 ms delay + 1%% loss each way "
              "on the decode host's link (+%.1f ms); relay forwarded %llu frames, dropped %llu\n",
              kN, ttft_clean * 1e3, ttft_slow * 1e3, (ttft_slow - ttft_clean) * 1e3,
              static_cast<unsigned long long>(counters.forwarded), static_cast<unsigned long long>(counters.dropped));
  RecordProperty("ttft_clean_ms", std::to_string(ttft_clean * 1e3));
  RecordProperty("ttft_impaired_ms", std::to_string(ttft_slow * 1e3));
  // The router reaches the decode worker and the prefill writes to it across the delay: at
  // least one round trip (40 ms) more before the first token.
  EXPECT_GT(ttft_slow, ttft_clean + 0.035);
  link->reset();
  EXPECT_TRUE(c.RouterIdle());
  for (const char* id : {"decode-0", "prefill-0"}) EXPECT_TRUE(c.NoBlocksUsed(id, 10s)) << id;
  if (HasFailure()) ADD_FAILURE() << c.Log();
}

TEST(MultiHostTest, DecodeHostCutOffMidTransferRetriesExactly) {
  HostCluster c;
  MAKE_HOSTS_OR_SKIP(c, 4);
  NetnsHosts& h = c.hosts();
  // The prefill worker finishes transfers one at a time: the one stuck on the cut host holds
  // the others back until its deadline (4 s), so the decode side's leases must outlast that.
  const std::string workers = "  - {name: prefill, role: prefill, host: b, args: " + WorkerArgs(20000) +
                              "}\n  - {name: decode, role: decode, count: 2, hosts: [c, d], args: " +
                              WorkerArgs(20000) + "}\n";
  ASSERT_TRUE(c.Launch(c.Topology(workers)).ok()) << c.Log();
  ASSERT_TRUE(c.WaitForWorkers(3, 30s)) << c.Log();
  // Prompts long enough that each prefill (and the KV it streams layer by layer) takes a while;
  // they keep arriving, so the cut finds transfers to host D under way.
  constexpr int kN = 8, kMax = 6;
  std::vector<std::vector<int32_t>> prompts;
  for (int k = 0; k < kN; ++k) prompts.push_back(LongPrompt(800 + k, 400));
  for (const auto& p : prompts) Reference(p, kMax);
  std::vector<Streamed> got(kN);
  std::vector<std::thread> threads;
  for (int k = 0; k < kN; ++k)
    threads.emplace_back([&, k] {
      std::this_thread::sleep_for(std::chrono::milliseconds(20 * k));
      got[k] = Collect(
          HttpPostSse(c.http_host(), c.http_port(), "/v1/completions", Body(prompts[k], kMax, true), 120s));
    });
  // Cut D once the prefill worker is computing a prompt whose KV goes to D (both have one
  // outstanding in the router's view).
  const bool busy = WaitFor(
      [&] {
        auto w = c.Workers();
        return w.count("prefill-0") && w.count("decode-1") &&
               w["prefill-0"]["load"]["outstanding_requests"].get<int64_t>() > 0 &&
               w["decode-1"]["load"]["outstanding_requests"].get<int64_t>() > 0;
      },
      30s, 2ms);
  ASSERT_TRUE(h.SetLinkUp(3, false).ok());
  for (auto& t : threads) t.join();
  ASSERT_TRUE(busy) << "no transfer to host D was under way: the cut would prove nothing\n" << c.Log();
  for (int k = 0; k < kN; ++k) {
    EXPECT_FALSE(got[k].error) << "request " << k << ": " << got[k].error_message;
    EXPECT_EQ(got[k].text, Text(Reference(prompts[k], kMax))) << "request " << k;
  }
  const std::string pm = c.WorkerMetrics("prefill-0");
  EXPECT_GE(MetricValue(pm, "pdserve_worker_kv_transfers_total", "failed") +
                c.RouterMetric("pdserve_router_migrations_total", "outcome=\"migrated\",role=\"decode\"") +
                c.RouterMetric("pdserve_router_migrations_total", "outcome=\"migrated\",role=\"prefill\""),
            1)
      << "nothing was moved off host D";
  EXPECT_TRUE(c.RouterIdle());
  EXPECT_TRUE(c.NoBlocksUsed("decode-0", 15s));
  EXPECT_TRUE(c.NoBlocksUsed("prefill-0", 15s));
  ASSERT_TRUE(h.SetLinkUp(3, true).ok());
  ASSERT_TRUE(c.WaitForWorkers(3, 30s)) << c.Log();
  // D's reservations come back (lease expiry, quarantine) and it serves again.
  EXPECT_TRUE(c.NoBlocksUsed("decode-1", 20s)) << "the cut host kept its reserved blocks";
  const StreamRun after = StreamWithFault(c, 850, 6, 6, 0, nullptr);
  ExpectExact(after, 850, 6);
  if (HasFailure()) ADD_FAILURE() << c.Log();
}

// Hosts reached "over ssh": a stand-in `ssh` first in the launcher's PATH runs the remote command
// line with /bin/sh in the host's namespace (what sshd does on a real host), so the launcher's ssh
// command (options, target, `--`, the quoted `cd && exec env ... binary` line) is what runs.
// Without shared files the launcher finds the router by its fixed port, not its ready file.
TEST(MultiHostTest, HostsReachedOverSsh) {
  HostCluster c;
  MAKE_HOSTS_OR_SKIP(c, 3);
  NetnsHosts& h = c.hosts();
  const std::string bin = c.dir() + "/ssh-bin";
  std::filesystem::create_directories(bin);
  std::string table;
  for (size_t i = 0; i < 3; ++i) table += "    " + h.host(i).address + ") ns=" + h.host(i).netns + " ;;\n";
  ASSERT_TRUE(WriteStringToFile(bin + "/ssh",
                                "#!/bin/sh\n# A stand-in for ssh: [options] TARGET -- COMMAND-LINE\n"
                                "while [ $# -gt 0 ]; do case $1 in -o) shift 2 ;; -*) shift ;; *) break ;; esac; done\n"
                                "target=$1; shift; [ \"$1\" = -- ] && shift\n"
                                "case $target in\n" + table +
                                    "    *) echo \"ssh: no host $target\" >&2; exit 255 ;;\nesac\n"
                                    "exec ip netns exec $ns /bin/sh -c \"$*\"\n")
                  .ok());
  std::filesystem::permissions(bin + "/ssh", std::filesystem::perms::owner_all, std::filesystem::perm_options::add);
  std::string yaml = c.Topology(std::string("  - {name: prefill, role: prefill, host: b, args: ") + kWorkerArgs +
                                "}\n  - {name: decode, role: decode, host: c, args: " + kWorkerArgs + "}\n");
  // Every host over ssh; the router on a fixed port (its ready file would stay on host A).
  for (size_t i = 0; i < 3; ++i) {
    const std::string prefix = "run: [ip, netns, exec, " + h.host(i).netns + "]";
    yaml.replace(yaml.find(prefix), prefix.size(), "run: ssh");
  }
  yaml.replace(yaml.find("  port: 0\n"), 10, "  port: 8000\n");
  ASSERT_TRUE(c.Launch(yaml, {"PATH=" + bin + ":" + std::getenv("PATH")}).ok()) << c.Log();
  EXPECT_EQ(c.http_host(), h.host(0).address);
  EXPECT_EQ(c.http_port(), 8000);
  ASSERT_TRUE(c.WaitForWorkers(2, 30s)) << c.Log();
  EXPECT_EQ(HostOf(c.Workers()["decode-0"]["address"]["metrics"].get<std::string>()), h.host(2).address);
  const StreamRun run = StreamWithFault(c, 700, 4, 8, 0, nullptr);
  ExpectExact(run, 700, 8);
  c.launcher()->Signal(SIGINT);
  const auto code = c.launcher()->WaitExit(30s);
  ASSERT_TRUE(code.has_value()) << c.Log();
  EXPECT_EQ(*code, 0) << c.Log();
  for (size_t i = 0; i < 3; ++i) EXPECT_EQ(NetnsHosts::Run({"ip", "netns", "pids", h.host(i).netns}).value(), "") << i;
  if (HasFailure()) ADD_FAILURE() << c.Log();
}

// Open MPI for instances spread over namespace hosts: MPI's point-to-point off UCX (the KV
// transfer has its own UCX context), TCP between the hosts (the launcher adds the interface),
// session directories in the test's own temp dir (a killed host leaves its directory behind).
std::string MpiEnv(const std::string& dir) {
  return "{OMPI_MCA_pml: ob1, OMPI_MCA_btl: 'self,vader,tcp', OMPI_MCA_mpi_yield_when_idle: '1', TMPDIR: '" + dir +
         "'}";
}

TEST(MultiHostTest, MultiRankInstancesSpreadOverHostsAndAHostLostMidCollective) {
  HostCluster c;
  MAKE_HOSTS_OR_SKIP(c, 6);
  NetnsHosts& h = c.hosts();
  const std::string workers =
      std::string("  - {name: prefill, role: prefill, plan: 'cp=2,ep=2', hosts: [b, c], args: ") + kWorkerArgs +
      ", env: " + MpiEnv(c.dir()) + "}\n  - {name: decode, role: decode, plan: 'dp=2,ep=2', hosts: [d, e], args: " +
      kWorkerArgs + ", env: " + MpiEnv(c.dir()) + ", restart_backoff_ms: 500}\n" +
      "  - {name: spare, role: decode, host: f, args: " + kWorkerArgs + "}\n";
  ASSERT_TRUE(c.Launch(c.Topology(workers)).ok()) << c.Log();
  ASSERT_TRUE(c.WaitForWorkers(4, 60s)) << c.Log();
  EXPECT_EQ(c.ready()["instances"]["decode-0"]["hosts"], json::array({"d", "e"}));
  auto view = c.Workers();
  // The prefill instance registers once, from its leader on B; each DP rank from its own host.
  EXPECT_EQ(HostOf(view["prefill-0"]["address"]["metrics"].get<std::string>()), h.host(1).address);
  EXPECT_EQ(HostOf(view["decode-0-dp0"]["address"]["metrics"].get<std::string>()), h.host(3).address);
  EXPECT_EQ(HostOf(view["decode-0-dp1"]["address"]["metrics"].get<std::string>()), h.host(4).address);
  EXPECT_EQ(view["decode-0-dp1"]["instance"], "decode-0");

  // Exact through both instances; the spare is drained of traffic by leaving it out of the
  // first round (it takes its share, which is fine: every reply is checked the same way).
  constexpr int kN = 12, kMax = 10;
  const StreamRun run = StreamWithFault(c, 400, kN, kMax, 0, nullptr);
  ExpectExact(run, 400, kMax);
  const double on_dp0 = c.RouterMetric("pdserve_router_placements_total", "worker=\"decode-0-dp0\"");
  const double on_dp1 = c.RouterMetric("pdserve_router_placements_total", "worker=\"decode-0-dp1\"");
  EXPECT_GE(on_dp0, 1);
  EXPECT_GE(on_dp1, 1);
  EXPECT_EQ(MetricValue(c.WorkerMetrics("prefill-0"), "pdserve_worker_kv_transfers_total", "ok"), kN);

  // Host E is lost: every process in its namespace killed while streams run on both DP ranks
  // (rank 1 dies inside the instance's EP collectives; rank 0 on D is left waiting in one).
  constexpr int kLong = 8, kLongMax = 300;
  for (int k = 0; k < kLong; ++k) Reference(Prompt(500 + k), kLongMax);
  const StreamRun faulted = StreamWithFault(c, 500, kLong, kLongMax, 6, [&] {
    auto pids = NetnsHosts::Run({"ip", "netns", "pids", h.host(4).netns});
    ASSERT_TRUE(pids.ok());
    ASSERT_FALSE(pids.value().empty()) << "nothing ran on host E";
    std::istringstream in(pids.value());
    for (pid_t p; in >> p;) kill(p, SIGKILL);
  });
  ExpectExact(faulted, 500, kLongMax);
  EXPECT_GE(c.RouterMetric("pdserve_router_migrations_total", "outcome=\"migrated\",role=\"decode\""), 1)
      << "no stream was on the lost instance";
  EXPECT_TRUE(c.RouterIdle());
  EXPECT_TRUE(c.NoBlocksUsed("spare-0", 10s)) << "KV blocks leaked on the surviving decode worker";
  EXPECT_TRUE(c.NoBlocksUsed("prefill-0", 10s));
  // The launcher restarts the instance (restart: on-failure); both DP ranks register again.
  ASSERT_TRUE(WaitFor(
      [&] {
        auto w = c.Workers();
        return w.count("decode-0-dp0") && w.count("decode-0-dp1");
      },
      90s, 200ms))
      << c.Log();
  const StreamRun after = StreamWithFault(c, 600, 6, 6, 0, nullptr);
  ExpectExact(after, 600, 6);
  // Ctrl-C: the instances stop through their mpirun (which forwards SIGTERM to every rank on
  // every host); nothing is left on any host and the launcher exits 0.
  c.launcher()->Signal(SIGINT);
  const auto code = c.launcher()->WaitExit(60s);
  ASSERT_TRUE(code.has_value()) << c.Log();
  EXPECT_EQ(*code, 0) << c.Log();
  for (size_t i = 0; i < h.hosts().size(); ++i)
    EXPECT_EQ(NetnsHosts::Run({"ip", "netns", "pids", h.host(i).netns}).value(), "") << "processes left on host " << i;
  EXPECT_EQ(c.Log().find("while stopping"), std::string::npos) << c.Log();
  if (HasFailure()) ADD_FAILURE() << c.Log();
}

TEST(MultiHostTest, DecodeHostCutOffMidStreamMigratesAndRejoins) {
  HostCluster c;
  MAKE_HOSTS_OR_SKIP(c, 4);
  NetnsHosts& h = c.hosts();
  const std::string workers = std::string("  - {name: prefill, role: prefill, host: b, args: ") + kWorkerArgs +
                              "}\n  - {name: decode, role: decode, count: 2, hosts: [c, d], args: " + kWorkerArgs +
                              "}\n";
  ASSERT_TRUE(c.Launch(c.Topology(workers)).ok()) << c.Log();
  ASSERT_TRUE(c.WaitForWorkers(3, 30s)) << c.Log();
  EXPECT_EQ(HostOf(c.Workers()["decode-1"]["address"]["metrics"].get<std::string>()), h.host(3).address);

  constexpr int kN = 6, kMax = 300;
  for (int k = 0; k < kN; ++k) Reference(Prompt(900 + k), kMax);
  // Host D (decode-1) loses its link while every stream is running: it reaches neither the
  // router nor the prefill host.
  const StreamRun run = StreamWithFault(c, 900, kN, kMax, 6, [&] { ASSERT_TRUE(h.SetLinkUp(3, false).ok()); });
  ExpectExact(run, 900, kMax);
  EXPECT_GE(c.RouterMetric("pdserve_router_migrations_total", "outcome=\"migrated\",role=\"decode\""), 1)
      << "no stream was on the cut host";
  EXPECT_TRUE(c.RouterIdle());
  EXPECT_TRUE(c.NoBlocksUsed("decode-0", 10s)) << "KV blocks leaked on the surviving decode worker";
  EXPECT_TRUE(c.NoBlocksUsed("prefill-0", 10s));

  // The heal: D's worker registers again (its ZeroMQ connection comes back), frees what it held,
  // and serves exactly; the cut worker's late tokens never reach a client (the replies above and
  // below are exact).
  ASSERT_TRUE(h.SetLinkUp(3, true).ok());
  ASSERT_TRUE(c.WaitForWorkers(3, 30s)) << c.Log();
  EXPECT_TRUE(c.NoBlocksUsed("decode-1", 15s)) << "the cut-off worker kept its KV blocks";
  const double on_d_before = c.RouterMetric("pdserve_router_placements_total", "worker=\"decode-1\"");
  const StreamRun after = StreamWithFault(c, 950, 8, 6, 0, nullptr);
  ExpectExact(after, 950, 6);
  EXPECT_GT(c.RouterMetric("pdserve_router_placements_total", "worker=\"decode-1\""), on_d_before)
      << "the healed host took no request";
  EXPECT_TRUE(c.RouterIdle());
  for (const char* id : {"decode-0", "decode-1", "prefill-0"}) EXPECT_TRUE(c.NoBlocksUsed(id, 10s)) << id;
  if (HasFailure()) ADD_FAILURE() << c.Log();
}

// The router's host unreachable from a decode host for longer than the heartbeat timeout, healed
// while the streams it carried still run elsewhere: the router has moved them (it heard no
// heartbeat), the cut worker's output queued during the cut arrives after the heal and is
// dropped (counted as stale), and no client sees a token twice or out of order.
TEST(MultiHostTest, RouterUnreachablePastTheHeartbeatTimeoutNoDuplicateTokensAfterTheHeal) {
  HostCluster c;
  MAKE_HOSTS_OR_SKIP(c, 4);
  NetnsHosts& h = c.hosts();
  const std::string workers = std::string("  - {name: prefill, role: prefill, host: b, args: ") + kWorkerArgs +
                              "}\n  - {name: decode, role: decode, count: 2, hosts: [c, d], args: " + kWorkerArgs +
                              "}\n";
  ASSERT_TRUE(c.Launch(c.Topology(workers)).ok()) << c.Log();
  ASSERT_TRUE(c.WaitForWorkers(3, 30s)) << c.Log();
  constexpr int kN = 6, kMax = 400;
  for (int k = 0; k < kN; ++k) Reference(Prompt(1000 + k), kMax);
  const double stale_before = c.RouterMetric("pdserve_router_stale_token_events_total");
  bool moved = false;
  const StreamRun run = StreamWithFault(c, 1000, kN, kMax, 6, [&] {
    ASSERT_TRUE(h.SetLinkUp(3, false).ok());
    // Past the heartbeat timeout (1.5 s): the router removes decode-1 and moves its streams.
    moved = WaitFor(
        [&] {
          return c.RouterMetric("pdserve_router_migrations_total", "outcome=\"migrated\",role=\"decode\"") >= 1;
        },
        20s, 20ms);
    ASSERT_TRUE(h.SetLinkUp(3, true).ok());  // healed while the moved streams still run
  });
  ASSERT_TRUE(moved) << "the router never moved a stream off the cut host\n" << c.Log();
  EXPECT_GE(c.RouterMetric("pdserve_router_worker_removals_total", "reason=\"timeout\",role=\"decode\""), 1);
  ExpectExact(run, 1000, kMax);  // no duplicate, missing or reordered token in any stream
  ASSERT_TRUE(c.WaitForWorkers(3, 30s)) << c.Log();
  const double stale = c.RouterMetric("pdserve_router_stale_token_events_total") - stale_before;
  std::printf("[multihost] after the heal the router dropped %.0f stale token events of the cut worker\n", stale);
  EXPECT_GE(stale, 1) << "no late output of the cut worker reached the router: the heal proved nothing";
  EXPECT_TRUE(c.RouterIdle());
  for (const char* id : {"decode-0", "decode-1", "prefill-0"}) EXPECT_TRUE(c.NoBlocksUsed(id, 15s)) << id;
  const StreamRun after = StreamWithFault(c, 1050, 6, 6, 0, nullptr);
  ExpectExact(after, 1050, 6);
  if (HasFailure()) ADD_FAILURE() << c.Log();
}

}  // namespace
}  // namespace pdserve::multihost
