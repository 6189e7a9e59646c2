// PrefixPuller (prefix_puller.h): reserve, announce, adopt or give back.
#include "services/worker/prefix_puller.h"

#include <algorithm>

#include <fmt/format.h>

#include "kvtransfer/kv_wire.h"
#include "services/common/request_log.h"

namespace pdserve::services::worker {

Result<std::unique_ptr<PrefixPuller>> PrefixPuller::Create(EngineHost* host) {
  std::unique_ptr<PrefixPuller> p(new PrefixPuller(host));
  p->allocator_ = std::make_unique<ImportAllocator>(&host->engine().pool(),
                                                    [raw = p.get()](uint64_t pull_id) { raw->OnBlocksFreed(pull_id); });
  kvtransfer::ReceiverBlockPool pool;
  pool.region = host->region();
  pool.first_block_offset = static_cast<uint64_t>(host->engine().pool().base() - host->region()->data());
  pool.layout = host->kv_layout();
  pool.allocator = p->allocator_.get();
  kvtransfer::KvReceiverOptions ro;
  ro.lease = host->config().kv_pull_lease;
  ro.transfer_timeout = host->config().kv_transfer_timeout;
  PDSERVE_ASSIGN_OR_RETURN(p->receiver_, kvtransfer::KvReceiver::Create(host->transport(), pool, ro));
  p->thread_ = std::jthread([raw = p.get()](std::stop_token st) { raw->Loop(st); });
  p->start_thread_ = std::jthread([raw = p.get()](std::stop_token st) { raw->StartLoop(st); });
  return p;
}

PrefixPuller::~PrefixPuller() {
  start_thread_ = {};
  thread_ = {};
  receiver_.reset();  // aborts what is pending; failed pulls' blocks come back through OnBlocksFreed
  allocator_.reset();
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& [id, pull] : pulls_)
    if (!pull.blocks.empty()) host_->engine().UnpinBlocks(pull.blocks);
  pulls_.clear();
}

bool PrefixPuller::Begin(const JobMsg& job, std::function<void()> on_done) {
  if (job.pull_tokens == 0 || !host_->engine().accepts_pulls()) return false;
  Queued q;
  q.job_id = job.request_id;
  q.tag = job.request_tag;
  // Only what a pull may cover: never the prompt's last token (its row gives the first token's
  // logits).
  const size_t pullable = std::min<size_t>(job.pull_tokens, job.prompt.empty() ? 0 : job.prompt.size() - 1);
  q.prefix.assign(job.prompt.begin(), job.prompt.begin() + static_cast<std::ptrdiff_t>(pullable));
  q.holder = job.pull_worker_id;
  q.on_done = std::move(on_done);
  std::lock_guard<std::mutex> lock(mu_);
  queue_.push_back(std::move(q));
  queue_cv_.notify_all();
  return true;
}

void PrefixPuller::StartLoop(std::stop_token stop) {
  while (true) {
    Queued q;
    bool cancelled = false;
    {
      std::unique_lock<std::mutex> lock(mu_);
      queue_cv_.wait(lock, stop, [this] { return !queue_.empty(); });
      if (stop.stop_requested()) return;
      q = std::move(queue_.front());
      queue_.pop_front();
      cancelled = cancelled_.erase(q.job_id) > 0;
    }
    // Start takes on_done into the pull it begins; without a pull the job goes on at once. (An
    // abort that races the start costs only the pull: the job is gone when its on_done runs.)
    std::function<void()> on_done = q.on_done;
    if (cancelled || !Start(q)) on_done();
  }
}

bool PrefixPuller::Start(Queued& q) {
  engine::Engine& engine = host_->engine();
  const int64_t B = host_->kv_layout().tokens_per_block;
  // Whole blocks of the pullable prefix.
  const int64_t end_block = static_cast<int64_t>(q.prefix.size()) / B;
  std::vector<int32_t> tokens(q.prefix.begin(), q.prefix.begin() + end_block * B);
  const int64_t first_block = engine.CachedPrefixBlocks(tokens, end_block);
  if (first_block >= end_block) return false;
  const int64_t count = end_block - first_block;
  auto blocks = engine.AllocatePullBlocks(count);
  auto log = RequestLog("worker", q.tag);
  if (!blocks.ok()) {
    log.Info("job {}: no pull ({}): computing the prefix", q.job_id, blocks.status().ToString());
    return false;
  }
  const uint64_t pull_id = PullId(q.job_id);
  const auto n = static_cast<uint32_t>(count * B);
  {
    // The entry exists before the receiver can report on it.
    std::lock_guard<std::mutex> lock(mu_);
    Pull& p = pulls_[pull_id];
    p.job_id = q.job_id;
    p.tag = q.tag;
    p.tokens = std::move(tokens);
    p.first_block = first_block;
    p.blocks = *blocks;
    p.on_done = std::move(q.on_done);
    p.began_at = std::chrono::steady_clock::now();
  }
  allocator_->Stage(pull_id, std::vector<uint32_t>(blocks->begin(), blocks->end()));
  // One writer: the holder, rank 0 of its instance.
  auto descriptor = receiver_->Reserve(pull_id, n, {kvtransfer::WriterAssignment{0, {{0, n}}}},
                                       host_->config().kv_pull_lease);
  allocator_->Unstage();
  if (!descriptor.ok()) {
    log.Info("job {}: no pull ({}): computing the prefix", q.job_id, descriptor.status().ToString());
    std::lock_guard<std::mutex> lock(mu_);
    engine.UnpinBlocks(pulls_[pull_id].blocks);
    pulls_.erase(pull_id);
    return false;
  }
  log.Debug("job {}: pulling tokens [{}, {}) from {}", q.job_id, first_block * B, end_block * B, q.holder);
  KvPullMsg pull;
  pull.request_id = q.job_id;
  pull.descriptor = kvtransfer::EncodeDescriptor(*descriptor);
  pull.first_token = static_cast<uint32_t>(first_block * B);
  pull.num_tokens = n;
  pull.kv_namespace = host_->kv_namespace();
  host_->SendKvPull(std::move(pull));
  return true;
}

void PrefixPuller::Fail(uint64_t job_id, const Status& why) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const Queued& q : queue_)
      if (q.job_id == job_id) {
        cancelled_.insert(job_id);  // the start thread skips it and runs its on_done
        return;
      }
  }
  // Not pending any more (complete, or already aborted): its event is handled or on its way.
  (void)receiver_->Abort(PullId(job_id), why);
}

void PrefixPuller::OnBlocksFreed(uint64_t pull_id) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = pulls_.find(pull_id);
  if (it == pulls_.end()) return;
  host_->engine().UnpinBlocks(it->second.blocks);
  it->second.blocks.clear();
  if (!it->second.on_done) pulls_.erase(it);
}

void PrefixPuller::Loop(std::stop_token stop) {
  while (!stop.stop_requested()) {
    receiver_->WaitForEvents(kvtransfer::Clock::now() + std::chrono::milliseconds(100));
    for (const kvtransfer::ReceiverEvent& ev : receiver_->TakeEvents()) {
      Pull done;
      {
        std::lock_guard<std::mutex> lock(mu_);
        auto it = pulls_.find(ev.request_id);
        if (it == pulls_.end()) continue;
        done.job_id = it->second.job_id;
        done.tag = it->second.tag;
        done.first_block = it->second.first_block;
        done.began_at = it->second.began_at;
        done.on_done = std::move(it->second.on_done);
        it->second.on_done = nullptr;
        if (ev.state == kvtransfer::TransferState::kComplete) {
          // Verified: the blocks are ours to adopt (below, outside the lock: the receiver may
          // call OnBlocksFreed under its own).
          done.tokens = std::move(it->second.tokens);
          done.blocks = std::move(it->second.blocks);
          pulls_.erase(it);
        } else if (it->second.blocks.empty()) {
          pulls_.erase(it);  // already given back
        }
        // A failed pull keeps its blocks until the receiver frees them (OnBlocksFreed).
      }
      const int64_t B = host_->kv_layout().tokens_per_block;
      const int64_t asked_tokens = static_cast<int64_t>(done.blocks.size()) * B;
      int64_t adopted_tokens = 0;
      if (!done.blocks.empty()) {
        auto handed = receiver_->HandOver(ev.request_id);
        if (handed.ok() && !handed->empty()) allocator_->Forget(handed->front());
        if (handed.ok()) {
          // Adopted blocks become cached; the rest go back to the pool (the engine takes every
          // reference either way).
          adopted_tokens = host_->engine().AdoptPulledBlocks(done.tokens, done.first_block, done.blocks);
        } else {
          // Not expected for a request reported complete; the receiver still owns the blocks
          // and gives them back through OnBlocksFreed.
          std::lock_guard<std::mutex> lock(mu_);
          Pull& p = pulls_[ev.request_id];
          p.job_id = done.job_id;
          p.blocks = done.blocks;
        }
      }
      const bool adopted = adopted_tokens > 0;
      if (EngineWorkerMetrics* em = host_->metrics()) (adopted ? em->pulls_adopted : em->pulls_failed).Increment();
      const double ms = std::chrono::duration<double>(std::chrono::steady_clock::now() - done.began_at).count() * 1e3;
      if (adopted) {
        RequestLog("worker", done.tag).Debug("job {}: pulled {} of {} tokens in {:.1f} ms", done.job_id, adopted_tokens,
                                             asked_tokens, ms);
      } else {
        RequestLog("worker", done.tag).Info("job {}: pull failed after {:.1f} ms ({}): computing the prefix",
                                            done.job_id, ms,
                                            ev.status.ok() ? std::string("nothing adopted") : ev.status.ToString());
      }
      if (done.on_done) done.on_done();
    }
  }
}

}  // namespace pdserve::services::worker
