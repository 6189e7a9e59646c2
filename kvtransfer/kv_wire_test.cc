#include "kvtransfer/kv_wire.h"

#include <gtest/gtest.h>

namespace pdserve::kvtransfer {
namespace {

TEST(KvWireTest, DescriptorRoundTrips) {
  KvDescriptor d;
  d.request_id = 0x123456789abcull;
  d.decode_address = std::string("\x00\x01\xffucx", 6);
  d.layout = KvLayout::DeepSeekV32(61, 64);
  d.layout.latent_format = KvLatentFormat::kInt8PerToken;
  d.layout.index_format = KvIndexFormat::kInt8;
  d.region = {0x7f0000000000ull, 1ull << 30, std::string("\x01\x02\x00rkey", 7)};
  d.num_tokens = 130;
  d.block_ids = {4, 9, 2};
  d.block_addresses = {1, 2, 3};
  d.writers = {WriterAssignment{0, {{0, 64}}}, WriterAssignment{3, {{64, 100}, {110, 130}}}};
  d.transfer_timeout_ms = 1234;
  d.lease_expiry_unix_ms = 1'700'000'000'000;
  d.verify_digest = false;
  auto decoded = DecodeDescriptor(EncodeDescriptor(d));
  ASSERT_TRUE(decoded.ok()) << decoded.status().ToString();
  EXPECT_EQ(decoded.value(), d);
  auto reply = DecodeDescriptorReply(EncodeDescriptorReply(d));
  ASSERT_TRUE(reply.ok());
  EXPECT_EQ(reply.value(), d);
  auto failure = DecodeDescriptorReply(
      EncodeDescriptorReply(Status::ResourceExhausted("no blocks")));
  EXPECT_EQ(failure.status().code(), StatusCode::kResourceExhausted);
}

TEST(KvWireTest, TransferMessagesRoundTrip) {
  TransferMessage m;
  m.request_id = 42;
  m.rank = 3;
  m.sender_address = "prefill";
  m.kind = TransferMessage::Kind::kComplete;
  m.blocks_written = 17;
  m.bytes_written = 1ull << 33;
  m.digest = 0xdeadbeefcafef00dull;
  auto d = DecodeTransferMessage(EncodeTransferMessage(m));
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->kind, TransferMessage::Kind::kComplete);
  EXPECT_EQ(d->blocks_written, 17u);
  EXPECT_EQ(d->bytes_written, 1ull << 33);
  EXPECT_EQ(d->digest, m.digest);
  EXPECT_EQ(d->sender_address, "prefill");
  m.kind = TransferMessage::Kind::kAck;
  m.status = Status::DataLoss("digest mismatch");
  d = DecodeTransferMessage(EncodeTransferMessage(m));
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->status.code(), StatusCode::kDataLoss);
  EXPECT_EQ(d->status.message(), "digest mismatch");
  m.status = Status::Ok();
  d = DecodeTransferMessage(EncodeTransferMessage(m));
  ASSERT_TRUE(d.ok());
  EXPECT_TRUE(d->status.ok());
  uint64_t id = 0;
  uint32_t rank = 0;
  uint32_t tokens = 1;
  ASSERT_TRUE(DecodeDescriptorRequest(EncodeDescriptorRequest(9, 2), &id, &rank, &tokens).ok());
  EXPECT_EQ(id, 9u);
  EXPECT_EQ(rank, 2u);
  EXPECT_EQ(tokens, 0u);
  ASSERT_TRUE(DecodeDescriptorRequest(EncodeDescriptorRequest(9, 2, 32768), &id, &rank, &tokens).ok());
  EXPECT_EQ(tokens, 32768u);
}

TEST(KvWireTest, GarbageIsRejectedNotFatal) {
  for (std::string bytes : {std::string(), std::string("x"), std::string(64, '\xff'),
                            std::string(7, '\0') + std::string(100, '\x7f')}) {
    EXPECT_FALSE(DecodeDescriptor(bytes).ok());
    EXPECT_FALSE(DecodeTransferMessage(bytes).ok());
  }
  // A truncated valid message.
  KvDescriptor d;
  d.block_ids.assign(100, 1);
  std::string good = EncodeDescriptor(d);
  EXPECT_FALSE(DecodeDescriptor(good.substr(0, good.size() / 2)).ok());
}

}  // namespace
}  // namespace pdserve::kvtransfer
