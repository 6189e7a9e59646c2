// KvPusher (kv_pusher.h): pin, write, unpin.
#include "services/worker/kv_pusher.h"

#include <fmt/format.h>

#include "kvtransfer/kv_wire.h"
#include "kvtransfer/transfer_plan.h"
#include "services/common/request_log.h"

namespace pdserve::services::worker {

KvPusher::KvPusher(EngineHost* host, kvtransfer::KvSender* sender) : host_(host), sender_(sender) {
  thread_ = std::jthread([this](std::stop_token st) { Loop(st); });
}

KvPusher::~KvPusher() { thread_ = {}; }

Status KvPusher::Push(const KvPushMsg& push) {
  const uint64_t ns = host_->kv_namespace();
  if (ns == 0) return Status::FailedPrecondition("this worker's prefix cache is off");
  if (push.kv_namespace != ns)
    return Status::FailedPrecondition(
        fmt::format("the puller's KV namespace {:x} is not this worker's {:x}", push.kv_namespace, ns));
  PDSERVE_ASSIGN_OR_RETURN(kvtransfer::KvDescriptor d, kvtransfer::DecodeDescriptor(push.descriptor));
  PDSERVE_RETURN_IF_ERROR(d.Validate());
  const uint32_t B = host_->kv_layout().tokens_per_block;
  if (d.num_tokens != push.num_tokens || push.first_token % B != 0 || push.num_tokens % B != 0 ||
      push.num_tokens == 0)
    return Status::InvalidArgument(fmt::format("a pull of tokens [{}, +{}) with a {}-token descriptor is not whole "
                                               "blocks of {}",
                                               push.first_token, push.num_tokens, d.num_tokens, B));
  if (!d.layout.SameTokenFormat(host_->kv_layout()))
    return Status::InvalidArgument("the puller's KV layout " + d.layout.ToString() + " differs from this worker's " +
                                   host_->kv_layout().ToString());
  std::lock_guard<std::mutex> lock(mu_);
  queue_.push_back({push, std::move(d)});
  cv_.notify_all();
  return Status::Ok();
}

void KvPusher::Loop(std::stop_token stop) {
  while (true) {
    Queued push;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, stop, [this] { return !queue_.empty(); });
      if (stop.stop_requested()) return;
      push = std::move(queue_.front());
      queue_.pop_front();
    }
    const Status s = Run(push);
    if (EngineWorkerMetrics* em = host_->metrics()) (s.ok() ? em->pushes_ok : em->pushes_failed).Increment();
    if (!s.ok()) {
      RequestLog("worker", push.msg.request_tag).Info("pull of {} tokens not served: {}", push.msg.num_tokens, s.ToString());
      host_->SendKvPushFailed({push.msg.request_id, s.ToString()});
    }
  }
}

Status KvPusher::Run(const Queued& push) {
  engine::Engine& engine = host_->engine();
  const engine::BlockPool& pool = engine.pool();
  const uint32_t B = host_->kv_layout().tokens_per_block;
  const int64_t first_block = push.msg.first_token / B;
  const int64_t end_block = first_block + push.msg.num_tokens / B;
  const std::vector<int32_t> pinned = engine.PinCachedPrefix(push.msg.tokens, end_block);
  Status s;
  if (static_cast<int64_t>(pinned.size()) < end_block) {
    s = Status::NotFound(fmt::format("this worker's cache holds {} of the {} tokens asked for now",
                                     pinned.size() * B, end_block * B));
  } else {
    kvtransfer::KvSource source;
    source.layout = host_->kv_layout();
    kvtransfer::SourceRun run;
    run.tokens = {0, push.msg.num_tokens};
    for (int64_t j = first_block; j < end_block; ++j)
      run.blocks.push_back(pool.base() + static_cast<int64_t>(pinned[static_cast<size_t>(j)]) * pool.block_bytes());
    source.runs.push_back(std::move(run));
    s = sender_->Start(push.descriptor, 0, std::move(source));
    // Every layer, the completion notice and the puller's verdict (digest checked there).
    if (s.ok()) s = sender_->Finish(push.descriptor.request_id);
  }
  engine.UnpinBlocks(pinned);
  return s;
}

}  // namespace pdserve::services::worker
