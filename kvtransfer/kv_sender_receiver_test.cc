// KvSender + KvReceiver over InProcTransport: the protocol and its failure handling, fast and
// in one process (the same scenarios run across real processes over UCX in tests/kvtransfer).
//
// Timing: no check depends on how fast a loaded machine runs. Waits are for a condition (an
// event, a state, a count) with kHangLimit as the bound that turns a real hang into a failure;
// which path ended a transfer (dead peer seen at once vs. the deadline) is told by its status
// code, not by a stopwatch. Protocol timeouts are set long enough that a slow step before the
// fault is injected cannot run into them.
#include <gtest/gtest.h>

#include <cstring>
#include <thread>

#include "kvtransfer/block_allocator.h"
#include "kvtransfer/testing/inproc_transport.h"
#include "kvtransfer/kv_receiver.h"
#include "kvtransfer/kv_sender.h"
#include "kvtransfer/testing/fault_transport.h"
#include "kvtransfer/testing/kv_pattern.h"

namespace pdserve::kvtransfer {
namespace {

using namespace std::chrono_literals;
using testing::CheckDestination;
using testing::FaultTransport;
using testing::InProcFabric;
using testing::InProcTransport;
using testing::SourceCache;

constexpr uint64_t kSeed = 77;
constexpr uint32_t kPoolBlocks = 256;
// How long a wait may take before the test calls it a hang (far above any loaded-machine delay).
constexpr auto kHangLimit = 60s;

class SenderReceiverTest : public ::testing::Test {
 protected:
  void Init(const KvLayout& decode_layout, int num_prefill, KvReceiverOptions options = {}) {
    layout_ = decode_layout;
    decode_ = InProcTransport::Create(fabric_).value();
    for (int i = 0; i < num_prefill; ++i) {
      prefill_.push_back(InProcTransport::Create(fabric_).value());
      faults_.push_back(std::make_unique<FaultTransport>(prefill_.back().get()));
    }
    region_ = decode_->AllocateRegion(kPoolBlocks * layout_.BlockBytes()).value();
    std::memset(region_->data(), 0xee, region_->size());
    allocator_ = std::make_unique<FreeListBlockAllocator>(kPoolBlocks);
    receiver_ = KvReceiver::Create(decode_.get(),
                                   ReceiverBlockPool{region_.get(), 0, layout_, allocator_.get()},
                                   options)
                    .value();
    for (int i = 0; i < num_prefill; ++i) {
      senders_.push_back(KvSender::Create(faults_[i].get()).value());
    }
  }

  ReceiverEvent WaitEvent(uint64_t request_id, std::chrono::milliseconds timeout = kHangLimit) {
    const Deadline deadline = Clock::now() + timeout;
    while (true) {
      for (const ReceiverEvent& e : receiver_->TakeEvents()) pending_.push_back(e);
      for (auto it = pending_.begin(); it != pending_.end(); ++it) {
        if (it->request_id == request_id) {
          ReceiverEvent e = *it;
          pending_.erase(it);
          return e;
        }
      }
      if (!receiver_->WaitForEvents(deadline)) {
        ADD_FAILURE() << "no event for request " << request_id;
        return ReceiverEvent{request_id, TransferState::kReserved, Status::Internal("timeout")};
      }
    }
  }

  // Polls until the request reaches `state` (false after kHangLimit).
  bool WaitForState(uint64_t request_id, TransferState state) {
    const Deadline deadline = Clock::now() + kHangLimit;
    while (Clock::now() < deadline) {
      auto current = receiver_->State(request_id);
      if (current.ok() && current.value() == state) return true;
      std::this_thread::sleep_for(1ms);
    }
    return false;
  }

  void ExpectAllBlocksBack() {
    EXPECT_TRUE(receiver_->WaitUntilIdle(Clock::now() + kHangLimit).ok());
    EXPECT_EQ(allocator_->num_free(), kPoolBlocks);
    EXPECT_EQ(receiver_->Stats().held_blocks, 0u);
  }

  std::shared_ptr<InProcFabric> fabric_ = std::make_shared<InProcFabric>();
  KvLayout layout_;
  std::unique_ptr<InProcTransport> decode_;
  std::vector<std::unique_ptr<InProcTransport>> prefill_;
  std::vector<std::unique_ptr<FaultTransport>> faults_;
  std::unique_ptr<LocalRegion> region_;
  std::unique_ptr<FreeListBlockAllocator> allocator_;
  std::unique_ptr<KvReceiver> receiver_;
  std::vector<std::unique_ptr<KvSender>> senders_;
  std::vector<ReceiverEvent> pending_;
};

TEST_F(SenderReceiverTest, ContextParallelRanksWithOtherBlockSizes) {
  Init(KvLayout::DeepSeekV32(3, 16), 4);
  uint64_t request_id = 1;
  for (uint32_t cp : {1u, 2u, 4u}) {
    for (uint32_t n : {1u, 17u, 300u}) {
      const uint64_t id = request_id++;
      std::vector<std::vector<TokenRange>> holdings;
      for (uint32_t r = 0; r < cp; ++r) holdings.push_back({ContiguousCpSlice(n, cp, r)});
      auto desc = receiver_->Reserve(id, n, AssignWriters(n, holdings).value());
      ASSERT_TRUE(desc.ok()) << desc.status().ToString();
      std::vector<std::unique_ptr<SourceCache>> caches;
      for (uint32_t r = 0; r < cp; ++r) {
        caches.push_back(std::make_unique<SourceCache>(layout_.WithTokensPerBlock(64),
                                                       holdings[r], kSeed, id));
        ASSERT_TRUE(senders_[r]->Start(desc.value(), r, caches[r]->source()).ok());
      }
      for (uint32_t l = 0; l < layout_.num_layers; ++l) {
        for (uint32_t r = 0; r < cp; ++r) ASSERT_TRUE(senders_[r]->WriteLayers(id, l).ok());
      }
      for (uint32_t r = 0; r < cp; ++r) {
        Status s = senders_[r]->Finish(id);
        ASSERT_TRUE(s.ok()) << "cp " << cp << " n " << n << " rank " << r << ": " << s.ToString();
      }
      ReceiverEvent e = WaitEvent(id);
      ASSERT_EQ(e.state, TransferState::kComplete) << e.status.ToString();
      EXPECT_TRUE(CheckDestination(desc.value(), region_->data(), {{0, n}}, kSeed).ok());
      auto blocks = receiver_->HandOver(id);
      ASSERT_TRUE(blocks.ok());
      EXPECT_EQ(blocks.value(), desc->block_ids);
      allocator_->Free(blocks.value());
    }
  }
  ExpectAllBlocksBack();
  EXPECT_EQ(receiver_->Stats().digest_failures, 0u);
}

// Progress: the layers queued so far and the bytes whose writes completed (what a layer-wise
// prefill reports as landed while it still computes); gone once the request finished.
TEST_F(SenderReceiverTest, ProgressCountsQueuedLayersAndWrittenBytes) {
  Init(KvLayout::DeepSeekV32(3, 16), 1);
  const uint32_t n = 40;
  auto desc = receiver_->Reserve(21, n, AssignWriters(n, {{{0, n}}}).value());
  ASSERT_TRUE(desc.ok()) << desc.status().ToString();
  SourceCache cache(layout_.WithTokensPerBlock(64), {{0, n}}, kSeed, 21);
  ASSERT_TRUE(senders_[0]->Start(desc.value(), 0, cache.source()).ok());
  auto p = senders_[0]->Progress(21);
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->layers_queued, 0u);
  EXPECT_EQ(p->bytes_submitted, 0u);
  auto written = [&](uint64_t want) {
    const Deadline deadline = Clock::now() + kHangLimit;
    while (Clock::now() < deadline) {
      auto q = senders_[0]->Progress(21);
      if (q.ok() && q->bytes_written == want) return true;
      std::this_thread::sleep_for(1ms);
    }
    return false;
  };
  ASSERT_TRUE(senders_[0]->WriteLayers(21, 0).ok());
  p = senders_[0]->Progress(21);
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->layers_queued, 1u);
  const uint64_t layer_bytes = p->bytes_submitted;
  EXPECT_EQ(layer_bytes, uint64_t{n} * layout_.TokenBytesPerLayer());
  EXPECT_TRUE(written(layer_bytes));
  ASSERT_TRUE(senders_[0]->WriteLayers(21, 1, 2).ok());
  EXPECT_TRUE(written(3 * layer_bytes));
  EXPECT_EQ(senders_[0]->Progress(21)->layers_queued, 3u);
  ASSERT_TRUE(senders_[0]->Finish(21).ok());
  EXPECT_EQ(senders_[0]->Progress(21).status().code(), StatusCode::kNotFound);
  ASSERT_EQ(WaitEvent(21).state, TransferState::kComplete);
  auto blocks = receiver_->HandOver(21);
  ASSERT_TRUE(blocks.ok());
  allocator_->Free(blocks.value());
  ExpectAllBlocksBack();
}

TEST_F(SenderReceiverTest, ReplicatedRanksWriteOnce) {
  Init(KvLayout::DeepSeekV32(2, 32), 2);
  const uint32_t n = 100;
  auto writers = AssignWriters(n, {{{0, n}}, {{0, n}}}).value();
  ASSERT_EQ(writers.size(), 1u);
  auto desc = receiver_->Reserve(9, n, writers);
  ASSERT_TRUE(desc.ok());
  SourceCache cache(layout_, {{0, n}}, kSeed, 9);
  for (int r = 0; r < 2; ++r) ASSERT_TRUE(senders_[r]->Start(desc.value(), r, cache.source()).ok());
  for (int r = 0; r < 2; ++r) ASSERT_TRUE(senders_[r]->Finish(9).ok());
  EXPECT_GT(senders_[0]->Stats().bytes_submitted, 0u);
  EXPECT_EQ(senders_[1]->Stats().bytes_submitted, 0u);
  EXPECT_EQ(prefill_[1]->Stats().bytes_written, 0u);
  ASSERT_EQ(WaitEvent(9).state, TransferState::kComplete);
  allocator_->Free(receiver_->HandOver(9).value());
  ExpectAllBlocksBack();
}

TEST_F(SenderReceiverTest, LeaseExpiresWhenNoPrefillBegins) {
  KvReceiverOptions options;
  options.quarantine_grace = 20ms;
  Init(KvLayout::DeepSeekV32(2, 16), 1, options);
  auto desc = receiver_->Reserve(3, 100, {WriterAssignment{0, {{0, 100}}}}, 50ms);
  ASSERT_TRUE(desc.ok());
  // The blocks were taken (the lease may already be over on a loaded machine: no pool check).
  EXPECT_EQ(desc->block_ids.size(), layout_.BlocksForTokens(100));
  ReceiverEvent e = WaitEvent(3);
  EXPECT_EQ(e.state, TransferState::kAborted);
  EXPECT_EQ(e.status.code(), StatusCode::kAborted);
  ExpectAllBlocksBack();
  // A prefill that gets the stale descriptor refuses it (its lease is over).
  SourceCache cache(layout_, {{0, 100}}, kSeed, 3);
  EXPECT_EQ(senders_[0]->Start(desc.value(), 0, cache.source()).code(),
            StatusCode::kDeadlineExceeded);
}

TEST_F(SenderReceiverTest, StalledWritesHitTheDeadlineOnBothSides) {
  KvReceiverOptions options;
  options.transfer_timeout = 1s;  // layer 0 must be queued before it (no stall yet)
  options.quarantine_grace = 50ms;
  Init(KvLayout::DeepSeekV32(2, 16), 1, options);
  auto desc = receiver_->Reserve(4, 64, {WriterAssignment{0, {{0, 64}}}});
  ASSERT_TRUE(desc.ok());
  SourceCache cache(layout_, {{0, 64}}, kSeed, 4);
  ASSERT_TRUE(senders_[0]->Start(desc.value(), 0, cache.source()).ok());
  ASSERT_TRUE(senders_[0]->WriteLayers(4, 0).ok());
  prefill_[0]->HoldWrites(true);  // the network stalls
  ASSERT_TRUE(senders_[0]->WriteLayers(4, 1).ok());
  // Finish returns at the deadline (a hang would run into the ctest timeout; the status says
  // the deadline, not some other path, ended it).
  Status s = senders_[0]->Finish(4);
  EXPECT_EQ(s.code(), StatusCode::kDeadlineExceeded) << s.ToString();
  ReceiverEvent e = WaitEvent(4);
  EXPECT_EQ(e.state, TransferState::kAborted);
  EXPECT_EQ(e.status.code(), StatusCode::kDeadlineExceeded) << e.status.ToString();
  ExpectAllBlocksBack();
  EXPECT_EQ(prefill_[0]->Stats().pending_batches, 0u);
  EXPECT_EQ(senders_[0]->Stats().active_requests, 0u);
}

TEST_F(SenderReceiverTest, DecodeAbortStopsTheWriterAndFreesBlocks) {
  Init(KvLayout::DeepSeekV32(2, 16), 1);
  auto desc = receiver_->Reserve(5, 64, {WriterAssignment{0, {{0, 64}}}});
  ASSERT_TRUE(desc.ok());
  SourceCache cache(layout_, {{0, 64}}, kSeed, 5);
  ASSERT_TRUE(senders_[0]->Start(desc.value(), 0, cache.source()).ok());
  ASSERT_TRUE(senders_[0]->WriteLayers(5, 0).ok());
  // Wait until the receiver saw `begin` (the writer is known), then abort.
  ASSERT_TRUE(WaitForState(5, TransferState::kWriting));
  ASSERT_TRUE(receiver_->Abort(5, Status::Cancelled("client went away")).ok());
  ReceiverEvent e = WaitEvent(5);
  EXPECT_EQ(e.state, TransferState::kAborted);
  Status s = senders_[0]->Finish(5);
  EXPECT_EQ(s.code(), StatusCode::kCancelled) << s.ToString();
  ExpectAllBlocksBack();
}

TEST_F(SenderReceiverTest, TornTransferIsDataLossNotServed) {
  Init(KvLayout::DeepSeekV32(2, 16), 1);
  auto desc = receiver_->Reserve(6, 100, {WriterAssignment{0, {{0, 100}}}});
  ASSERT_TRUE(desc.ok());
  SourceCache cache(layout_.WithTokensPerBlock(32), {{0, 100}}, kSeed, 6);
  faults_[0]->set_drop_writes(1);  // layer 0 loses a write
  ASSERT_TRUE(senders_[0]->Start(desc.value(), 0, cache.source()).ok());
  Status s = senders_[0]->Finish(6);
  EXPECT_EQ(s.code(), StatusCode::kDataLoss) << s.ToString();
  ReceiverEvent e = WaitEvent(6);
  EXPECT_EQ(e.state, TransferState::kAborted);
  EXPECT_EQ(e.status.code(), StatusCode::kDataLoss);
  EXPECT_EQ(receiver_->HandOver(6).status().code(), StatusCode::kNotFound);
  EXPECT_EQ(receiver_->Stats().digest_failures, 1u);
  ExpectAllBlocksBack();
}

TEST_F(SenderReceiverTest, DescriptorOutsideTheRegionIsRejectedBeforeAnyWrite) {
  Init(KvLayout::DeepSeekV32(2, 16), 1);
  auto desc = receiver_->Reserve(7, 40, {WriterAssignment{0, {{0, 40}}}});
  ASSERT_TRUE(desc.ok());
  std::vector<uint8_t> before(region_->data(), region_->data() + region_->size());
  KvDescriptor bad = desc.value();
  bad.block_addresses[2] = bad.region.base_address + bad.region.length - 64;
  SourceCache cache(layout_, {{0, 40}}, kSeed, 7);
  EXPECT_EQ(senders_[0]->Start(bad, 0, cache.source()).code(), StatusCode::kInvalidArgument);
  ReceiverEvent e = WaitEvent(7);  // the prefill told the decode side: blocks come back now
  EXPECT_EQ(e.state, TransferState::kAborted);
  EXPECT_EQ(e.status.code(), StatusCode::kInvalidArgument);
  ExpectAllBlocksBack();
  EXPECT_EQ(std::memcmp(before.data(), region_->data(), before.size()), 0);
  EXPECT_EQ(prefill_[0]->Stats().bytes_written, 0u);
}

TEST_F(SenderReceiverTest, DeadDecodeFailsThePrefillFast) {
  KvReceiverOptions options;
  // Long enough that a loaded machine still sees the dead peer before the deadline; it also
  // bounds the (killed) receiver's own shutdown.
  options.transfer_timeout = 2s;
  options.quarantine_grace = 50ms;
  Init(KvLayout::DeepSeekV32(2, 16), 1, options);
  auto desc = receiver_->Reserve(8, 64, {WriterAssignment{0, {{0, 64}}}});
  ASSERT_TRUE(desc.ok());
  SourceCache cache(layout_, {{0, 64}}, kSeed, 8);
  ASSERT_TRUE(senders_[0]->Start(desc.value(), 0, cache.source()).ok());
  decode_->Kill();
  // Fast = the dead peer is seen as such (kUnavailable), not waited out until the deadline
  // (which would end the transfer with kDeadlineExceeded).
  Status s = senders_[0]->Finish(8);
  EXPECT_EQ(s.code(), StatusCode::kUnavailable) << s.ToString();
  EXPECT_EQ(prefill_[0]->Stats().pending_batches, 0u);
  EXPECT_EQ(prefill_[0]->Stats().remote_keys, 0u);
}

TEST_F(SenderReceiverTest, DeadPrefillIsCaughtByTheDeadline) {
  KvReceiverOptions options;
  options.transfer_timeout = 1s;  // the writer must reach kWriting before it
  options.quarantine_grace = 50ms;
  Init(KvLayout::DeepSeekV32(2, 16), 1, options);
  auto desc = receiver_->Reserve(10, 64, {WriterAssignment{0, {{0, 64}}}});
  ASSERT_TRUE(desc.ok());
  SourceCache cache(layout_, {{0, 64}}, kSeed, 10);
  ASSERT_TRUE(senders_[0]->Start(desc.value(), 0, cache.source()).ok());
  ASSERT_TRUE(senders_[0]->WriteLayers(10, 0).ok());
  ASSERT_TRUE(WaitForState(10, TransferState::kWriting));
  prefill_[0]->Kill();
  ReceiverEvent e = WaitEvent(10);
  EXPECT_EQ(e.state, TransferState::kAborted);
  // Found dead when the receiver connects back, or else by the writer's deadline.
  EXPECT_TRUE(e.status.code() == StatusCode::kDeadlineExceeded ||
              e.status.code() == StatusCode::kUnavailable)
      << e.status.ToString();
  ExpectAllBlocksBack();
}

TEST_F(SenderReceiverTest, ReserveErrors) {
  KvReceiverOptions options;
  options.quarantine_grace = 50ms;
  Init(KvLayout::DeepSeekV32(2, 16), 1, options);
  EXPECT_EQ(receiver_->Reserve(1, 0, {}).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(receiver_->Reserve(1, 10, {WriterAssignment{0, {{0, 9}}}}).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(receiver_->Reserve(1, 16 * kPoolBlocks + 1, {WriterAssignment{0, {{0, 16 * kPoolBlocks + 1}}}})
                .status()
                .code(),
            StatusCode::kResourceExhausted);
  ASSERT_TRUE(receiver_->Reserve(1, 10, {WriterAssignment{0, {{0, 10}}}}).ok());
  EXPECT_EQ(receiver_->Reserve(1, 10, {WriterAssignment{0, {{0, 10}}}}).status().code(),
            StatusCode::kAlreadyExists);
  EXPECT_EQ(receiver_->HandOver(1).status().code(), StatusCode::kFailedPrecondition);
  ASSERT_TRUE(receiver_->Abort(1, Status::Cancelled("test")).ok());
  ExpectAllBlocksBack();
}

}  // namespace
}  // namespace pdserve::kvtransfer
