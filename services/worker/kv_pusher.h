// KvPusher: the holder side of a pull (docs/prefix-cache.md "Pulls"). Another worker lacks a
// prefix this worker's prefix cache holds; the router forwards that worker's reservation here
// (KvPushMsg), and the pusher writes the cached blocks into it over the KV transfer layer, as a
// prefill worker writes a prompt's KV into a decode worker's blocks:
//
//   Push(msg) checks the namespace and the descriptor and queues the push -> the pusher's thread
//   pins the prefix (Engine::PinCachedPrefix: the blocks cannot be evicted or rewritten while
//   pinned), KvSender::Start + Finish over the pinned blocks, then unpins them.
//
// A push that cannot be served (the blocks were evicted since the router's index saw them, a bad
// descriptor, a transfer failure) is reported with kvPushFailed: the puller computes the prefix
// instead. Nothing here can make the puller use wrong bytes: it adopts the blocks only after the
// transfer layer verified them, and a block is pinned before its bytes are read.
//
// Threading: Push runs on the agent's thread and only queues; one std::jthread member serves the
// queue, one push at a time (a push writes a few MB; KvSender::Finish bounds each by the
// descriptor's transfer timeout). Ownership: the host and the sender are borrowed and must
// outlive the pusher; the destructor stops the thread (waiting for a push in progress).
#pragma once

#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>

#include "kvtransfer/kv_sender.h"
#include "services/control/control_messages.h"
#include "services/worker/engine_host.h"

namespace pdserve::services::worker {

class KvPusher {
 public:
  KvPusher(EngineHost* host, kvtransfer::KvSender* sender);
  ~KvPusher();
  KvPusher(const KvPusher&) = delete;
  KvPusher& operator=(const KvPusher&) = delete;

  // Errors (the agent answers kvPushFailed with them): FailedPrecondition (the prefix cache is
  // off, or the puller's namespace differs), InvalidArgument (a descriptor that does not
  // decode, validate or match the push's tokens).
  Status Push(const KvPushMsg& push);

 private:
  struct Queued {
    KvPushMsg msg;
    kvtransfer::KvDescriptor descriptor;
  };
  void Loop(std::stop_token stop);
  // Writes one push; returns why it failed (the caller reports it).
  Status Run(const Queued& push);

  EngineHost* const host_;
  kvtransfer::KvSender* const sender_;
  std::mutex mu_;
  std::condition_variable_any cv_;
  std::deque<Queued> queue_;
  std::jthread thread_;  // last member: stopped and joined first
};

}  // namespace pdserve::services::worker
