// bench_kvtransfer: what the KV transfer layer costs, in one run.
//
//  1. Bandwidth of KV transfers of 64 KB .. 256 MB (the `small` preset's layout: 6 layers,
//     788 bytes per token per layer; B = 16, 32, 64, 128 tokens per block on both sides) over
//     UCX shm and UCX tcp (loopback), next to memcpy and a raw loopback TCP stream measured in
//     the same run. A transfer is what a request costs on the prefill side: KvSender Start,
//     one WriteLayers per layer ("streamed", as during prefill) or one for all layers ("bulk"),
//     Finish (flush, completion notice, the decode side's verification and ack). The decode
//     side is a separate process (this binary with --peer) with a UCX-allocated pool; its
//     descriptor round trip is not timed (control plane). Digest verification is off in the
//     bandwidth table except in its "verify" column.
//  2. Latency of a one-block transfer + completion notice (median and p99 of 300).
//  3. Time to move the KV of a 32K-token prompt (155 MB), streamed layer by layer. With
//     --prefill-seconds X the prefill is simulated (X/6 per layer, sleeping so the cores stay
//     free for the transfer threads; verify-on runs only) and the time the transfer adds after
//     the last layer is reported; the prefill figure itself must come from the engine's
//     benchmark.
//
// Options: --prefill-seconds X | --quick (fewer sizes and repetitions) | --configs shm,tcp,tcp-put
//          | --out DIR (default <source>/bench/results)
// Output: <out>/kvtransfer.json and kvtransfer.md.
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "bench/common/bench_util.h"
#include "bench/kvtransfer/kv_bench_baselines.h"
#include "bench/kvtransfer/kv_bench_peer.h"
#include "kvtransfer/kv_sender.h"
#include "kvtransfer/testing/kv_pattern.h"
#include "kvtransfer/transfer_plan.h"
#include "kvtransfer/ucx/ucx_transport.h"

namespace pdserve::bench::kv {
namespace {

using nlohmann::json;
using namespace kvtransfer;

constexpr uint32_t kBlockSizes[] = {16, 32, 64, 128};
constexpr uint32_t kPromptTokens = 32768;

struct Options {
  bool quick = false;
  double prefill_seconds = -1;
  std::string out_dir = std::string(PDSERVE_SOURCE_DIR) + "/bench/results";
  std::vector<std::string> configs = {"shm", "tcp", "tcp-put"};
};

struct Config {
  std::string name;
  std::string tls;
  WriteProtocol protocol;
};

Config ConfigNamed(const std::string& name) {
  if (name == "tcp") return {name, "tcp", WriteProtocol::kAuto};
  if (name == "tcp-put") return {name, "tcp", WriteProtocol::kPut};
  return {"shm", "shm", WriteProtocol::kAuto};
}

std::vector<uint64_t> Sizes(const Options& o) {
  if (o.quick) return {64 << 10, 1 << 20, 16 << 20};
  return {64 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20, 64 << 20, 256 << 20};
}

int Reps(const Options& o, uint64_t bytes) {
  const int reps = bytes <= (1 << 20) ? 30 : bytes <= (4 << 20) ? 15 : bytes <= (16 << 20) ? 7
                   : bytes <= (64 << 20)                        ? 5
                                                                : 3;
  return o.quick ? std::max(2, reps / 3) : reps;
}

uint64_t BytesPerToken() { return SmallPresetLayout(16).TokenBytesPerLayer() * 6; }

uint32_t TokensFor(uint64_t bytes) {
  return static_cast<uint32_t>(std::max<uint64_t>(1, bytes / BytesPerToken()));
}

// The first `tokens` tokens of a prefill cache.
KvSource Prefix(const KvSource& full, uint32_t tokens) {
  KvSource s = full;
  s.runs[0].tokens.end = tokens;
  s.runs[0].blocks.resize(s.layout.BlocksForTokens(tokens));
  return s;
}

std::string ControlEndpoint() {
  static int counter = 0;
  return fmt::format("ipc:///tmp/pdserve-bench-kv-{}-{}.ipc", getpid(), counter++);
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

double Percentile(std::vector<double> v, double p) {
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(p * static_cast<double>(v.size())))];
}

// The prefill side of one transport configuration.
class Runner {
 public:
  explicit Runner(const Config& config) : config_(config) {
    UcxTransportOptions options;
    options.context.tls = config.tls;
    if (config.tls == "tcp") options.context.net_devices = "lo";
    options.write_protocol = config.protocol;
    transport_ = UcxTransport::Create(options).value();
    sender_ = KvSender::Create(transport_.get()).value();
  }
  ~Runner() {
    sender_.reset();
    transport_.reset();
  }

  std::map<std::string, std::string> PeerEnv() const {
    std::map<std::string, std::string> env = {{"UCX_TLS", config_.tls},
                                              {"PDSERVE_LOG_LEVEL", "warn"}};
    if (config_.tls == "tcp") env["UCX_NET_DEVICES"] = "lo";
    return env;
  }

  std::unique_ptr<DecodePeerClient> SpawnPeer(uint32_t block, bool verify, uint64_t max_tokens,
                                              uint32_t timeout_s) {
    PeerOptions o;
    o.timeout_s = timeout_s;
    o.tokens_per_block = block;
    o.max_tokens = max_tokens;
    o.verify = verify;
    o.control = ControlEndpoint();
    return DecodePeerClient::Spawn(std::filesystem::read_symlink("/proc/self/exe"), PeerEnv(), o)
        .value();
  }

  void Release(DecodePeerClient& peer) { transport_->Disconnect(peer.address()); }

  // Seconds of one transfer of `tokens` tokens (streamed: one WriteLayers per layer). With
  // per_layer_compute > 0, sleeps that long before each layer and sets *exposed to the time
  // from the end of the last layer's compute to Finish.
  double Transfer(DecodePeerClient& peer, const KvSource& full, uint32_t tokens, bool streamed,
                  double per_layer_compute = 0, double* exposed = nullptr) {
    const uint64_t id = next_id_++;
    KvDescriptor desc = peer.Reserve(id, tokens).value();
    const KvSource source = Prefix(full, tokens);
    const auto t0 = Clock::now();
    PDSERVE_CHECK(sender_->Start(desc, 0, source).ok(), "Start failed");
    const uint32_t layers = source.layout.num_layers;
    if (streamed) {
      for (uint32_t l = 0; l < layers; ++l) {
        if (per_layer_compute > 0) {
          std::this_thread::sleep_for(std::chrono::duration<double>(per_layer_compute));
        }
        PDSERVE_CHECK(sender_->WriteLayers(id, l).ok(), "WriteLayers failed");
      }
    } else {
      PDSERVE_CHECK(sender_->WriteLayers(id, 0, layers).ok(), "WriteLayers failed");
    }
    const auto computed = Clock::now();
    Status done = sender_->Finish(id);
    const auto t1 = Clock::now();
    PDSERVE_CHECK(done.ok(), done.ToString());
    if (exposed != nullptr) *exposed = std::chrono::duration<double>(t1 - computed).count();
    return std::chrono::duration<double>(t1 - t0).count();
  }

  double MedianTransfer(DecodePeerClient& peer, const KvSource& full, uint32_t tokens,
                        bool streamed, int reps) {
    Transfer(peer, full, tokens, streamed);  // warm-up (page faults, connection)
    std::vector<double> t;
    for (int i = 0; i < reps; ++i) t.push_back(Transfer(peer, full, tokens, streamed));
    return Median(t);
  }

 private:
  Config config_;
  std::unique_ptr<UcxTransport> transport_;
  std::unique_ptr<KvSender> sender_;
  uint64_t next_id_ = 1;
};

json Latency(Runner& runner, DecodePeerClient& peer, const KvSource& full, uint32_t block,
             const Options& o) {
  const int reps = o.quick ? 60 : 300;
  for (int i = 0; i < 10; ++i) runner.Transfer(peer, full, block, false);
  std::vector<double> t;
  for (int i = 0; i < reps; ++i) t.push_back(runner.Transfer(peer, full, block, false));
  return {{"block_tokens", block},
          {"bytes", BytesForRanges(full.layout, {{0, block}})},
          {"median_us", Median(t) * 1e6},
          {"p99_us", Percentile(t, 0.99) * 1e6}};
}

// The prefill simulation (--prefill-seconds) runs only with `simulate_prefill` (the verify-on
// configuration, as in production): it sleeps for the whole prefill time.
json Prompt32k(Runner& runner, DecodePeerClient& peer, const KvSource& full, const Options& o,
               bool simulate_prefill) {
  const uint64_t bytes = BytesForRanges(full.layout, {{0, kPromptTokens}});
  runner.Transfer(peer, full, kPromptTokens, true);  // warm-up
  std::vector<double> t;
  for (int i = 0; i < (o.quick ? 2 : 5); ++i) {
    t.push_back(runner.Transfer(peer, full, kPromptTokens, true));
  }
  const double alone = Median(t);
  json j = {{"tokens", kPromptTokens},
            {"bytes", bytes},
            {"transfer_s", alone},
            {"per_layer_transfer_s", alone / 6},
            {"gbps", static_cast<double>(bytes) / alone / 1e9}};
  if (o.prefill_seconds > 0 && simulate_prefill) {
    double exposed = 0;
    const double total =
        runner.Transfer(peer, full, kPromptTokens, true, o.prefill_seconds / 6, &exposed);
    j["prefill_s"] = o.prefill_seconds;
    j["per_layer_prefill_s"] = o.prefill_seconds / 6;
    j["with_prefill_total_s"] = total;
    j["exposed_after_last_layer_s"] = exposed;
  }
  return j;
}

json RunConfig(const Config& config, const Options& o) {
  std::printf("== UCX %s\n", config.name.c_str());
  std::fflush(stdout);
  Runner runner(config);
  const std::vector<uint64_t> sizes = Sizes(o);
  const uint64_t max_tokens = std::max<uint64_t>(TokensFor(sizes.back()), kPromptTokens);
  const bool full_run = config.name != "tcp-put";
  json j;
  for (uint32_t block : kBlockSizes) {
    if (!full_run && block != 64) continue;
    testing::SourceCache cache(SmallPresetLayout(block), {{0, static_cast<uint32_t>(max_tokens)}},
                               1, 0, /*fill=*/false);
    std::memset(cache.data(), 0x5a, cache.size());
    for (bool verify : {false, true}) {
      if (verify && (block != 64 || !full_run)) continue;
      const uint32_t timeout_s = static_cast<uint32_t>(60 + 2 * std::max(0.0, o.prefill_seconds));
      auto peer = runner.SpawnPeer(block, verify, max_tokens, timeout_s);
      const std::string mode = verify ? "streamed_verify" : "streamed";
      for (uint64_t size : sizes) {
        const uint32_t tokens = TokensFor(size);
        const double s = runner.MedianTransfer(*peer, cache.source(), tokens, true, Reps(o, size));
        const uint64_t bytes = BytesForRanges(cache.source().layout, {{0, tokens}});
        j[mode][std::to_string(block)][std::to_string(size)] = static_cast<double>(bytes) / s / 1e9;
        std::printf("  B=%3u %-15s %9.1f KB  %7.3f GB/s\n", block, mode.c_str(),
                    static_cast<double>(bytes) / 1024, static_cast<double>(bytes) / s / 1e9);
        std::fflush(stdout);
        if (block == 64 && !verify) {
          const double b = runner.MedianTransfer(*peer, cache.source(), tokens, false, Reps(o, size));
          j["bulk"]["64"][std::to_string(size)] = static_cast<double>(bytes) / b / 1e9;
        }
      }
      j[verify ? "latency_verify" : "latency"][std::to_string(block)] =
          Latency(runner, *peer, cache.source(), block, o);
      if (block == 64 && full_run) {
        j[verify ? "prompt_32k_verify" : "prompt_32k"] =
            Prompt32k(runner, *peer, cache.source(), o, verify);
      }
      runner.Release(*peer);
    }
  }
  return j;
}

std::string Cell(const json& j, const std::string& a, const std::string& b, const std::string& c) {
  if (!j.contains(a) || !j[a].contains(b) || !j[a][b].contains(c)) return "";
  return fmt::format("{:.2f}", j[a][b][c].get<double>());
}

std::string Markdown(const json& r, const Options& o) {
  std::ostringstream md;
  const json& c = r["configs"];
  md << "# KV transfer (kvtransfer/, UCX " << r["ucx"].get<std::string>() << ")\n\n"
     << "Layout: `small` preset (6 layers, FP8 latent 512 + 16 B scales + BF16 rope 64, FP8 "
        "indexer 128 + fp32 scale: 4728 bytes per token); same block size B on both sides. "
        "Transfer = KvSender Start..Finish (writes, flush, completion notice, decode-side ack); "
        "decode side in another process with a UCX-allocated pool. GB/s = KV bytes / median "
        "time. *streamed*: one write batch per layer (as during prefill); *bulk*: all layers "
        "at once; *verify*: XXH3 digest computed by the sender and checked by the receiver. "
        "tcp writes travel as kvtransfer active messages (WriteProtocol::kAuto); *tcp-put* is "
        "ucp_put_nbx, which UCX emulates over tcp.\n\n";
  for (const std::string& t : {std::string("shm"), std::string("tcp")}) {
    if (!c.contains(t)) continue;
    const std::string base = t == "shm" ? "memcpy" : "raw TCP";
    const std::string base_key = t == "shm" ? "memcpy" : "tcp_raw";
    md << "## UCX " << t << " vs " << base << " (GB/s)\n\n| size | " << base;
    for (uint32_t b : kBlockSizes) md << " | B=" << b;
    md << " | bulk B=64 | verify B=64 |";
    if (t == "tcp" && c.contains("tcp-put")) md << " tcp-put B=64 |";
    md << " best/" << base << " |\n|---|---";
    for (size_t i = 0; i < std::size(kBlockSizes) + 3 + (t == "tcp" && c.contains("tcp-put")); ++i) md << "|---";
    md << "|\n";
    for (uint64_t size : Sizes(o)) {
      const std::string s = std::to_string(size);
      const double baseline = r["baselines"][base_key][s].get<double>();
      md << "| " << (size >= (1 << 20) ? fmt::format("{} MB", size >> 20) : fmt::format("{} KB", size >> 10))
         << " | " << fmt::format("{:.2f}", baseline);
      double best = 0;
      for (uint32_t b : kBlockSizes) {
        md << " | " << Cell(c[t], "streamed", std::to_string(b), s);
        if (c[t]["streamed"].contains(std::to_string(b))) {
          best = std::max(best, c[t]["streamed"][std::to_string(b)][s].get<double>());
        }
      }
      md << " | " << Cell(c[t], "bulk", "64", s) << " | " << Cell(c[t], "streamed_verify", "64", s);
      if (c[t].contains("bulk")) best = std::max(best, c[t]["bulk"]["64"][s].get<double>());
      if (t == "tcp" && c.contains("tcp-put")) md << " | " << Cell(c["tcp-put"], "streamed", "64", s);
      md << " | " << fmt::format("{:.0f}%", 100 * best / baseline) << " |\n";
    }
    md << "\n";
  }
  md << "## One-block transfer + completion notice (latency, us)\n\n"
     << "| transport | B | bytes | median | p99 | median (verify) | p99 (verify) |\n|---|---|---|---|---|---|---|\n";
  for (const auto& [name, cj] : c.items()) {
    for (const auto& [b, l] : cj["latency"].items()) {
      std::string mv, pv;
      if (cj.contains("latency_verify") && cj["latency_verify"].contains(b)) {
        mv = fmt::format("{:.0f}", cj["latency_verify"][b]["median_us"].get<double>());
        pv = fmt::format("{:.0f}", cj["latency_verify"][b]["p99_us"].get<double>());
      }
      md << "| " << name << " | " << b << " | " << l["bytes"].get<uint64_t>() << " | "
         << fmt::format("{:.0f} | {:.0f}", l["median_us"].get<double>(), l["p99_us"].get<double>())
         << " | " << mv << " | " << pv << " |\n";
    }
  }
  md << "\n## 32K-token prompt, `small` preset (" << fmt::format("{:.0f}", 32768.0 * 4728 / 1e6)
     << " MB), streamed layer by layer, B=64\n\n";
  md << "| transport | verify | transfer | per layer | GB/s |";
  if (o.prefill_seconds > 0) md << " prefill per layer | total with prefill | after last layer |";
  md << "\n|---|---|---|---|---|" << (o.prefill_seconds > 0 ? "---|---|---|" : "") << "\n";
  for (const auto& [name, cj] : c.items()) {
    for (const std::string key : {"prompt_32k", "prompt_32k_verify"}) {
      if (!cj.contains(key)) continue;
      const json& p = cj[key];
      md << "| " << name << " | " << (key == "prompt_32k" ? "off" : "on") << " | "
         << fmt::format("{:.1f} ms | {:.1f} ms | {:.2f}", p["transfer_s"].get<double>() * 1e3,
                        p["per_layer_transfer_s"].get<double>() * 1e3, p["gbps"].get<double>());
      if (o.prefill_seconds > 0 && !p.contains("prefill_s")) md << " | | | ";
      if (p.contains("prefill_s")) {
        md << fmt::format(" | {:.1f} ms | {:.3f} s | {:.1f} ms", p["per_layer_prefill_s"].get<double>() * 1e3,
                          p["with_prefill_total_s"].get<double>(),
                          p["exposed_after_last_layer_s"].get<double>() * 1e3);
      }
      md << " |\n";
    }
  }
  if (o.prefill_seconds <= 0) {
    md << "\nNo prefill time given (--prefill-seconds X, from the engine's benchmark): the "
          "transfer hides under prefill when its per-layer time is below the per-layer prefill "
          "time.\n";
  }
  md << "\n" << r["machine"].get<std::string>() << ", " << std::thread::hardware_concurrency()
     << " cores, commit " << r["commit"].get<std::string>() << ", load average "
     << r["load_before"].get<std::string>() << " before / " << r["load_after"].get<std::string>()
     << " after the run (other work on the machine makes the figures noisy). Both processes "
        "share the cores; each side runs a UCX progress thread.\n";
  return md.str();
}

int Main(int argc, char** argv) {
  Options o;
  PeerOptions peer;
  bool is_peer = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&](const std::string& key) -> std::optional<std::string> {
      if (a.rfind(key + "=", 0) == 0) return a.substr(key.size() + 1);
      if (a == key && i + 1 < argc) return std::string(argv[++i]);
      return std::nullopt;
    };
    if (a == "--peer") is_peer = true;
    else if (a == "--quick") o.quick = true;
    else if (auto v = value("--prefill-seconds")) o.prefill_seconds = std::stod(*v);
    else if (auto v = value("--out")) o.out_dir = *v;
    else if (auto v = value("--configs")) {
      o.configs.clear();
      std::stringstream in(*v);
      for (std::string item; std::getline(in, item, ',');) o.configs.push_back(item);
    } else if (auto v = value("--block")) peer.tokens_per_block = std::stoul(*v);
    else if (auto v = value("--max_tokens")) peer.max_tokens = std::stoull(*v);
    else if (auto v = value("--verify")) peer.verify = *v == "1";
    else if (auto v = value("--timeout_s")) peer.timeout_s = static_cast<uint32_t>(std::stoul(*v));
    else if (auto v = value("--control")) peer.control = *v;
  }
  if (is_peer) return RunDecodePeer(peer);

  json r;
  r["machine"] = MachineName();
  r["commit"] = GitRevision();
  r["ucx"] = CommandOutput("ucx_info -v | sed -n 's/^# Version //p'");
  r["bytes_per_token"] = BytesPerToken();
  r["load_before"] = CommandOutput("cut -d' ' -f1-3 /proc/loadavg");
  // Baselines first: LoopbackTcp forks, before any thread exists.
  const std::vector<uint64_t> sizes = Sizes(o);
  std::vector<uint8_t> src(sizes.back()), dst(sizes.back());
  std::memset(src.data(), 1, src.size());
  std::memset(dst.data(), 2, dst.size());
  auto tcp = LoopbackTcp::Start();
  PDSERVE_CHECK(tcp.ok(), tcp.status().ToString());
  for (uint64_t size : sizes) {
    const std::string s = std::to_string(size);
    r["baselines"]["memcpy"][s] =
        static_cast<double>(size) / MemcpySeconds(dst.data(), src.data(), size, Reps(o, size)) / 1e9;
    r["baselines"]["tcp_raw"][s] =
        static_cast<double>(size) / tcp.value()->Seconds(src.data(), size, Reps(o, size)).value() / 1e9;
    std::printf("baseline %9lu B: memcpy %.2f GB/s, raw TCP %.2f GB/s\n",
                static_cast<unsigned long>(size), r["baselines"]["memcpy"][s].get<double>(),
                r["baselines"]["tcp_raw"][s].get<double>());
  }
  tcp.value().reset();
  std::vector<uint8_t>().swap(src);
  std::vector<uint8_t>().swap(dst);
  for (const std::string& name : o.configs) r["configs"][name] = RunConfig(ConfigNamed(name), o);
  r["load_after"] = CommandOutput("cut -d' ' -f1-3 /proc/loadavg");
  const std::string md = Markdown(r, o);
  std::filesystem::create_directories(o.out_dir);
  std::ofstream(o.out_dir + "/kvtransfer.json") << r.dump(2) << "\n";
  std::ofstream(o.out_dir + "/kvtransfer.md") << md;
  std::printf("%s\nwrote %s/kvtransfer.{json,md}\n", md.c_str(), o.out_dir.c_str());
  return 0;
}

}  // namespace
}  // namespace pdserve::bench::kv

int main(int argc, char** argv) { return pdserve::bench::kv::Main(argc, argv); }
