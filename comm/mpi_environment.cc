#include "comm/mpi_environment.h"

#include <mpi.h>

#include <fmt/format.h>

#include "comm/mpi_status.h"

namespace pdserve::comm {

Result<std::unique_ptr<MpiEnvironment>> MpiEnvironment::Init(int* argc, char*** argv,
                                                             int required_thread_level) {
  const int required = required_thread_level < 0 ? MPI_THREAD_FUNNELED : required_thread_level;
  int finalized = 0, initialized = 0;
  MPI_Finalized(&finalized);
  if (finalized) return Status::FailedPrecondition("MPI was already finalized in this process");
  MPI_Initialized(&initialized);

  std::unique_ptr<MpiEnvironment> env(new MpiEnvironment());
  int provided = 0;
  if (initialized) {
    MPI_Query_thread(&provided);
  } else {
    // Before MPI_Init the default error handler still aborts, so this rc is mostly a formality.
    PDSERVE_MPI_RETURN_IF_ERROR(MPI_Init_thread(argc, argv, required, &provided),
                                "MPI_Init_thread");
    env->owns_init_ = true;
  }
  env->thread_level_ = provided;
  PDSERVE_MPI_RETURN_IF_ERROR(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN),
                              "MPI_Comm_set_errhandler (world)");
  PDSERVE_MPI_RETURN_IF_ERROR(MPI_Comm_rank(MPI_COMM_WORLD, &env->world_rank_), "MPI_Comm_rank");
  PDSERVE_MPI_RETURN_IF_ERROR(MPI_Comm_size(MPI_COMM_WORLD, &env->world_size_), "MPI_Comm_size");
  if (provided < required) {
    return Status::Unavailable(fmt::format(
        "MPI provides thread level {} but {} was requested (rebuild Open MPI with thread support "
        "or ask for less)", provided, required));
  }
  Log()->debug("{}: MPI initialized (thread level {})", RankTag(), provided);
  return env;
}

MpiEnvironment::~MpiEnvironment() {
  if (!owns_init_) return;
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) MPI_Finalize();
}

}  // namespace pdserve::comm
