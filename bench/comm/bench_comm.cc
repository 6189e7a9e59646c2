// bench_comm: time of one MoE layer's EP exchange (StartDispatch..WaitDispatch, then
// StartCombine..WaitCombine) against tokens per rank, element type and rank count.
//
// Setup per configuration: hidden 1024, 256 routed experts, top-8 routing drawn uniformly at
// random (seeded per rank), so with p ranks a token goes to ~p*(1-(1-1/p)^8) distinct ranks (2
// ranks: ~2, 4 ranks: ~3.6) and is sent once per destination. The expert side is skipped (the
// received rows are sent straight back): this measures communication + packing + the fp32
// combine sum only. One timed repetition = barrier, dispatch, combine; its time is the slowest
// rank's (MPI_MAX), and the reported figure is the median over repetitions.
//
// Modes:
//   bench_comm                      driver: runs `mpirun -n P bench_comm --worker --out F` for
//                                   P in {2, 4} and writes <out>/comm_ep.{json,md}
//   mpirun -n P bench_comm --worker [--out FILE]   one rank count (any launcher / hostfile);
//                                   rank 0 writes FILE (JSON), or prints the table
// Options: --out DIR (driver) | FILE (worker); --ranks 2,4; --tokens 1,16,128,1024,4096
// The driver sets the single-host Open MPI environment (run as root, oversubscribe, loopback
// TCP) unless those variables are already set; PDSERVE_MPIRUN overrides the mpirun path.
// Oversubscribed runs (4 ranks on 2 cores) time the scheduler as much as MPI: compare them
// with care.
#include <mpi.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "bench/common/bench_util.h"
#include "comm/ep_dispatcher.h"
#include "comm/mpi_comm.h"
#include "comm/mpi_environment.h"

namespace pdserve::bench {
namespace {

using nlohmann::json;

constexpr int64_t kHidden = 1024;
constexpr int kExperts = 256;
constexpr int kTopK = 8;

std::vector<int> ParseList(const std::string& s) {
  std::vector<int> out;
  std::stringstream in(s);
  std::string item;
  while (std::getline(in, item, ',')) out.push_back(std::atoi(item.c_str()));
  return out;
}

struct Options {
  bool worker = false;
  std::string out;
  std::vector<int> ranks = {2, 4};
  std::vector<int> tokens = {1, 16, 128, 1024, 4096};
};

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// One (dtype, tokens) configuration on every rank; returns rank 0's view of the results.
json RunConfig(const comm::MpiComm& world, DType dtype, int tokens) {
  auto made = comm::EpDispatcher::Create(world, {.n_experts = kExperts, .top_k = kTopK, .hidden = kHidden,
                                                 .dispatch_dtype = dtype, .combine_dtype = dtype});
  PDSERVE_CHECK(made.ok(), made.status().ToString());
  comm::EpDispatcher& ep = **made;
  const size_t elt = DTypeSize(dtype);
  std::mt19937 rng(17 + world.rank());
  std::vector<uint8_t> hidden(tokens * kHidden * elt);
  for (auto& b : hidden) b = static_cast<uint8_t>(rng() & 0x3f);  // finite bf16/fp32 values
  std::vector<int32_t> ids;
  std::vector<float> weights(static_cast<size_t>(tokens) * kTopK, 0.125f);
  std::vector<int32_t> all(kExperts);
  for (int e = 0; e < kExperts; ++e) all[e] = e;
  for (int t = 0; t < tokens; ++t) {
    std::shuffle(all.begin(), all.end(), rng);
    ids.insert(ids.end(), all.begin(), all.begin() + kTopK);
  }
  std::vector<float> out(tokens * kHidden);

  const int reps = std::clamp(20000 / tokens, 8, 200);
  std::vector<double> total, dispatch, combine;
  int64_t sent_rows = 0, recv_rows = 0;
  for (int rep = 0; rep < reps + 2; ++rep) {  // 2 warm-up repetitions
    MPI_Barrier(world.get());
    const auto t0 = Clock::now();
    auto in = ep.Dispatch(hidden.data(), tokens, ids, weights);
    PDSERVE_CHECK(in.ok(), in.status().ToString());
    const auto t1 = Clock::now();
    PDSERVE_CHECK(ep.Combine((*in)->hidden, out, false).ok(), "combine");
    const auto t2 = Clock::now();
    recv_rows = (*in)->rows;
    double t[3] = {std::chrono::duration<double>(t2 - t0).count(),
                   std::chrono::duration<double>(t1 - t0).count(),
                   std::chrono::duration<double>(t2 - t1).count()};
    MPI_Allreduce(MPI_IN_PLACE, t, 3, MPI_DOUBLE, MPI_MAX, world.get());
    if (rep >= 2) {
      total.push_back(t[0]);
      dispatch.push_back(t[1]);
      combine.push_back(t[2]);
    }
  }
  // Rows this rank sent = rows it received back in combine: count them from the routing.
  for (int t = 0; t < tokens; ++t) {
    std::vector<int> dest;
    for (int j = 0; j < kTopK; ++j) dest.push_back(ids[t * kTopK + j] / (kExperts / world.size()));
    std::sort(dest.begin(), dest.end());
    sent_rows += std::unique(dest.begin(), dest.end()) - dest.begin();
  }
  int64_t rows[2] = {sent_rows, recv_rows};
  MPI_Allreduce(MPI_IN_PLACE, rows, 2, MPI_INT64_T, MPI_SUM, world.get());
  const double row_bytes = static_cast<double>(kHidden * elt);
  // Bytes a rank moves in one exchange (both directions), averaged over ranks.
  const double bytes_per_rank = 2.0 * rows[0] * row_bytes / world.size();
  const double med = Median(total);
  return json{{"ranks", world.size()},
              {"dtype", std::string(DTypeName(dtype))},
              {"tokens_per_rank", tokens},
              {"hidden", kHidden},
              {"top_k", kTopK},
              {"experts", kExperts},
              {"reps", reps},
              {"rows_per_token", static_cast<double>(rows[0]) / (static_cast<double>(tokens) * world.size())},
              {"bytes_per_rank", bytes_per_rank},
              {"median_us", med * 1e6},
              {"dispatch_median_us", Median(dispatch) * 1e6},
              {"combine_median_us", Median(combine) * 1e6},
              {"min_us", *std::min_element(total.begin(), total.end()) * 1e6},
              {"gb_per_s_per_rank", bytes_per_rank / med / 1e9}};
}

int Worker(const Options& opt, int argc, char** argv) {
  auto env = comm::MpiEnvironment::Init(&argc, &argv);
  if (!env.ok()) {
    std::fprintf(stderr, "bench_comm: %s\n", env.status().ToString().c_str());
    return 1;
  }
  json results = json::array();
  {
    auto world = comm::MpiComm::World();
    PDSERVE_CHECK(world.ok(), world.status().ToString());
    for (DType dtype : {DType::kBF16, DType::kF32}) {
      for (int tokens : opt.tokens) {
        json r = RunConfig(*world, dtype, tokens);
        if (world->rank() == 0) {
          std::fprintf(stderr, "  np=%d %s tokens=%d: %.1f us\n", world->size(), DTypeName(dtype).data(),
                       tokens, r["median_us"].get<double>());
          results.push_back(r);
        }
      }
    }
    if (world->rank() == 0) {
      if (opt.out.empty()) {
        std::printf("%s\n", results.dump(2).c_str());
      } else {
        std::ofstream(opt.out) << results.dump(2) << "\n";
      }
    }
  }
  env->reset();
  return 0;
}

void SetDefaultEnv(const char* name, const char* value) { setenv(name, value, /*overwrite=*/0); }

std::string Markdown(const json& rows, const std::string& machine) {
  std::string md = "# EP dispatch + combine (one MoE layer's exchange)\n\n";
  md += fmt::format("hidden {}, {} experts, top-{} uniform random routing; no expert compute. Time = slowest "
                    "rank, median of repetitions. MB/rank = bytes a rank sends + receives in both "
                    "directions.\n\n", kHidden, kExperts, kTopK);
  md += "| ranks | dtype | tokens/rank | rows/token | MB/rank | dispatch | combine | total | GB/s/rank |\n";
  md += "|---|---|---|---|---|---|---|---|---|\n";
  for (const json& r : rows) {
    const auto us = [](double v) { return v >= 1000 ? fmt::format("{:.2f} ms", v / 1000) : fmt::format("{:.0f} us", v); };
    md += fmt::format("| {} | {} | {} | {:.2f} | {:.2f} | {} | {} | {} | {:.2f} |\n", r["ranks"].get<int>(),
                      r["dtype"].get<std::string>(), r["tokens_per_rank"].get<int>(),
                      r["rows_per_token"].get<double>(), r["bytes_per_rank"].get<double>() / 1e6,
                      us(r["dispatch_median_us"].get<double>()), us(r["combine_median_us"].get<double>()),
                      us(r["median_us"].get<double>()), r["gb_per_s_per_rank"].get<double>());
  }
  md += fmt::format("\n{}, {} cores, Open MPI shared memory (vader), commit {}. Ranks beyond the core "
                    "count are oversubscribed: those rows include scheduler time.\n",
                    machine, std::thread::hardware_concurrency(), GitRevision());
  return md;
}

int Driver(const Options& opt, const char* self) {
  SetDefaultEnv("OMPI_ALLOW_RUN_AS_ROOT", "1");
  SetDefaultEnv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1");
  SetDefaultEnv("OMPI_MCA_rmaps_base_oversubscribe", "1");
  SetDefaultEnv("OMPI_MCA_mpi_yield_when_idle", "1");
  SetDefaultEnv("OMPI_MCA_btl", "self,vader,tcp");
  SetDefaultEnv("OMPI_MCA_btl_tcp_if_include", "lo");
  SetDefaultEnv("OMPI_MCA_oob_tcp_if_include", "lo");
  const char* mpirun = std::getenv("PDSERVE_MPIRUN") ? std::getenv("PDSERVE_MPIRUN") : "mpirun";
  const std::string dir = opt.out.empty() ? std::string(PDSERVE_SOURCE_DIR) + "/bench/results" : opt.out;
  std::filesystem::create_directories(dir);
  std::string tokens;
  for (int t : opt.tokens) tokens += (tokens.empty() ? "" : ",") + std::to_string(t);

  json rows = json::array();
  for (int np : opt.ranks) {
    const std::string part = fmt::format("{}/comm_ep_np{}.part.json", dir, np);
    const std::string cmd = fmt::format("timeout 1200 {} -n {} {} --worker --tokens {} --out {}", mpirun, np,
                                        self, tokens, part);
    std::fprintf(stderr, "== %s\n", cmd.c_str());
    if (std::system(cmd.c_str()) != 0) {
      std::fprintf(stderr, "bench_comm: the %d-rank run failed\n", np);
      return 1;
    }
    std::ifstream in(part);
    json r = json::parse(in, nullptr, /*allow_exceptions=*/false);
    if (!r.is_array()) {
      std::fprintf(stderr, "bench_comm: no results in %s\n", part.c_str());
      return 1;
    }
    for (auto& row : r) rows.push_back(row);
    std::filesystem::remove(part);
  }
  const std::string machine = MachineName();
  json j{{"bench", "comm_ep"}, {"machine", machine}, {"cores", std::thread::hardware_concurrency()},
         {"commit", GitRevision()}, {"results", rows}};
  const std::string md = Markdown(rows, machine);
  std::ofstream(dir + "/comm_ep.json") << j.dump(2) << "\n";
  std::ofstream(dir + "/comm_ep.md") << md;
  std::printf("%s\nwrote %s/comm_ep.{json,md}\n", md.c_str(), dir.c_str());
  return 0;
}

}  // namespace
}  // namespace pdserve::bench

int main(int argc, char** argv) {
  pdserve::bench::Options opt;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--worker") {
      opt.worker = true;
    } else if (a == "--out" && i + 1 < argc) {
      opt.out = argv[++i];
    } else if (a == "--ranks" && i + 1 < argc) {
      opt.ranks = pdserve::bench::ParseList(argv[++i]);
    } else if (a == "--tokens" && i + 1 < argc) {
      opt.tokens = pdserve::bench::ParseList(argv[++i]);
    } else {
      std::fprintf(stderr, "usage: bench_comm [--out DIR] [--ranks 2,4] [--tokens 1,16,...] | --worker [--out FILE]\n");
      return 2;
    }
  }
  if (opt.worker) return pdserve::bench::Worker(opt, argc, argv);
  const std::string self = std::filesystem::read_symlink("/proc/self/exe").string();
  return pdserve::bench::Driver(opt, self.c_str());
}
