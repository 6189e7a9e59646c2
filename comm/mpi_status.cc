#include "comm/mpi_status.h"

#include <mpi.h>

#include <fmt/format.h>

#include "common/logging.h"

namespace pdserve::comm {

namespace {
bool MpiActive() {
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  return initialized && !finalized;
}
}  // namespace

std::string RankTag() {
  if (!MpiActive()) return "rank ?";
  int rank = 0, size = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  return fmt::format("rank {}/{}", rank, size);
}

Status MpiStatus(int rc, std::string_view what) {
  if (rc == MPI_SUCCESS) return Status::Ok();
  char text[MPI_MAX_ERROR_STRING] = {};
  int len = 0;
  if (MPI_Error_string(rc, text, &len) != MPI_SUCCESS) len = 0;
  int error_class = MPI_ERR_UNKNOWN;
  if (MPI_Error_class(rc, &error_class) != MPI_SUCCESS) error_class = MPI_ERR_UNKNOWN;
  const std::string msg = fmt::format("{} failed on {}: {}", what, RankTag(),
                                      len > 0 ? std::string_view(text, len) : "unknown MPI error");
  switch (error_class) {
    case MPI_ERR_BUFFER:
    case MPI_ERR_COUNT:
    case MPI_ERR_TYPE:
    case MPI_ERR_TAG:
    case MPI_ERR_COMM:
    case MPI_ERR_RANK:
    case MPI_ERR_ROOT:
    case MPI_ERR_GROUP:
    case MPI_ERR_OP:
    case MPI_ERR_ARG:
    case MPI_ERR_TRUNCATE:
    case MPI_ERR_REQUEST:
      return Status::Internal(msg);
    default:
      return Status::Unavailable(msg);
  }
}

std::shared_ptr<spdlog::logger> Log() {
  static const std::shared_ptr<spdlog::logger> logger = GetLogger("comm");
  return logger;
}

}  // namespace pdserve::comm
