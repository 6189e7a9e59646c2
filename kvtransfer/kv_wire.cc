#include "kvtransfer/kv_wire.h"

#include <cstring>
#include <vector>

#include <capnp/message.h>
#include <capnp/serialize.h>
#include <fmt/format.h>
#include <kj/exception.h>

#include "proto/kv_transfer.capnp.h"

namespace pdserve::kvtransfer {

namespace {

constexpr uint64_t kMaxMessageWords = 64ull << 20;  // 512 MB traversal limit

std::string ToBytes(capnp::MessageBuilder& builder) {
  kj::Array<capnp::word> words = capnp::messageToFlatArray(builder);
  kj::ArrayPtr<const kj::byte> bytes = words.asBytes();
  return std::string(reinterpret_cast<const char*>(bytes.begin()), bytes.size());
}

// Aligned copy of the input plus the reader over it.
class Reader {
 public:
  explicit Reader(std::string_view bytes)
      : words_((bytes.size() + sizeof(capnp::word) - 1) / sizeof(capnp::word)) {
    if (!bytes.empty()) std::memcpy(words_.data(), bytes.data(), bytes.size());
  }
  template <typename Fn>
  auto Read(Fn&& fn) -> decltype(fn(std::declval<capnp::FlatArrayMessageReader&>())) {
    capnp::ReaderOptions options;
    options.traversalLimitInWords = kMaxMessageWords;
    capnp::FlatArrayMessageReader reader(
        kj::ArrayPtr<const capnp::word>(words_.data(), words_.size()), options);
    return fn(reader);
  }

 private:
  std::vector<capnp::word> words_;
};

proto::LatentFormat ToProto(KvLatentFormat f) {
  switch (f) {
    case KvLatentFormat::kBf16: return proto::LatentFormat::BF16;
    case KvLatentFormat::kFp8Blockwise: return proto::LatentFormat::FP8_BLOCKWISE;
    case KvLatentFormat::kInt8PerToken: return proto::LatentFormat::INT8_PER_TOKEN;
  }
  return proto::LatentFormat::BF16;
}

KvLatentFormat FromProto(proto::LatentFormat f) {
  switch (f) {
    case proto::LatentFormat::BF16: return KvLatentFormat::kBf16;
    case proto::LatentFormat::FP8_BLOCKWISE: return KvLatentFormat::kFp8Blockwise;
    case proto::LatentFormat::INT8_PER_TOKEN: return KvLatentFormat::kInt8PerToken;
  }
  return static_cast<KvLatentFormat>(0xff);  // rejected by KvLayout::Validate
}

void FillDescriptor(const KvDescriptor& d, proto::KvDescriptor::Builder b) {
  b.setRequestId(d.request_id);
  b.setDecodeAddress(kj::ArrayPtr<const kj::byte>(
      reinterpret_cast<const kj::byte*>(d.decode_address.data()), d.decode_address.size()));
  auto layout = b.initLayout();
  layout.setNumLayers(d.layout.num_layers);
  layout.setKvLoraRank(d.layout.kv_lora_rank);
  layout.setQkRopeHeadDim(d.layout.qk_rope_head_dim);
  layout.setIndexHeadDim(d.layout.index_head_dim);
  layout.setTokensPerBlock(d.layout.tokens_per_block);
  layout.setLatentFormat(ToProto(d.layout.latent_format));
  layout.setIndexerFormat(d.layout.index_format == KvIndexFormat::kInt8
                              ? proto::IndexerFormat::INT8
                              : proto::IndexerFormat::FP8);
  layout.setLatentScaleGroup(d.layout.latent_scale_group);
  auto region = b.initRegion();
  region.setBaseAddress(d.region.base_address);
  region.setLength(d.region.length);
  region.setPackedKey(kj::ArrayPtr<const kj::byte>(
      reinterpret_cast<const kj::byte*>(d.region.packed_key.data()), d.region.packed_key.size()));
  b.setNumTokens(d.num_tokens);
  auto ids = b.initBlockIds(static_cast<unsigned>(d.block_ids.size()));
  for (unsigned i = 0; i < ids.size(); ++i) ids.set(i, d.block_ids[i]);
  auto addrs = b.initBlockAddresses(static_cast<unsigned>(d.block_addresses.size()));
  for (unsigned i = 0; i < addrs.size(); ++i) addrs.set(i, d.block_addresses[i]);
  auto writers = b.initWriters(static_cast<unsigned>(d.writers.size()));
  for (unsigned i = 0; i < writers.size(); ++i) {
    writers[i].setRank(d.writers[i].rank);
    auto ranges = writers[i].initRanges(static_cast<unsigned>(d.writers[i].ranges.size()));
    for (unsigned j = 0; j < ranges.size(); ++j) {
      ranges[j].setBegin(d.writers[i].ranges[j].begin);
      ranges[j].setEnd(d.writers[i].ranges[j].end);
    }
  }
  b.setTransferTimeoutMs(d.transfer_timeout_ms);
  b.setVerifyDigest(d.verify_digest);
  b.setLeaseExpiryUnixMs(d.lease_expiry_unix_ms);
}

std::string ToString(capnp::Data::Reader data) {
  return std::string(reinterpret_cast<const char*>(data.begin()), data.size());
}

KvDescriptor ReadDescriptor(proto::KvDescriptor::Reader r) {
  KvDescriptor d;
  d.request_id = r.getRequestId();
  d.decode_address = ToString(r.getDecodeAddress());
  auto layout = r.getLayout();
  d.layout.num_layers = layout.getNumLayers();
  d.layout.kv_lora_rank = layout.getKvLoraRank();
  d.layout.qk_rope_head_dim = layout.getQkRopeHeadDim();
  d.layout.index_head_dim = layout.getIndexHeadDim();
  d.layout.tokens_per_block = layout.getTokensPerBlock();
  d.layout.latent_format = FromProto(layout.getLatentFormat());
  d.layout.index_format = layout.getIndexerFormat() == proto::IndexerFormat::INT8
                                ? KvIndexFormat::kInt8
                                : (layout.getIndexerFormat() == proto::IndexerFormat::FP8
                                       ? KvIndexFormat::kFp8
                                       : static_cast<KvIndexFormat>(0xff));
  d.layout.latent_scale_group = layout.getLatentScaleGroup();
  auto region = r.getRegion();
  d.region.base_address = region.getBaseAddress();
  d.region.length = region.getLength();
  d.region.packed_key = ToString(region.getPackedKey());
  d.num_tokens = r.getNumTokens();
  for (uint32_t id : r.getBlockIds()) d.block_ids.push_back(id);
  for (uint64_t a : r.getBlockAddresses()) d.block_addresses.push_back(a);
  for (auto w : r.getWriters()) {
    WriterAssignment a;
    a.rank = w.getRank();
    for (auto range : w.getRanges()) a.ranges.push_back({range.getBegin(), range.getEnd()});
    d.writers.push_back(std::move(a));
  }
  d.transfer_timeout_ms = r.getTransferTimeoutMs();
  d.verify_digest = r.getVerifyDigest();
  d.lease_expiry_unix_ms = r.getLeaseExpiryUnixMs();
  return d;
}

void FillFailure(const Status& status, proto::Failure::Builder b) {
  b.setCode(static_cast<uint32_t>(status.code()));
  b.setMessage(status.message());
}

Status ReadFailure(proto::Failure::Reader r) {
  const uint32_t code = r.getCode();
  if (code == 0) return Status::Ok();
  const auto status_code = code <= static_cast<uint32_t>(StatusCode::kDataLoss)
                               ? static_cast<StatusCode>(code)
                               : StatusCode::kUnknown;
  return Status(status_code, std::string(r.getMessage().cStr()));
}

template <typename Fn>
auto Guarded(std::string_view what, Fn&& fn) -> decltype(fn()) {
  try {
    return fn();
  } catch (const kj::Exception& e) {
    return Status::InvalidArgument(
        fmt::format("malformed {}: {}", what, e.getDescription().cStr()));
  }
}

}  // namespace

std::string_view TransferMessageKindName(TransferMessage::Kind kind) {
  switch (kind) {
    case TransferMessage::Kind::kBegin: return "begin";
    case TransferMessage::Kind::kComplete: return "complete";
    case TransferMessage::Kind::kAbort: return "abort";
    case TransferMessage::Kind::kAck: return "ack";
  }
  return "?";
}

std::string EncodeDescriptor(const KvDescriptor& descriptor) {
  capnp::MallocMessageBuilder builder;
  FillDescriptor(descriptor, builder.initRoot<proto::KvDescriptor>());
  return ToBytes(builder);
}

Result<KvDescriptor> DecodeDescriptor(std::string_view bytes) {
  Reader reader(bytes);
  return Guarded("KvDescriptor", [&]() -> Result<KvDescriptor> {
    return reader.Read([](capnp::FlatArrayMessageReader& r) {
      return ReadDescriptor(r.getRoot<proto::KvDescriptor>());
    });
  });
}

std::string EncodeTransferMessage(const TransferMessage& m) {
  capnp::MallocMessageBuilder builder;
  auto b = builder.initRoot<proto::TransferMessage>();
  b.setRequestId(m.request_id);
  b.setRank(m.rank);
  b.setDeadlineUnixMs(m.deadline_unix_ms);
  b.setSenderAddress(kj::ArrayPtr<const kj::byte>(
      reinterpret_cast<const kj::byte*>(m.sender_address.data()), m.sender_address.size()));
  switch (m.kind) {
    case TransferMessage::Kind::kBegin:
      b.setBegin();
      break;
    case TransferMessage::Kind::kComplete: {
      auto c = b.initComplete();
      c.setBlocksWritten(m.blocks_written);
      c.setBytesWritten(m.bytes_written);
      c.setDigest(m.digest);
      break;
    }
    case TransferMessage::Kind::kAbort:
      FillFailure(m.status, b.initAbort());
      break;
    case TransferMessage::Kind::kAck:
      FillFailure(m.status, b.initAck());
      break;
  }
  return ToBytes(builder);
}

Result<TransferMessage> DecodeTransferMessage(std::string_view bytes) {
  Reader reader(bytes);
  return Guarded("TransferMessage", [&]() -> Result<TransferMessage> {
    return reader.Read([](capnp::FlatArrayMessageReader& msg) -> Result<TransferMessage> {
      auto r = msg.getRoot<proto::TransferMessage>();
      TransferMessage m;
      m.request_id = r.getRequestId();
      m.rank = r.getRank();
      m.deadline_unix_ms = r.getDeadlineUnixMs();
      m.sender_address = ToString(r.getSenderAddress());
      switch (r.which()) {
        case proto::TransferMessage::BEGIN:
          m.kind = TransferMessage::Kind::kBegin;
          break;
        case proto::TransferMessage::COMPLETE: {
          m.kind = TransferMessage::Kind::kComplete;
          auto c = r.getComplete();
          m.blocks_written = c.getBlocksWritten();
          m.bytes_written = c.getBytesWritten();
          m.digest = c.getDigest();
          break;
        }
        case proto::TransferMessage::ABORT:
          m.kind = TransferMessage::Kind::kAbort;
          m.status = ReadFailure(r.getAbort());
          if (m.status.ok()) m.status = Status::Aborted("peer aborted without a reason");
          break;
        case proto::TransferMessage::ACK:
          m.kind = TransferMessage::Kind::kAck;
          m.status = ReadFailure(r.getAck());
          break;
        default:
          return Status::InvalidArgument("TransferMessage of unknown kind");
      }
      return m;
    });
  });
}

std::string EncodeDescriptorRequest(uint64_t request_id, uint32_t rank, uint32_t num_tokens) {
  capnp::MallocMessageBuilder builder;
  auto b = builder.initRoot<proto::DescriptorRequest>();
  b.setRequestId(request_id);
  b.setRank(rank);
  b.setNumTokens(num_tokens);
  return ToBytes(builder);
}

Status DecodeDescriptorRequest(std::string_view bytes, uint64_t* request_id, uint32_t* rank,
                               uint32_t* num_tokens) {
  Reader reader(bytes);
  return Guarded("DescriptorRequest", [&]() -> Status {
    return reader.Read([&](capnp::FlatArrayMessageReader& msg) {
      auto r = msg.getRoot<proto::DescriptorRequest>();
      *request_id = r.getRequestId();
      *rank = r.getRank();
      if (num_tokens != nullptr) *num_tokens = r.getNumTokens();
      return Status::Ok();
    });
  });
}

std::string EncodeDescriptorReply(const Result<KvDescriptor>& reply) {
  capnp::MallocMessageBuilder builder;
  auto b = builder.initRoot<proto::DescriptorReply>();
  if (reply.ok()) {
    FillDescriptor(reply.value(), b.initDescriptor());
  } else {
    FillFailure(reply.status(), b.initFailure());
  }
  return ToBytes(builder);
}

Result<KvDescriptor> DecodeDescriptorReply(std::string_view bytes) {
  Reader reader(bytes);
  return Guarded("DescriptorReply", [&]() -> Result<KvDescriptor> {
    return reader.Read([](capnp::FlatArrayMessageReader& msg) -> Result<KvDescriptor> {
      auto r = msg.getRoot<proto::DescriptorReply>();
      if (r.isDescriptor()) return ReadDescriptor(r.getDescriptor());
      Status failure = ReadFailure(r.getFailure());
      if (failure.ok()) return Status::Internal("descriptor reply with neither descriptor nor failure");
      return failure;
    });
  });
}

}  // namespace pdserve::kvtransfer
