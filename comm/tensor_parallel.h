// TensorParallel: the collectives of one TP group (blocking, fp32), for the sharded o_proj,
// lm_head and embedding (sharding conventions in shard.h).
//
//   partial o_proj outputs (input-sharded)  -> AllReduceSum / SumPartials
//   vocab-sharded lm_head logits             -> GatherColumns
//   vocab-sharded embedding                  -> EmbedSharded (lookup own rows, zeros, sum)
//   equal-size pieces                        -> AllGather
//
// Every rank of the TP group must make the same calls in the same order with the same sizes
// (the TP peers run the same requests, so this holds by construction). The sum's rounding is
// MPI's reduction order: identical on every rank of the group, but it may differ from a
// single-process sum in the last bits.
//
// Ownership: owns a duplicate of the TP communicator (Create is collective over it).
// Threading: one thread at a time. Errors: kInvalidArgument for inconsistent sizes (checked
// locally, before any communication), MPI failures as in mpi_status.h.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "comm/mpi_comm.h"
#include "common/status.h"

namespace pdserve::comm {

class TensorParallel {
 public:
  static Result<std::unique_ptr<TensorParallel>> Create(const MpiComm& tp_group);

  int rank() const { return comm_.rank(); }
  int size() const { return comm_.size(); }

  // data <- sum over the group of data (in place).
  Status AllReduceSum(std::span<float> data);
  // Row-sharded (input-sharded) o_proj partial outputs summed in place: AllReduceSum by name.
  Status SumPartials(std::span<float> partial) { return AllReduceSum(partial); }

  // out = concatenation of every rank's `local` in rank order.
  // REQUIRES: out.size() == size() * local.size(), same local.size() on every rank.
  Status AllGather(std::span<const float> local, std::span<float> out);

  // Reassembles a row-major [n_rows x n_cols] matrix whose columns are split with
  // EvenShard(n_cols, size(), r): `local` is this rank's [n_rows x shard_r] block (e.g. the
  // logits of its vocabulary slice for n_rows tokens), `out` the full matrix on every rank.
  Status GatherColumns(std::span<const float> local, int64_t n_rows, int64_t n_cols,
                       std::span<float> out);

  // Vocabulary-sharded embedding: for every id this rank's EvenShard(vocab, size(), rank())
  // owns, lookup(id - shard.begin, dst) writes the `hidden` floats of its row into dst; other
  // rows stay zero; then the group sums, so out [ids.size() x hidden] holds every row on every
  // rank. Errors: kInvalidArgument for an id outside [0, vocab), returned before the sum (the
  // TP peers hold the same ids, so they all fail the same way).
  Status EmbedSharded(std::span<const int32_t> ids, int64_t vocab, int64_t hidden,
                      const std::function<void(int64_t local_row, float* dst)>& lookup,
                      std::span<float> out);

 private:
  explicit TensorParallel(MpiComm comm) : comm_(std::move(comm)) {}

  MpiComm comm_;
  std::vector<float> staging_;      // GatherColumns: rank-major blocks before the transpose
  std::vector<int> counts_, displs_;
};

}  // namespace pdserve::comm
