// bench_kv_hosts: KV transfer bandwidth between two hosts, against raw TCP between the same two
// hosts, measured in one run (docs/kvtransfer.md "Between hosts").
//
// The hosts are network namespaces of a test bed (scripts/netns_hosts.sh: each its own eth0 on
// a bridge, real TCP between distinct addresses). The driver (run as root) makes a bed of two
// hosts and re-runs itself on host 0 as the probe; the probe starts the decode side (this binary
// with --peer, a UCX-allocated pool and a KvReceiver) and a TCP sink (--tcp-sink) on host 1, then
// measures, for 1..256 MB:
//   * raw TCP: an iperf-style stream, 8-byte length + payload, the sink's 1-byte ack ending it;
//   * UCX tcp on eth0 (what a prefill worker with --network uses): KvSender Start, one
//     WriteLayers per layer of the `small` preset layout (B = 64), Finish (flush, completion
//     notice, the decode side's ack), digest verification off.
// The two take turns, five rounds; GB/s = bytes / median time. The load average is taken before and after and printed beside
// every figure. Output: <out>/kv_hosts.{json,md} (default <source>/bench/results).
//
// Options: --quick (fewer sizes and repetitions) | --out DIR
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <sstream>
#include <thread>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "bench/common/bench_util.h"
#include "bench/kvtransfer/kv_bench_peer.h"
#include "common/check.h"
#include "kvtransfer/kv_sender.h"
#include "kvtransfer/testing/kv_pattern.h"
#include "kvtransfer/transfer_plan.h"
#include "kvtransfer/ucx/ucx_transport.h"
#include "services/testing/netns_hosts.h"

namespace pdserve::bench::kv {
namespace {

using nlohmann::json;
using namespace kvtransfer;

constexpr uint32_t kBlock = 64;

std::vector<uint64_t> Sizes(bool quick) {
  if (quick) return {1 << 20, 16 << 20, 64 << 20};
  return {1 << 20, 4 << 20, 16 << 20, 64 << 20, 256 << 20};
}

// Per round; the figures are medians over every round's repetitions.
int Reps(bool quick, uint64_t bytes) {
  const int reps = bytes <= (1 << 20) ? 40 : bytes <= (4 << 20) ? 20 : bytes <= (16 << 20) ? 10 : bytes <= (64 << 20) ? 4 : 2;
  return quick ? std::max(2, reps / 4) : reps;
}
// Raw TCP and the KV transfer take turns, so both see the same machine (other work comes and goes).
int Rounds(bool quick) { return quick ? 1 : 5; }

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

std::string LoadAverage() { return CommandOutput("cut -d' ' -f1-3 /proc/loadavg"); }

bool WriteAll(int fd, const void* data, uint64_t n) {
  const auto* p = static_cast<const uint8_t*>(data);
  while (n > 0) {
    const ssize_t w = send(fd, p, std::min<uint64_t>(n, 1 << 30), MSG_NOSIGNAL);
    if (w <= 0) return false;
    p += w;
    n -= static_cast<uint64_t>(w);
  }
  return true;
}

bool ReadAll(int fd, void* data, uint64_t n) {
  auto* p = static_cast<uint8_t*>(data);
  while (n > 0) {
    const ssize_t r = recv(fd, p, n, 0);
    if (r <= 0) return false;
    p += r;
    n -= static_cast<uint64_t>(r);
  }
  return true;
}

sockaddr_in Ipv4(const std::string& address, int port) {
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  PDSERVE_CHECK(inet_pton(AF_INET, address.c_str(), &a.sin_addr) == 1, "bad IPv4 address " + address);
  return a;
}

// --tcp-sink ADDR:PORT: accepts one connection; reads each message (8-byte length + payload)
// completely and answers one byte, until the connection closes.
int RunTcpSink(const std::string& where) {
  const size_t colon = where.rfind(':');
  const sockaddr_in addr = Ipv4(where.substr(0, colon), std::stoi(where.substr(colon + 1)));
  const int listen_fd = socket(AF_INET, SOCK_STREAM, 0);
  int one = 1;
  setsockopt(listen_fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (bind(listen_fd, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)) != 0 || listen(listen_fd, 1) != 0) {
    std::fprintf(stderr, "tcp sink: cannot listen on %s: %s\n", where.c_str(), std::strerror(errno));
    return 1;
  }
  const int fd = accept(listen_fd, nullptr, nullptr);
  std::vector<uint8_t> buffer(8 << 20);
  while (fd >= 0) {
    uint64_t n = 0;
    if (!ReadAll(fd, &n, sizeof(n))) break;
    while (n > 0) {
      const ssize_t r = recv(fd, buffer.data(), std::min<uint64_t>(n, buffer.size()), 0);
      if (r <= 0) return 0;
      n -= static_cast<uint64_t>(r);
    }
    const uint8_t ack = 1;
    if (!WriteAll(fd, &ack, 1)) break;
  }
  return 0;
}

// A child process started through `argv` (a host's `ip netns exec` prefix), killed with the probe.
pid_t SpawnOnHost(const std::vector<std::string>& argv) {
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  const pid_t pid = fork();
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    execvp(args[0], args.data());
    _exit(127);
  }
  return pid;
}

// Appends the seconds of `reps` messages of `bytes` over a TCP connection to the sink (after one
// warm-up) to *t.
void RawTcpSeconds(int fd, const uint8_t* src, uint64_t bytes, int reps, std::vector<double>* t) {
  for (int i = 0; i <= reps; ++i) {
    const auto t0 = Clock::now();
    uint8_t ack = 0;
    PDSERVE_CHECK(WriteAll(fd, &bytes, sizeof(bytes)) && WriteAll(fd, src, bytes) && ReadAll(fd, &ack, 1),
                  "the TCP sink went away");
    if (i > 0) t->push_back(SecondsSince(t0));
  }
}

struct ProbeOptions {
  bool quick = false;
  std::string peer_netns;    // host 1
  std::string peer_address;  // host 1's address
  std::string interface;     // the hosts' interface (eth0)
};

// Runs on host 0; prints one line "RESULT <json>".
int RunProbe(const ProbeOptions& o) {
  const std::string self = std::filesystem::read_symlink("/proc/self/exe").string();
  const std::vector<std::string> on_peer = {"ip", "netns", "exec", o.peer_netns};
  const std::vector<uint64_t> sizes = Sizes(o.quick);
  json r;

  // Raw TCP first (it forks; no thread exists yet).
  const int port = 47000 + static_cast<int>(getpid() % 1000);
  std::vector<std::string> sink_argv = on_peer;
  sink_argv.insert(sink_argv.end(), {self, "--tcp-sink", o.peer_address + ":" + std::to_string(port)});
  const pid_t sink = SpawnOnHost(sink_argv);
  int fd = -1;
  const sockaddr_in to = Ipv4(o.peer_address, port);
  for (int i = 0; i < 200 && fd < 0; ++i) {  // until the sink listens (up to 10 s)
    // Close-on-exec: the decode peer forked later must not hold the connection open.
    fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (connect(fd, reinterpret_cast<const sockaddr*>(&to), sizeof(to)) != 0) {
      close(fd);
      fd = -1;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  }
  PDSERVE_CHECK(fd >= 0, "cannot reach the TCP sink on the other host");
  const int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  std::vector<uint8_t> src(sizes.back(), 0x5a);

  // UCX tcp on the hosts' interface, the decode side on host 1.
  UcxTransportOptions to_opts;
  to_opts.context.tls = "tcp";
  to_opts.context.net_devices = o.interface;
  auto transport = UcxTransport::Create(to_opts).value();
  auto sender = KvSender::Create(transport.get()).value();
  const KvLayout layout = SmallPresetLayout(kBlock);
  const uint64_t per_token = layout.TokenBytesPerLayer() * layout.num_layers;
  const uint32_t max_tokens = static_cast<uint32_t>(sizes.back() / per_token + 1);
  testing::SourceCache cache(layout, {{0, max_tokens}}, 1, 0, /*fill=*/false);
  std::memset(cache.data(), 0x5a, cache.size());
  PeerOptions po;
  po.tokens_per_block = kBlock;
  po.max_tokens = max_tokens;
  po.control = fmt::format("ipc:///tmp/pdserve-bench-kv-hosts-{}.ipc", getpid());
  auto peer = DecodePeerClient::Spawn(self, {{"UCX_TLS", "tcp"}, {"UCX_NET_DEVICES", o.interface},
                                             {"PDSERVE_LOG_LEVEL", "warn"}},
                                      po, on_peer)
                  .value();
  uint64_t next_id = 1;
  auto transfer = [&](uint32_t tokens) {
    const uint64_t id = next_id++;
    KvDescriptor desc = peer->Reserve(id, tokens).value();
    KvSource source = cache.source();
    source.runs[0].tokens.end = tokens;
    source.runs[0].blocks.resize(layout.BlocksForTokens(tokens));
    const auto t0 = Clock::now();
    PDSERVE_CHECK(sender->Start(desc, 0, source).ok(), "Start failed");
    for (uint32_t l = 0; l < layout.num_layers; ++l) PDSERVE_CHECK(sender->WriteLayers(id, l).ok(), "WriteLayers failed");
    const Status done = sender->Finish(id);
    PDSERVE_CHECK(done.ok(), done.ToString());
    return SecondsSince(t0);
  };
  std::map<uint64_t, std::vector<double>> tcp_s, ucx_s;
  for (int round = 0; round < Rounds(o.quick); ++round) {
    for (uint64_t size : sizes) {
      RawTcpSeconds(fd, src.data(), size, Reps(o.quick, size), &tcp_s[size]);
      const uint32_t tokens = static_cast<uint32_t>(std::max<uint64_t>(1, size / per_token));
      transfer(tokens);  // warm-up: the connection, the pool's pages
      for (int i = 0; i < Reps(o.quick, size); ++i) ucx_s[size].push_back(transfer(tokens));
    }
  }
  for (uint64_t size : sizes) {
    const uint32_t tokens = static_cast<uint32_t>(std::max<uint64_t>(1, size / per_token));
    const uint64_t bytes = BytesForRanges(layout, {{0, tokens}});
    r["tcp_raw"][std::to_string(size)] = static_cast<double>(size) / Median(tcp_s[size]) / 1e9;
    r["ucx_tcp"][std::to_string(size)] = static_cast<double>(bytes) / Median(ucx_s[size]) / 1e9;
  }
  close(fd);
  waitpid(sink, nullptr, 0);
  transport->Disconnect(peer->address());
  peer.reset();
  sender.reset();
  transport.reset();
  std::printf("RESULT %s\n", r.dump().c_str());
  return 0;
}

int Main(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  bool is_peer = false, is_probe = false, quick = false;
  PeerOptions peer;
  ProbeOptions probe;
  std::string out_dir = std::string(PDSERVE_SOURCE_DIR) + "/bench/results";
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    auto value = [&](const std::string& name) -> std::optional<std::string> {
      if (a.rfind(name + "=", 0) == 0) return a.substr(name.size() + 1);  // the peer's arguments
      if (a == name && i + 1 < args.size()) return args[++i];
      return std::nullopt;
    };
    if (a == "--peer") is_peer = true;
    else if (a == "--probe") is_probe = true;
    else if (a == "--quick") quick = probe.quick = true;
    else if (auto v = value("--tcp-sink")) return RunTcpSink(*v);
    else if (auto v = value("--out")) out_dir = *v;
    else if (auto v = value("--peer-netns")) probe.peer_netns = *v;
    else if (auto v = value("--peer-address")) probe.peer_address = *v;
    else if (auto v = value("--interface")) probe.interface = *v;
    else if (auto v = value("--block")) peer.tokens_per_block = std::stoul(*v);
    else if (auto v = value("--max_tokens")) peer.max_tokens = std::stoull(*v);
    else if (auto v = value("--verify")) peer.verify = *v == "1";
    else if (auto v = value("--timeout_s")) peer.timeout_s = static_cast<uint32_t>(std::stoul(*v));
    else if (auto v = value("--control")) peer.control = *v;
  }
  if (is_peer) return RunDecodePeer(peer);
  if (is_probe) return RunProbe(probe);

  auto bed = services::testing::NetnsHosts::Create(std::string(PDSERVE_SOURCE_DIR) + "/scripts/netns_hosts.sh", 2);
  if (!bed.ok()) {
    std::fprintf(stderr, "bench_kv_hosts: cannot make the two hosts: %s\n", bed.status().ToString().c_str());
    return 2;
  }
  const auto& hosts = (*bed)->hosts();
  json r;
  r["machine"] = MachineName();
  r["commit"] = GitRevision();
  r["ucx"] = CommandOutput("ucx_info -v | sed -n 's/^# Version //p'");
  r["hosts"] = {hosts[0].address, hosts[1].address};
  r["load_before"] = LoadAverage();
  std::vector<std::string> cmd = (*bed)->Exec(0);
  cmd.insert(cmd.end(), {std::filesystem::read_symlink("/proc/self/exe").string(), "--probe", "--peer-netns",
                         hosts[1].netns, "--peer-address", hosts[1].address, "--interface", hosts[1].interface});
  if (quick) cmd.push_back("--quick");
  auto out = services::testing::NetnsHosts::Run(cmd);
  r["load_after"] = LoadAverage();
  if (!out.ok()) {
    std::fprintf(stderr, "bench_kv_hosts: the probe failed: %s\n", out.status().ToString().c_str());
    return 1;
  }
  const size_t at = out.value().find("RESULT ");
  PDSERVE_CHECK(at != std::string::npos, "the probe printed no result:\n" + out.value());
  const json probe_result = json::parse(out.value().substr(at + 7, out.value().find('\n', at) - at - 7));
  r["tcp_raw"] = probe_result["tcp_raw"];
  r["ucx_tcp"] = probe_result["ucx_tcp"];

  std::ostringstream md;
  md << "# KV transfer between two hosts (network namespaces, " << hosts[0].address << " -> " << hosts[1].address
     << " over a bridge; UCX " << r["ucx"].get<std::string>() << ")\n\n"
     << "Load average before / after: " << r["load_before"].get<std::string>() << " / "
     << r["load_after"].get<std::string>() << "; commit " << r["commit"].get<std::string>() << ".\n\n"
     << "| size | raw TCP GB/s | KV transfer (UCX tcp on " << hosts[0].interface
     << ", streamed B=64) GB/s | KV / raw TCP |\n|---|---|---|---|\n";
  for (uint64_t size : Sizes(quick)) {
    const std::string s = std::to_string(size);
    const double raw = r["tcp_raw"][s].get<double>(), ucx = r["ucx_tcp"][s].get<double>();
    md << "| " << (size >> 20) << " MB | " << fmt::format("{:.2f}", raw) << " | " << fmt::format("{:.2f}", ucx) << " | "
       << fmt::format("{:.0f}%", 100 * ucx / raw) << " |\n";
  }
  std::filesystem::create_directories(out_dir);
  std::ofstream(out_dir + "/kv_hosts.json") << r.dump(2) << "\n";
  std::ofstream(out_dir + "/kv_hosts.md") << md.str();
  std::printf("%s\nwrote %s/kv_hosts.{json,md}\n", md.str().c_str(), out_dir.c_str());
  return 0;
}

}  // namespace
}  // namespace pdserve::bench::kv

int main(int argc, char** argv) { return pdserve::bench::kv::Main(argc, argv); }
