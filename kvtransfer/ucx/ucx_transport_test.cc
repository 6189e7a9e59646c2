// UcxTransport between two transports of one process, over UCX tcp (loopback) and shm.
// (tests/kvtransfer runs the full protocol across real processes.)
#include "kvtransfer/ucx/ucx_transport.h"

#include <gtest/gtest.h>

#include <filesystem>

#include <cstring>
#include <future>
#include <random>

namespace pdserve::kvtransfer {
namespace {

using namespace std::chrono_literals;

// "tcp": writes as active messages (the default for tcp); "tcp_put": UCX's emulated put.
UcxTransportOptions OptionsFor(const std::string& param) {
  UcxTransportOptions options;
  const bool tcp = param.rfind("tcp", 0) == 0;
  options.context.tls = tcp ? "tcp" : param;
  if (tcp) options.context.net_devices = "lo";
  if (param == "tcp_put") options.write_protocol = WriteProtocol::kPut;
  options.max_chunk_bytes = 1 << 20;  // exercise chunking
  return options;
}

Status SubmitAndWait(Transport& t, RmaKind kind, const std::string& peer,
                     const RemoteRegionDesc& region, std::vector<RmaOp> ops,
                     std::chrono::milliseconds timeout = 5000ms) {
  auto done = std::make_shared<std::promise<Status>>();
  Status submitted = t.Submit(kind, peer, region, std::move(ops), Clock::now() + timeout,
                              [done](const Status& s) { done->set_value(s); });
  if (!submitted.ok()) return submitted;
  auto future = done->get_future();
  if (future.wait_for(timeout + 5s) != std::future_status::ready) {
    return Status::Internal("callback never ran");
  }
  return future.get();
}

class UcxTransportTest : public ::testing::TestWithParam<std::string> {
 protected:
  // Sends a flush-ordered message from a_ and waits until b_'s handler ran: from then on the
  // writes a_ issued before are visible to b_ (the completion-notice guarantee).
  void FlushAndWaitForDelivery() {
    auto delivered = std::make_shared<std::promise<void>>();
    ASSERT_TRUE(b_->RegisterClient(5, [delivered](std::string_view, std::string_view) {
                     delivered->set_value();
                   }, nullptr).ok());
    ASSERT_TRUE(a_->SendMessage(b_->address(), 5, "flush", true, Clock::now() + 5s, nullptr).ok());
    EXPECT_EQ(delivered->get_future().wait_for(10s), std::future_status::ready);
    b_->UnregisterClient(5);
  }

  void SetUp() override {
    // UCX's tcp transport enumerates interfaces through /sys/class/net; a root without sysfs
    // (a bare chroot) has no usable tcp device at all.
    if (GetParam().rfind("tcp", 0) == 0 && !std::filesystem::exists("/sys/class/net"))
      GTEST_SKIP() << "no /sys/class/net here: UCX's tcp transport has no device to use";
    auto a = UcxTransport::Create(OptionsFor(GetParam()));
    ASSERT_TRUE(a.ok()) << a.status().ToString();
    auto b = UcxTransport::Create(OptionsFor(GetParam()));
    ASSERT_TRUE(b.ok()) << b.status().ToString();
    a_ = std::move(a).value();
    b_ = std::move(b).value();
  }
  std::unique_ptr<UcxTransport> a_;
  std::unique_ptr<UcxTransport> b_;
};

TEST_P(UcxTransportTest, PutGetByteExactWithChunking) {
  const uint64_t size = 9 << 20;
  auto region = b_->AllocateRegion(size);
  ASSERT_TRUE(region.ok()) << region.status().ToString();
  const RemoteRegionDesc desc = (*region)->remote_desc();
  std::memset((*region)->data(), 0, size);
  std::vector<uint8_t> src(size);
  std::mt19937_64 rng(5);
  for (auto& x : src) x = static_cast<uint8_t>(rng());
  // Three ops: a small one, a multi-chunk one, and one ending exactly at the region's end.
  std::vector<RmaOp> ops = {{src.data(), desc.base_address + 1, 1},
                            {src.data() + 100, desc.base_address + 100, 5 << 20},
                            {src.data() + (6 << 20), desc.base_address + (6 << 20), 3 << 20}};
  ASSERT_TRUE(SubmitAndWait(*a_, RmaKind::kWrite, b_->address(), desc, ops).ok());
  // Flush-ordered message: once it arrives, the writes are visible.
  std::promise<std::string> got;
  ASSERT_TRUE(b_->RegisterClient(3, [&](std::string_view from, std::string_view payload) {
                   got.set_value(std::string(from) + "|" + std::string(payload));
                 }, nullptr).ok());
  ASSERT_TRUE(a_->SendMessage(b_->address(), 3, "done", true, Clock::now() + 5s, nullptr).ok());
  auto future = got.get_future();
  ASSERT_EQ(future.wait_for(10s), std::future_status::ready);
  EXPECT_EQ(future.get(), a_->address() + "|done");
  b_->UnregisterClient(3);
  const uint8_t* dst = (*region)->data();
  EXPECT_EQ(dst[0], 0);
  EXPECT_EQ(dst[1], src[0]);
  EXPECT_EQ(std::memcmp(dst + 100, src.data() + 100, 5 << 20), 0);
  EXPECT_EQ(std::memcmp(dst + (6 << 20), src.data() + (6 << 20), 3 << 20), 0);
  std::vector<uint8_t> back(5 << 20);
  ASSERT_TRUE(SubmitAndWait(*a_, RmaKind::kRead, b_->address(), desc,
                            {{back.data(), desc.base_address + 100, back.size()}})
                  .ok());
  EXPECT_EQ(std::memcmp(back.data(), src.data() + 100, back.size()), 0);
  TransportStats stats = a_->Stats();
  EXPECT_EQ(stats.bytes_written, 1u + (5 << 20) + (3 << 20));
  EXPECT_EQ(stats.inflight_ops, 0u);
  EXPECT_EQ(stats.pending_batches, 0u);
  EXPECT_EQ(stats.remote_keys, 1u);  // (gets use the key also in active-message mode)
  a_->Disconnect(b_->address());
  const Deadline deadline = Clock::now() + 5s;
  while ((a_->Stats().peers != 0 || a_->Stats().remote_keys != 0) && Clock::now() < deadline) {
    std::this_thread::yield();
  }
  EXPECT_EQ(a_->Stats().peers, 0u);
  EXPECT_EQ(a_->Stats().remote_keys, 0u);
}

TEST_P(UcxTransportTest, OutOfRangeOpsAreRejectedBeforeAnyWrite) {
  auto region = b_->AllocateRegion(1 << 16);
  ASSERT_TRUE(region.ok());
  std::memset((*region)->data(), 0, 1 << 16);
  const RemoteRegionDesc desc = (*region)->remote_desc();
  std::vector<uint8_t> src(1 << 16, 0xab);
  EXPECT_EQ(SubmitAndWait(*a_, RmaKind::kWrite, b_->address(), desc,
                          {{src.data(), desc.base_address, 64},
                           {src.data(), desc.base_address + (1 << 16) - 8, 16}})
                .code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(SubmitAndWait(*a_, RmaKind::kWrite, b_->address(), desc,
                          {{src.data(), ~0ull - 4, 16}})
                .code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ((*region)->data()[0], 0);
  EXPECT_EQ(a_->Stats().pending_batches, 0u);
}

TEST_P(UcxTransportTest, ManySmallScatteredWrites) {
  // 2000 writes of 1..300 bytes in one batch (active-message mode gathers them).
  const uint64_t size = 4 << 20;
  auto region = b_->AllocateRegion(size);
  ASSERT_TRUE(region.ok());
  std::memset((*region)->data(), 0, size);
  const RemoteRegionDesc desc = (*region)->remote_desc();
  std::mt19937_64 rng(9);
  std::vector<uint8_t> src(size);
  for (auto& x : src) x = static_cast<uint8_t>(rng() | 1);
  std::vector<RmaOp> ops;
  for (uint64_t i = 0; i < 2000; ++i) {
    const uint64_t offset = i * 2048;
    ops.push_back({src.data() + offset, desc.base_address + offset, 1 + rng() % 300});
  }
  ASSERT_TRUE(SubmitAndWait(*a_, RmaKind::kWrite, b_->address(), desc, ops).ok());
  FlushAndWaitForDelivery();
  const uint8_t* dst = (*region)->data();
  for (const RmaOp& op : ops) {
    const uint64_t offset = op.remote_address - desc.base_address;
    ASSERT_EQ(std::memcmp(dst + offset, src.data() + offset, op.length), 0) << offset;
    ASSERT_EQ(dst[offset + op.length], 0) << "wrote past " << offset;
  }
}

TEST_P(UcxTransportTest, ReceiverRejectsWritesOutsideItsMemory) {
  if (GetParam() != "tcp") GTEST_SKIP() << "only active-message writes are checked by the receiver";
  auto region = b_->AllocateRegion(1 << 16);
  ASSERT_TRUE(region.ok());
  std::memset((*region)->data(), 0, 1 << 16);
  // A descriptor that claims more than was registered: the writer's check passes, the
  // receiver's does not, and nothing is written.
  RemoteRegionDesc lying = (*region)->remote_desc();
  lying.length = 1 << 20;
  std::vector<uint8_t> src(4096, 7);
  ASSERT_TRUE(SubmitAndWait(*a_, RmaKind::kWrite, b_->address(), lying,
                            {{src.data(), lying.base_address + (1 << 16) - 100, 4096}})
                  .ok());
  const Deadline deadline = Clock::now() + 5s;
  while (b_->Stats().rejected_writes == 0 && Clock::now() < deadline) std::this_thread::yield();
  EXPECT_EQ(b_->Stats().rejected_writes, 1u);
  EXPECT_EQ((*region)->data()[(1 << 16) - 100], 0);
}

TEST_P(UcxTransportTest, RegisteredUserMemoryWorks) {
  std::vector<uint8_t> memory(1 << 20, 0);
  auto region = b_->RegisterRegion(memory.data(), memory.size());
  ASSERT_TRUE(region.ok()) << region.status().ToString();
  std::vector<uint8_t> src(4096, 0x5a);
  ASSERT_TRUE(SubmitAndWait(*a_, RmaKind::kWrite, b_->address(), (*region)->remote_desc(),
                            {{src.data(), (*region)->remote_desc().base_address + 512, 4096}})
                  .ok());
  FlushAndWaitForDelivery();
  EXPECT_EQ(memory[512], 0x5a);
  EXPECT_EQ(memory[512 + 4095], 0x5a);
  EXPECT_EQ(memory[511], 0);
}

TEST_P(UcxTransportTest, GonePeerFailsWithinTheDeadline) {
  // A well-formed address and key of a transport that no longer exists. (UCX aborts the
  // process on malformed addresses: addresses must come from a trusted control plane.)
  std::string address;
  RemoteRegionDesc desc;
  {
    auto c = UcxTransport::Create(OptionsFor(GetParam()));
    ASSERT_TRUE(c.ok());
    auto region = (*c)->AllocateRegion(1 << 16);
    ASSERT_TRUE(region.ok());
    address = (*c)->address();
    desc = (*region)->remote_desc();
  }
  std::vector<uint8_t> src(16, 1);
  const auto start = Clock::now();
  auto done = std::make_shared<std::promise<Status>>();
  Status submitted = a_->Submit(RmaKind::kWrite, address, desc, {{src.data(), desc.base_address, 16}},
                                Clock::now() + 1s, [done](const Status& s) { done->set_value(s); });
  Status s = submitted;
  if (submitted.ok()) {
    // The write may "succeed" locally (shm maps, tcp queues); the flushed message cannot.
    auto f = done->get_future();
    ASSERT_EQ(f.wait_for(5s), std::future_status::ready);
    s = f.get();
    if (s.ok()) {
      auto sent = std::make_shared<std::promise<Status>>();
      ASSERT_TRUE(a_->SendMessage(address, 1, "x", true, Clock::now() + 1s,
                                  [sent](const Status& st) { sent->set_value(st); })
                      .ok());
      auto g = sent->get_future();
      ASSERT_EQ(g.wait_for(5s), std::future_status::ready);
      s = g.get();
    }
  }
  EXPECT_LT(Clock::now() - start, 2500ms);
  if (GetParam() != "shm") {
    EXPECT_FALSE(s.ok());  // shm cannot tell (no peer error handling)
  }
  const Deadline deadline = Clock::now() + 5s;
  while (a_->Stats().pending_batches + a_->Stats().pending_messages + a_->Stats().inflight_ops >
             0 &&
         Clock::now() < deadline) {
    std::this_thread::yield();
  }
  EXPECT_EQ(a_->Stats().pending_batches, 0u);
  EXPECT_EQ(a_->Stats().pending_messages, 0u);
  EXPECT_EQ(a_->Stats().inflight_ops, 0u);
}

INSTANTIATE_TEST_SUITE_P(Tls, UcxTransportTest, ::testing::Values("tcp", "tcp_put", "shm"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace pdserve::kvtransfer
