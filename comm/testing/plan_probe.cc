// comm_plan_probe: builds the process groups of a parallel plan given on the command line and
// reports the outcome per rank. The CTest entry comm_bad_plan_np4 runs it with a plan that
// cannot work and checks that every rank stops at start with the reason (exit 1), instead of
// hanging in a collective. Also handy to check a plan before a real launch:
//   mpirun -n 4 comm_plan_probe --dp 2 --tp 2 --ep 4 --experts 256 --heads 128
// Flags: --cp --dp --tp --ep N, --experts --heads --vocab N (model dims), --plan FILE (.json/.yaml).
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "comm/mpi_comm.h"
#include "comm/mpi_environment.h"
#include "comm/mpi_status.h"
#include "comm/process_groups.h"

using pdserve::comm::MpiComm;
using pdserve::comm::MpiEnvironment;
using pdserve::comm::ParallelPlan;
using pdserve::comm::PlanModelDims;
using pdserve::comm::ProcessGroups;
using pdserve::comm::RankTag;

int main(int argc, char** argv) {
  auto env = MpiEnvironment::Init(&argc, &argv);
  if (!env.ok()) {
    std::fprintf(stderr, "comm_plan_probe: %s\n", env.status().ToString().c_str());
    return 2;
  }
  ParallelPlan plan;
  PlanModelDims dims;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    const char* value = argv[i + 1];
    if (flag == "--plan") {
      auto loaded = ParallelPlan::LoadFile(value);
      if (!loaded.ok()) {
        std::fprintf(stderr, "%s: %s\n", RankTag().c_str(), loaded.status().ToString().c_str());
        return 2;
      }
      plan = *loaded;
      continue;
    }
    const long n = std::strtol(value, nullptr, 10);
    if (flag == "--cp") plan.cp = static_cast<int>(n);
    else if (flag == "--dp") plan.dp = static_cast<int>(n);
    else if (flag == "--tp") plan.tp = static_cast<int>(n);
    else if (flag == "--ep") plan.ep = static_cast<int>(n);
    else if (flag == "--experts") dims.n_routed_experts = n;
    else if (flag == "--heads") dims.num_attention_heads = n;
    else if (flag == "--vocab") dims.vocab_size = n;
    else {
      std::fprintf(stderr, "comm_plan_probe: unknown flag %s\n", flag.c_str());
      return 2;
    }
  }

  int rc = 0;
  {
    auto world = MpiComm::World();
    if (!world.ok()) {
      std::fprintf(stderr, "%s: %s\n", RankTag().c_str(), world.status().ToString().c_str());
      return 2;
    }
    auto groups = ProcessGroups::Create(*world, plan, dims);
    if (groups.ok()) {
      std::printf("%s: plan accepted: %s\n", RankTag().c_str(), (*groups)->Describe().c_str());
    } else {
      std::fprintf(stderr, "%s: parallel plan rejected: %s\n", RankTag().c_str(),
                   groups.status().ToString().c_str());
      rc = 1;
    }
    std::fflush(stdout);
    std::fflush(stderr);
  }
  // Finalize before exiting: it is collective, so every rank has printed its reason before the
  // first non-zero exit makes mpirun tear the job down.
  env->reset();
  return rc;
}
