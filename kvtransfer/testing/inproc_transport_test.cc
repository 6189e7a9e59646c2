#include "kvtransfer/testing/inproc_transport.h"

#include <gtest/gtest.h>

#include <cstring>
#include <future>

namespace pdserve::kvtransfer::testing {
namespace {

using namespace std::chrono_literals;

struct Pair {
  std::shared_ptr<InProcFabric> fabric = std::make_shared<InProcFabric>();
  std::unique_ptr<InProcTransport> a = InProcTransport::Create(fabric).value();
  std::unique_ptr<InProcTransport> b = InProcTransport::Create(fabric).value();
};

Status SubmitAndWait(Transport& t, RmaKind kind, const std::string& peer,
                     const RemoteRegionDesc& region, std::vector<RmaOp> ops,
                     std::chrono::milliseconds timeout = 2000ms) {
  std::promise<Status> done;
  Status submitted = t.Submit(kind, peer, region, std::move(ops), Clock::now() + timeout,
                              [&](const Status& s) { done.set_value(s); });
  if (!submitted.ok()) return submitted;
  auto future = done.get_future();
  if (future.wait_for(timeout + 2s) != std::future_status::ready) {
    return Status::Internal("callback never ran");
  }
  return future.get();
}

TEST(InProcTransportTest, WritesReadsAndMessages) {
  Pair p;
  auto region = p.b->AllocateRegion(4096);
  ASSERT_TRUE(region.ok());
  const RemoteRegionDesc desc = (*region)->remote_desc();
  std::vector<uint8_t> src(100, 7);
  ASSERT_TRUE(SubmitAndWait(*p.a, RmaKind::kWrite, p.b->address(), desc,
                            {{src.data(), desc.base_address + 10, 100}})
                  .ok());
  EXPECT_EQ((*region)->data()[10], 7);
  EXPECT_EQ((*region)->data()[109], 7);
  EXPECT_EQ((*region)->data()[110], 0);
  std::vector<uint8_t> back(100, 0);
  ASSERT_TRUE(SubmitAndWait(*p.a, RmaKind::kRead, p.b->address(), desc,
                            {{back.data(), desc.base_address + 10, 100}})
                  .ok());
  EXPECT_EQ(back, src);

  std::promise<std::pair<std::string, std::string>> got;
  ASSERT_TRUE(p.b->RegisterClient(1, [&](std::string_view from, std::string_view payload) {
                   got.set_value({std::string(from), std::string(payload)});
                 }, nullptr).ok());
  ASSERT_TRUE(p.a->SendMessage(p.b->address(), 1, "hello", true, Clock::now() + 1s, nullptr).ok());
  auto future = got.get_future();
  ASSERT_EQ(future.wait_for(2s), std::future_status::ready);
  auto [from, payload] = future.get();
  EXPECT_EQ(from, p.a->address());
  EXPECT_EQ(payload, "hello");
  p.b->UnregisterClient(1);
  EXPECT_EQ(p.a->Stats().bytes_written, 100u);
  EXPECT_EQ(p.a->Stats().pending_batches, 0u);
}

TEST(InProcTransportTest, OutOfRangeIsRejectedBeforeAnyWrite) {
  Pair p;
  auto region = p.b->AllocateRegion(4096);
  ASSERT_TRUE(region.ok());
  std::memset((*region)->data(), 0, 4096);
  const RemoteRegionDesc desc = (*region)->remote_desc();
  std::vector<uint8_t> src(100, 7);
  Status s = SubmitAndWait(*p.a, RmaKind::kWrite, p.b->address(), desc,
                           {{src.data(), desc.base_address, 100},
                            {src.data(), desc.base_address + 4000, 100}});
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ((*region)->data()[0], 0);  // the good first op was not issued either
  s = SubmitAndWait(*p.a, RmaKind::kWrite, p.b->address(), desc,
                    {{src.data(), ~0ull - 10, 100}});
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
}

TEST(InProcTransportTest, KilledPeerFailsWithUnavailableAndNotifies) {
  Pair p;
  auto region = p.b->AllocateRegion(4096);
  ASSERT_TRUE(region.ok());
  const RemoteRegionDesc desc = (*region)->remote_desc();
  std::promise<Status> failure;
  ASSERT_TRUE(p.a->RegisterClient(2, nullptr, [&](std::string_view, const Status& s) {
                   failure.set_value(s);
                 }).ok());
  p.b->Kill();
  std::vector<uint8_t> src(10, 1);
  Status s = SubmitAndWait(*p.a, RmaKind::kWrite, p.b->address(), desc,
                           {{src.data(), desc.base_address, 10}});
  EXPECT_EQ(s.code(), StatusCode::kUnavailable);
  auto f = failure.get_future();
  ASSERT_EQ(f.wait_for(2s), std::future_status::ready);
  EXPECT_EQ(f.get().code(), StatusCode::kUnavailable);
  p.a->UnregisterClient(2);
}

TEST(InProcTransportTest, HeldWritesExpireAtTheirDeadline) {
  Pair p;
  auto region = p.b->AllocateRegion(4096);
  ASSERT_TRUE(region.ok());
  const RemoteRegionDesc desc = (*region)->remote_desc();
  p.a->HoldWrites(true);
  std::vector<uint8_t> src(10, 1);
  const auto start = Clock::now();
  Status s = SubmitAndWait(*p.a, RmaKind::kWrite, p.b->address(), desc,
                           {{src.data(), desc.base_address, 10}}, 100ms);
  EXPECT_EQ(s.code(), StatusCode::kDeadlineExceeded);
  EXPECT_LT(Clock::now() - start, 1s);
  EXPECT_EQ(p.a->Stats().pending_batches, 0u);
}

}  // namespace
}  // namespace pdserve::kvtransfer::testing
