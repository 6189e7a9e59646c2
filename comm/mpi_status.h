// MPI return codes as pdserve Status values, and the "comm" logger whose lines carry the rank.
//
// Every communicator comm/ creates has MPI_ERRORS_RETURN set, so MPI failures come back as
// return codes instead of aborting the job; MpiStatus turns them into a Status carrying MPI's
// own error string and the world rank ("MPI_Allreduce (dp coordinator) failed on rank 2/4:
// MPI_ERR_TRUNCATE: message truncated").
// Codes: kInternal for argument-class errors (a bug in the caller or in comm/), kUnavailable for
// everything else (a peer or the transport failed: the instance must be restarted).
//
// Thread-safety: pure functions; the logger is thread-safe.
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include <spdlog/spdlog.h>

#include "common/status.h"

namespace pdserve::comm {

// OK when rc == MPI_SUCCESS, else the error described above. `what` names the call and its
// purpose ("MPI_Alltoallv (ep dispatch)").
Status MpiStatus(int rc, std::string_view what);

// "rank r/n" in MPI_COMM_WORLD, or "rank ?" before MPI_Init / after MPI_Finalize.
std::string RankTag();

// The module logger ("comm"). Prefix lines with RankTag(): several ranks share one terminal.
std::shared_ptr<spdlog::logger> Log();

}  // namespace pdserve::comm

// Evaluates an MPI call; on failure returns the Status from the enclosing function.
#define PDSERVE_MPI_RETURN_IF_ERROR(call, what) \
  PDSERVE_RETURN_IF_ERROR(::pdserve::comm::MpiStatus((call), (what)))
