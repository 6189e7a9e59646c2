#include "comm/tensor_parallel.h"

#include <algorithm>
#include <climits>
#include <cstring>

#include <fmt/format.h>

#include "comm/mpi_status.h"
#include "comm/shard.h"

namespace pdserve::comm {

namespace {
// MPI counts are int: large buffers go in slices of this many elements.
constexpr int64_t kMaxSlice = int64_t{1} << 30;
}  // namespace

Result<std::unique_ptr<TensorParallel>> TensorParallel::Create(const MpiComm& tp_group) {
  PDSERVE_ASSIGN_OR_RETURN(MpiComm dup, tp_group.Dup());
  return std::unique_ptr<TensorParallel>(new TensorParallel(std::move(dup)));
}

Status TensorParallel::AllReduceSum(std::span<float> data) {
  if (size() == 1) return Status::Ok();
  for (size_t off = 0; off < data.size(); off += kMaxSlice) {
    const int n = static_cast<int>(std::min<int64_t>(kMaxSlice, data.size() - off));
    PDSERVE_MPI_RETURN_IF_ERROR(
        MPI_Allreduce(MPI_IN_PLACE, data.data() + off, n, MPI_FLOAT, MPI_SUM, comm_.get()),
        "MPI_Allreduce (tp sum)");
  }
  return Status::Ok();
}

Status TensorParallel::AllGather(std::span<const float> local, std::span<float> out) {
  if (out.size() != local.size() * static_cast<size_t>(size())) {
    return Status::InvalidArgument(fmt::format("TP AllGather: out has {} floats, expected {} x {}",
                                               out.size(), size(), local.size()));
  }
  if (out.size() > static_cast<size_t>(INT_MAX)) {
    return Status::InvalidArgument("TP AllGather: more than INT_MAX elements");
  }
  if (local.empty()) return Status::Ok();
  PDSERVE_MPI_RETURN_IF_ERROR(MPI_Allgather(local.data(), static_cast<int>(local.size()), MPI_FLOAT,
                                            out.data(), static_cast<int>(local.size()), MPI_FLOAT,
                                            comm_.get()),
                              "MPI_Allgather (tp)");
  return Status::Ok();
}

Status TensorParallel::GatherColumns(std::span<const float> local, int64_t n_rows, int64_t n_cols,
                                     std::span<float> out) {
  const int p = size();
  const ShardRange mine = EvenShard(n_cols, p, rank());
  if (n_rows < 0 || static_cast<int64_t>(local.size()) != n_rows * mine.size() ||
      static_cast<int64_t>(out.size()) != n_rows * n_cols) {
    return Status::InvalidArgument(fmt::format(
        "TP GatherColumns: local {} / out {} floats do not match {} rows x {} of {} columns",
        local.size(), out.size(), n_rows, mine.size(), n_cols));
  }
  if (n_rows * n_cols > INT_MAX) return Status::InvalidArgument("TP GatherColumns: > INT_MAX elements");
  counts_.assign(p, 0);
  displs_.assign(p, 0);
  for (int r = 0; r < p; ++r) {
    const ShardRange s = EvenShard(n_cols, p, r);
    counts_[r] = static_cast<int>(n_rows * s.size());
    displs_[r] = static_cast<int>(n_rows * s.begin);
  }
  // One row (the decode case: logits of one token) is already in final order when gathered
  // rank-major; several rows need a transpose from [rank][row][col] to [row][rank col].
  float* dst = out.data();
  if (n_rows > 1) {
    staging_.resize(out.size());
    dst = staging_.data();
  }
  if (n_rows > 0) {
    PDSERVE_MPI_RETURN_IF_ERROR(MPI_Allgatherv(local.data(), counts_[rank()], MPI_FLOAT, dst,
                                               counts_.data(), displs_.data(), MPI_FLOAT, comm_.get()),
                                "MPI_Allgatherv (tp columns)");
  }
  if (n_rows > 1) {
    for (int r = 0; r < p; ++r) {
      const ShardRange s = EvenShard(n_cols, p, r);
      const float* block = staging_.data() + displs_[r];
      for (int64_t row = 0; row < n_rows; ++row) {
        std::memcpy(out.data() + row * n_cols + s.begin, block + row * s.size(), s.size() * sizeof(float));
      }
    }
  }
  return Status::Ok();
}

Status TensorParallel::EmbedSharded(std::span<const int32_t> ids, int64_t vocab, int64_t hidden,
                                    const std::function<void(int64_t, float*)>& lookup,
                                    std::span<float> out) {
  if (static_cast<int64_t>(out.size()) != static_cast<int64_t>(ids.size()) * hidden) {
    return Status::InvalidArgument(fmt::format("TP EmbedSharded: out has {} floats, expected {} x {}",
                                               out.size(), ids.size(), hidden));
  }
  const ShardRange mine = EvenShard(vocab, size(), rank());
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] < 0 || ids[i] >= vocab) {
      return Status::InvalidArgument(fmt::format("token id {} outside the vocabulary [0, {})", ids[i], vocab));
    }
    float* dst = out.data() + i * hidden;
    if (mine.Contains(ids[i])) {
      lookup(ids[i] - mine.begin, dst);
    } else {
      std::fill(dst, dst + hidden, 0.0f);
    }
  }
  return AllReduceSum(out);
}

}  // namespace pdserve::comm
