// Soak (label "soak"): 200 concurrent streams for 20 s through a real pdserve-router and a
// disaggregated pair of echo protocol test workers (real processes, real sockets). Every
// stream completes every request it started, and no process's RSS grows by more than the
// bound between the end of the warm-up and the end of the run. The full-size run (1000
// streams, minutes, engine workers) is `scripts/bench_serving.sh soak` (docs/benchmarks.md).
#include <gtest/gtest.h>

#include <csignal>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "bench/loadgen/dataset.h"
#include "bench/loadgen/driver.h"
#include "services/common/process_util.h"
#include "services/testing/child_process.h"

namespace pdserve::loadgen {
namespace {

using namespace std::chrono_literals;
namespace t = services::testing;

constexpr int kStreams = 200;
constexpr double kSeconds = 20;
constexpr int64_t kRssGrowthLimitKib = 32 * 1024;

std::string BinDir() { return std::filesystem::read_symlink("/proc/self/exe").parent_path().parent_path() / "bin"; }

TEST(LoadgenSoak, StreamsCompleteAndMemoryStaysFlat) {
  std::signal(SIGPIPE, SIG_IGN);
  const std::string bin = BinDir(), dir = t::MakeTempDir("pdserve-loadgen-soak");
  const std::string ready = dir + "/router.ready";
  auto router = t::ChildProcess::Spawn({bin + "/pdserve-router", "--port", "0", "--control", "tcp://127.0.0.1:*",
                                        "--ready-file", ready, "--http-threads", "512", "--model-name", "soak",
                                        "--log-level", "warn"},
                                       dir + "/router.log");
  ASSERT_TRUE(router.ok());
  nlohmann::json r;
  ASSERT_TRUE(t::WaitFor([&] {
    auto text = services::ReadFile(ready);
    if (!text.ok()) return false;
    r = nlohmann::json::parse(text.value());
    return true;
  }, 30s)) << (*router)->Log();
  std::vector<std::unique_ptr<t::ChildProcess>> workers;
  for (const char* role : {"prefill", "decode"}) {
    auto w = t::ChildProcess::Spawn({bin + "/pdserve-echo-worker", "--router", r["control_endpoint"].get<std::string>(),
                                     "--worker-id", std::string("soak-") + role, "--role", role, "--model-name",
                                     "soak", "--max-batch", "1024", "--token-delay-us", "20000",
                                     "--register-retry-ms", "50", "--log-level", "warn"},
                                    dir + "/" + role + ".log");
    ASSERT_TRUE(w.ok());
    workers.push_back(std::move(w.value()));
  }
  Target target;
  target.port = r["http_port"].get<int>();
  target.model = "soak";
  target.timeout = 60s;
  // Ready when a request goes through the prefill -> decode path.
  DatasetOptions d;
  d.num_requests = 512;
  d.input_len = 64;
  d.output_len = 24;
  d.seed = 9;
  auto specs = MakeDataset(d);
  ASSERT_TRUE(specs.ok());
  ASSERT_TRUE(t::WaitFor([&] { return StreamClient(target).Run(specs.value()[0], Clock::now()).ok; }, 30s, 200ms))
      << (*router)->Log();

  SoakOptions o;
  o.streams = kStreams;
  o.seconds = kSeconds;
  o.watch = {{"router", (*router)->pid()}, {"prefill", workers[0]->pid()}, {"decode", workers[1]->pid()}};
  const SoakResult res = RunSoak(target, specs.value(), o);

  size_t completed = 0;
  std::string first_error;
  for (const auto& rec : res.records) {
    if (rec.ok && rec.output_tokens >= 1) {
      ++completed;
    } else if (first_error.empty()) {
      first_error = rec.error;
    }
  }
  EXPECT_EQ(completed, res.records.size()) << "first failure: " << first_error;
  ASSERT_EQ(res.completed_per_stream.size(), static_cast<size_t>(kStreams));
  for (int k = 0; k < kStreams; ++k) EXPECT_GE(res.completed_per_stream[static_cast<size_t>(k)], 1) << "stream " << k;
  // Each stream ran back-to-back requests of ~0.5 s for 20 s.
  EXPECT_GE(res.records.size(), static_cast<size_t>(kStreams) * 5);
  ASSERT_EQ(res.rss.size(), 3u);
  for (const auto& s : res.rss) {
    ASSERT_GE(s.rss_kib.size(), 10u) << s.name;
    EXPECT_LE(s.growth_kib(), kRssGrowthLimitKib)
        << s.name << ": RSS " << s.baseline_kib << " KiB after warm-up, up to " << s.final_max_kib << " KiB at the end";
    std::printf("%s: RSS %.1f MiB after warm-up, max %.1f MiB in the last quarter\n", s.name.c_str(),
                static_cast<double>(s.baseline_kib) / 1024, static_cast<double>(s.final_max_kib) / 1024);
  }
  std::printf("%zu requests on %d streams in %.1f s\n", res.records.size(), kStreams, res.duration_s);
  EXPECT_TRUE((*router)->Running()) << (*router)->Log();
}

}  // namespace
}  // namespace pdserve::loadgen
