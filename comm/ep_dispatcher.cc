#include "comm/ep_dispatcher.h"

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstring>

#include <fmt/format.h>

#include "comm/mpi_status.h"

namespace pdserve::comm {

namespace {

constexpr int kMaxTopK = 64;

// MPI implementations may reject a null buffer even with zero counts, and empty vectors hand
// out null, so empty buffers point at these instead. Send and receive get *different* dummies:
// Open MPI's libnbc treats sendbuf == recvbuf as MPI_IN_PLACE, whose schedule does not match
// the peers' regular one, and the exchange hangs (seen with a rank that sends and receives
// nothing in a round).
uint8_t g_empty_send[16];
uint8_t g_empty_recv[16];

template <typename T>
void* RecvBuffer(std::vector<T>& v) {
  return v.empty() ? static_cast<void*>(g_empty_recv) : static_cast<void*>(v.data());
}
template <typename T>
const void* SendBuffer(const std::vector<T>& v) {
  return v.empty() ? static_cast<const void*>(g_empty_send) : static_cast<const void*>(v.data());
}

}  // namespace

Result<std::unique_ptr<EpDispatcher>> EpDispatcher::Create(const MpiComm& ep_group,
                                                           const EpDispatcherOptions& options) {
  EpDispatcherOptions opt = options;
  const EpLayout layout{opt.n_experts, ep_group.size()};
  PDSERVE_RETURN_IF_ERROR(layout.Validate());
  if (opt.top_k < 1 || opt.top_k > kMaxTopK || opt.top_k > opt.n_experts) {
    return Status::InvalidArgument(fmt::format("EP dispatcher: top_k {} out of range [1, {}]", opt.top_k,
                                               std::min(kMaxTopK, opt.n_experts)));
  }
  if (opt.hidden < 1) return Status::InvalidArgument("EP dispatcher: hidden must be >= 1");
  if (opt.combine_dtype != DType::kF32 && opt.combine_dtype != DType::kBF16) {
    return Status::InvalidArgument(fmt::format("EP dispatcher: combine dtype {} (supported: F32, BF16)",
                                               DTypeName(opt.combine_dtype)));
  }
  if (opt.dispatch_row_bytes == 0) opt.dispatch_row_bytes = opt.hidden * DTypeSize(opt.dispatch_dtype);
  PDSERVE_ASSIGN_OR_RETURN(MpiDatatype row, MpiDatatype::Bytes(opt.dispatch_row_bytes));
  PDSERVE_ASSIGN_OR_RETURN(MpiDatatype meta, MpiDatatype::Bytes(2 * sizeof(uint32_t) * opt.top_k));
  PDSERVE_ASSIGN_OR_RETURN(MpiDatatype combine_row,
                           MpiDatatype::Bytes(opt.hidden * DTypeSize(opt.combine_dtype)));
  PDSERVE_ASSIGN_OR_RETURN(MpiComm dup, ep_group.Dup());
  return std::unique_ptr<EpDispatcher>(new EpDispatcher(std::move(dup), opt, layout, std::move(row),
                                                        std::move(meta), std::move(combine_row)));
}

EpDispatcher::EpDispatcher(MpiComm comm, const EpDispatcherOptions& options, EpLayout layout,
                           MpiDatatype row, MpiDatatype meta, MpiDatatype combine_row)
    : comm_(std::move(comm)),
      options_(options),
      layout_(layout),
      row_(std::move(row)),
      meta_(std::move(meta)),
      combine_row_(std::move(combine_row)) {}

EpDispatcher::~EpDispatcher() {
  if (state_ == State::kDispatching || state_ == State::kCombining) {
    // A collective request cannot be cancelled, and MPI still writes into our buffers until it
    // completes: finishing it is the only safe way to free them.
    Log()->warn("{}: EP dispatcher destroyed with an exchange in flight; waiting for it", RankTag());
    MPI_Waitall(2, requests_, MPI_STATUSES_IGNORE);
  }
}

Status EpDispatcher::Fail(Status s) {
  state_ = State::kBroken;
  Log()->error("{}: {}", RankTag(), s.ToString());
  return s;
}

namespace {
int64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}
}  // namespace

void EpDispatcher::Posted() {
  posted_ns_ = NowNs();
  done_ns_ = 0;
}

Status EpDispatcher::WaitAll(const char* what) {
  const int64_t t0 = NowNs();
  const Status s = MpiStatus(MPI_Waitall(2, requests_, MPI_STATUSES_IGNORE), what);
  const int64_t t1 = NowNs();
  ++overlap_.exchanges;
  if (done_ns_ != 0) ++overlap_.completed_in_progress;
  overlap_.in_flight_seconds += static_cast<double>((done_ns_ != 0 ? done_ns_ : t1) - posted_ns_) * 1e-9;
  overlap_.exposed_seconds += static_cast<double>(t1 - t0) * 1e-9;
  return s;
}

Status EpDispatcher::StartDispatch(const void* hidden, int64_t n_tokens,
                                   std::span<const int32_t> topk_ids,
                                   std::span<const float> topk_weights) {
  if (state_ != State::kIdle) {
    return Status::FailedPrecondition("EP StartDispatch: the previous round was not combined");
  }
  if (n_tokens > 0 && hidden == nullptr) return Status::InvalidArgument("EP StartDispatch: null hidden");
  PDSERVE_RETURN_IF_ERROR(plan_.Build(layout_, options_.top_k, n_tokens, topk_ids, topk_weights));

  const size_t row_bytes = options_.dispatch_row_bytes;
  const int64_t rows = plan_.rows();
  send_hidden_.resize(rows * row_bytes);
  const auto* src = static_cast<const uint8_t*>(hidden);
  for (int64_t r = 0; r < rows; ++r) {
    std::memcpy(send_hidden_.data() + r * row_bytes, src + plan_.row_token()[r] * row_bytes, row_bytes);
  }

  const int p = size();
  recv_counts_.assign(p, 0);
  recv_displs_.assign(p, 0);
  // The receive side must know its counts before the data exchange can be posted; p ints are
  // cheap enough to exchange blocking.
  Status s = MpiStatus(MPI_Alltoall(plan_.counts().data(), 1, MPI_INT, recv_counts_.data(), 1, MPI_INT,
                                    comm_.get()),
                       "MPI_Alltoall (ep dispatch counts)");
  if (!s.ok()) return Fail(s);
  int64_t total = 0;
  for (int d = 0; d < p; ++d) {
    recv_displs_[d] = static_cast<int>(total);
    total += recv_counts_[d];
  }
  if (total > INT_MAX) return Fail(Status::Internal("EP dispatch: more than INT_MAX received rows"));
  recv_hidden_.resize(total * row_bytes);
  recv_meta_.resize(total * 2 * options_.top_k);

  s = MpiStatus(MPI_Ialltoallv(SendBuffer(send_hidden_), plan_.counts().data(), plan_.displs().data(),
                               row_.get(), RecvBuffer(recv_hidden_), recv_counts_.data(),
                               recv_displs_.data(), row_.get(), comm_.get(), &requests_[0]),
                "MPI_Ialltoallv (ep dispatch hidden)");
  if (!s.ok()) return Fail(s);
  s = MpiStatus(MPI_Ialltoallv(SendBuffer(plan_.meta()), plan_.counts().data(), plan_.displs().data(),
                               meta_.get(), RecvBuffer(recv_meta_), recv_counts_.data(),
                               recv_displs_.data(), meta_.get(), comm_.get(), &requests_[1]),
                "MPI_Ialltoallv (ep dispatch routing)");
  if (!s.ok()) return Fail(s);
  n_tokens_ = n_tokens;
  state_ = State::kDispatching;
  Posted();
  return Status::Ok();
}

Result<bool> EpDispatcher::Progress() {
  if (state_ != State::kDispatching && state_ != State::kCombining) return true;
  int done = 0;
  const Status s = MpiStatus(MPI_Testall(2, requests_, &done, MPI_STATUSES_IGNORE), "MPI_Testall (ep)");
  if (!s.ok()) return Fail(s);
  if (done != 0 && done_ns_ == 0) done_ns_ = NowNs();
  return done != 0;
}

Result<const EpReceived*> EpDispatcher::WaitDispatch() {
  if (state_ != State::kDispatching) {
    return Status::FailedPrecondition("EP WaitDispatch without a dispatch in flight");
  }
  const Status s = WaitAll("MPI_Waitall (ep dispatch)");
  if (!s.ok()) return Fail(s);

  // Unpack the routing records into local expert ids and weights.
  const int k = options_.top_k;
  const int64_t rows = static_cast<int64_t>(recv_hidden_.size() / options_.dispatch_row_bytes);
  const int first = layout_.FirstExpert(rank());
  const int n_local = layout_.experts_per_rank();
  recv_local_expert_.resize(rows * k);
  recv_weight_.resize(rows * k);
  for (int64_t r = 0; r < rows; ++r) {
    const uint32_t* rec = recv_meta_.data() + r * 2 * k;
    for (int j = 0; j < k; ++j) {
      const int32_t e = static_cast<int32_t>(rec[j]);
      if (e >= 0 && (e < first || e >= first + n_local)) {
        return Fail(Status::Internal(fmt::format(
            "EP dispatch: received expert {} but this rank owns [{}, {})", e, first, first + n_local)));
      }
      recv_local_expert_[r * k + j] = e < 0 ? -1 : e - first;
      float w;
      std::memcpy(&w, &rec[k + j], sizeof(w));
      recv_weight_[r * k + j] = w;
    }
  }
  by_expert_.Build(n_local, k, rows, recv_local_expert_, recv_weight_);

  received_ = EpReceived{};
  received_.rows = rows;
  received_.top_k = k;
  received_.first_expert = first;
  received_.n_local_experts = n_local;
  received_.hidden = recv_hidden_.data();
  received_.row_bytes = options_.dispatch_row_bytes;
  received_.local_expert = recv_local_expert_;
  received_.weight = recv_weight_;
  received_.rows_from = recv_counts_;
  received_.by_expert = &by_expert_;
  state_ = State::kDispatched;
  return &received_;
}

Status EpDispatcher::StartCombine(const void* expert_out) {
  if (state_ != State::kDispatched) {
    return Status::FailedPrecondition("EP StartCombine without a completed dispatch");
  }
  if (received_.rows > 0 && expert_out == nullptr) {
    return Status::InvalidArgument("EP StartCombine: null expert output");
  }
  combine_recv_.resize(plan_.rows() * combine_row_bytes());
  // The reverse exchange: rows go back to where they came from, so the counts swap roles.
  // A rank that received nothing may pass nullptr (or an empty vector's data()).
  const void* send = expert_out != nullptr && received_.rows > 0 ? expert_out : g_empty_send;
  const Status s = MpiStatus(
      MPI_Ialltoallv(send, recv_counts_.data(), recv_displs_.data(), combine_row_.get(),
                     RecvBuffer(combine_recv_), plan_.counts().data(), plan_.displs().data(),
                     combine_row_.get(), comm_.get(), &requests_[0]),
      "MPI_Ialltoallv (ep combine)");
  if (!s.ok()) return Fail(s);
  requests_[1] = MPI_REQUEST_NULL;
  state_ = State::kCombining;
  Posted();
  return Status::Ok();
}

Status EpDispatcher::WaitCombine(std::span<float> out, bool accumulate) {
  if (state_ != State::kCombining) {
    return Status::FailedPrecondition("EP WaitCombine without a combine in flight");
  }
  const int64_t hidden = options_.hidden;
  if (static_cast<int64_t>(out.size()) != n_tokens_ * hidden) {
    // Still in flight: the caller may retry with the right buffer.
    return Status::InvalidArgument(fmt::format("EP WaitCombine: out has {} floats, expected {} x {}",
                                               out.size(), n_tokens_, hidden));
  }
  const Status s = WaitAll("MPI_Waitall (ep combine)");
  if (!s.ok()) return Fail(s);
  if (!accumulate) std::fill(out.begin(), out.end(), 0.0f);
  // Rows are in destination-rank order, then token order: a fixed summation order per token.
  const int64_t rows = plan_.rows();
  const std::vector<int32_t>& token = plan_.row_token();
  if (options_.combine_dtype == DType::kF32) {
    const auto* src = reinterpret_cast<const float*>(combine_recv_.data());
    for (int64_t r = 0; r < rows; ++r) {
      float* dst = out.data() + token[r] * hidden;
      const float* row = src + r * hidden;
      for (int64_t i = 0; i < hidden; ++i) dst[i] += row[i];
    }
  } else {
    const auto* src = reinterpret_cast<const uint16_t*>(combine_recv_.data());
    for (int64_t r = 0; r < rows; ++r) {
      float* dst = out.data() + token[r] * hidden;
      const uint16_t* row = src + r * hidden;
      for (int64_t i = 0; i < hidden; ++i) dst[i] += Bf16ToF32(row[i]);
    }
  }
  ++rounds_;
  state_ = State::kIdle;
  return Status::Ok();
}

Result<const EpReceived*> EpDispatcher::Dispatch(const void* hidden, int64_t n_tokens,
                                                 std::span<const int32_t> topk_ids,
                                                 std::span<const float> topk_weights) {
  PDSERVE_RETURN_IF_ERROR(StartDispatch(hidden, n_tokens, topk_ids, topk_weights));
  return WaitDispatch();
}

Status EpDispatcher::Combine(const void* expert_out, std::span<float> out, bool accumulate) {
  PDSERVE_RETURN_IF_ERROR(StartCombine(expert_out));
  return WaitCombine(out, accumulate);
}

}  // namespace pdserve::comm
