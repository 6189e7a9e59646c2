// pdserve-numerics-fault: TEST ONLY. The `pdserve` command line with a deliberately broken
// forward switched on (model/test_hooks.h), so the accuracy tooling's tests can prove that
// `pdserve compare` catches a real numerics bug and names the first layer it breaks
// (model/dump_plans_cli_test.sh). The fault comes from the environment:
//
//   PDSERVE_TEST_NUMERICS_FAULT=indexer-rope-interleaved[@RANK]
//
// on every process or, with @RANK, on that MPI world rank alone (OMPI_COMM_WORLD_RANK). Never
// part of a shipped binary or the Docker image.
#include <cstdio>
#include <cstdlib>
#include <string>

#include "model/test_hooks.h"
#include "services/cli/command.h"

int main(int argc, char** argv) {
  if (const char* env = std::getenv("PDSERVE_TEST_NUMERICS_FAULT"); env != nullptr && *env != '\0') {
    std::string name = env;
    long rank = -1;
    if (const size_t at = name.find('@'); at != std::string::npos) {
      char* end = nullptr;
      rank = std::strtol(name.c_str() + at + 1, &end, 10);
      if (at + 1 == name.size() || *end != '\0' || rank < 0) {
        std::fprintf(stderr, "pdserve-numerics-fault: PDSERVE_TEST_NUMERICS_FAULT='%s' wants NAME or NAME@RANK\n", env);
        return 2;
      }
      name.resize(at);
    }
    if (name != "indexer-rope-interleaved") {
      std::fprintf(stderr, "pdserve-numerics-fault: unknown fault '%s' (indexer-rope-interleaved)\n", name.c_str());
      return 2;
    }
    const char* world = std::getenv("OMPI_COMM_WORLD_RANK");
    const long world_rank = world ? std::strtol(world, nullptr, 10) : 0;
    if (rank < 0 || rank == world_rank)
      pdserve::model::TEST_SetNumericsFault(pdserve::model::NumericsFault::kIndexerRopeInterleaved);
  }
  return pdserve::cli::Main(argc, argv);
}
