// UcxTransport's data path (the I/O thread): issuing RMA and active-message writes within the
// per-peer cap, flush-ordered messages, their completion callbacks, and incoming active
// messages. See ucx_transport.h.
#include <algorithm>
#include <cstring>

#include <fmt/format.h>

#include "common/logging.h"
#include "kvtransfer/ucx/ucx_status.h"
#include "kvtransfer/ucx/ucx_transport.h"
#include "kvtransfer/ucx/ucx_transport_internal.h"

namespace pdserve::kvtransfer {

bool UcxTransport::Pump(Peer& peer) {
  bool did = false;
  std::shared_ptr<Peer> self = peer.self.lock();
  while (!peer.failed && !peer.queue.empty()) {
    std::shared_ptr<Batch> b = peer.queue.front();
    if (b->finished || !b->status.ok() || b->next_op >= b->ops.size()) {
      peer.queue.pop_front();
      peer.batches_issued++;
      FinishBatchIfDone(b);
      did = true;
      continue;
    }
    if (peer.inflight >= options_.max_inflight_ops) break;
    did |= IssueRma(self, b);
  }
  did |= PumpMessages(self);
  return did;
}

bool UcxTransport::IssueRma(const std::shared_ptr<Peer>& peer, const std::shared_ptr<Batch>& b) {
  if (peer->am_writes && b->kind == RmaKind::kWrite) return IssueAmWrite(peer, b);
  if (b->rkey == nullptr) {
    auto it = peer->rkeys.find(b->region.packed_key);
    if (it == peer->rkeys.end()) {
      auto key = UcxRemoteKey::Unpack(peer->ep.get(), b->region.packed_key);
      if (!key.ok()) {
        b->status = key.status();
        return true;
      }
      it = peer->rkeys.emplace(b->region.packed_key, std::move(key).value()).first;
      counters_.remote_keys++;
    }
    b->rkey = it->second->get();
  }
  const RmaOp& op = b->ops[b->next_op];
  const uint64_t length = std::min(options_.max_chunk_bytes, op.length - b->next_offset);
  if (length == 0) {
    b->next_op++;
    b->next_offset = 0;
    return true;
  }
  auto* ctx = new OpContext{this, b, nullptr, length};
  ucp_request_param_t param{};
  param.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
  param.cb.send = &UcxTransport::OnRmaDone;
  param.user_data = ctx;
  uint8_t* local = static_cast<uint8_t*>(op.local) + b->next_offset;
  const uint64_t remote = op.remote_address + b->next_offset;
  ucs_status_ptr_t request;
  if (b->kind == RmaKind::kWrite) {
    request = ucp_put_nbx(peer->ep->get(), local, length, remote, b->rkey, &param);
  } else {
    request = ucp_get_nbx(peer->ep->get(), local, length, remote, b->rkey, &param);
  }
  b->next_offset += length;
  if (b->next_offset == op.length) {
    b->next_op++;
    b->next_offset = 0;
  }
  if (request == nullptr) {
    b->bytes += length;
    delete ctx;
  } else if (UCS_PTR_IS_ERR(request)) {
    b->status = FromUcsStatus(UCS_PTR_STATUS(request),
                              b->kind == RmaKind::kWrite ? "ucp_put_nbx" : "ucp_get_nbx");
    delete ctx;
  } else {
    b->inflight++;
    peer->inflight++;
    counters_.inflight_ops++;
  }
  return true;
}

bool UcxTransport::IssueAmWrite(const std::shared_ptr<Peer>& peer,
                                const std::shared_ptr<Batch>& b) {
  const uint64_t chunk = options_.max_am_chunk_bytes;
  auto* ctx = new OpContext{this, b, nullptr, 0};
  std::vector<std::pair<uint64_t, uint64_t>> entries;  // (remote address, length)
  uint64_t total = 0;
  while (b->next_op < b->ops.size() && entries.size() < kMaxAmWriteEntries && total < chunk) {
    const RmaOp& op = b->ops[b->next_op];
    const uint64_t remaining = op.length - b->next_offset;
    if (remaining == 0) {
      b->next_op++;
      b->next_offset = 0;
      continue;
    }
    const uint64_t take = std::min(remaining, chunk - total);
    if (take < remaining && !entries.empty()) break;  // only a message's first op is split
    entries.emplace_back(op.remote_address + b->next_offset, take);
    ctx->iov.push_back(ucp_dt_iov_t{static_cast<uint8_t*>(op.local) + b->next_offset, take});
    total += take;
    b->next_offset += take;
    if (b->next_offset == op.length) {
      b->next_op++;
      b->next_offset = 0;
    }
  }
  if (entries.empty()) {
    delete ctx;
    return true;
  }
  ctx->length = total;
  ctx->header.resize(4 + 16 * entries.size());
  const uint32_t count = static_cast<uint32_t>(entries.size());
  std::memcpy(ctx->header.data(), &count, 4);  // x86-64: little endian
  for (size_t i = 0; i < entries.size(); ++i) {
    std::memcpy(ctx->header.data() + 4 + 16 * i, &entries[i].first, 8);
    std::memcpy(ctx->header.data() + 12 + 16 * i, &entries[i].second, 8);
  }
  ucp_request_param_t param{};
  param.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA |
                      UCP_OP_ATTR_FIELD_FLAGS | UCP_OP_ATTR_FIELD_DATATYPE;
  param.flags = UCP_AM_SEND_FLAG_EAGER;
  param.datatype = ucp_dt_make_iov();  // UCX gathers the pieces itself: no staging copy
  param.cb.send = &UcxTransport::OnRmaDone;
  param.user_data = ctx;
  ucs_status_ptr_t request =
      ucp_am_send_nbx(peer->ep->get(), kAmWriteId, ctx->header.data(), ctx->header.size(),
                      ctx->iov.data(), ctx->iov.size(), &param);
  if (request == nullptr) {
    b->bytes += total;
    delete ctx;
  } else if (UCS_PTR_IS_ERR(request)) {
    b->status = FromUcsStatus(UCS_PTR_STATUS(request), "ucp_am_send_nbx (write)");
    delete ctx;
  } else {
    b->inflight++;
    peer->inflight++;
    counters_.inflight_ops++;
  }
  return true;
}

void UcxTransport::OnRmaDone(void* request, ucs_status_t status, void* user_data) {
  auto* ctx = static_cast<OpContext*>(user_data);
  UcxTransport* self = ctx->transport;
  Batch& b = *ctx->batch;
  if (b.finished) {  // ended when its endpoint's close was abandoned
    ucp_request_free(request);
    delete ctx;
    return;
  }
  b.inflight--;
  b.peer->inflight--;
  self->counters_.inflight_ops--;
  if (status == UCS_OK) {
    b.bytes += ctx->length;
  } else if (b.status.ok()) {
    b.status = b.peer->failed && !b.peer->reset_status.ok()
                   ? b.peer->reset_status
                   : FromUcsStatus(status, "RMA to a peer");
  }
  ucp_request_free(request);
  std::shared_ptr<Batch> batch = std::move(ctx->batch);
  delete ctx;
  self->FinishBatchIfDone(batch);
}

void UcxTransport::FinishBatchIfDone(const std::shared_ptr<Batch>& b) {
  if (b->finished || b->inflight > 0) return;
  if (b->status.ok() && b->next_op < b->ops.size()) return;
  b->finished = true;
  counters_.pending_batches--;
  (b->kind == RmaKind::kWrite ? counters_.bytes_written : counters_.bytes_read) += b->bytes;
  DoneCallback done = std::move(b->done);
  if (done) done(b->status);
}

bool UcxTransport::PumpMessages(const std::shared_ptr<Peer>& peer) {
  bool did = false;
  while (!peer->failed && !peer->messages.empty() && !peer->message_flushing) {
    std::shared_ptr<Message> m = peer->messages.front();
    if (m->stage == Message::Stage::kDone) {
      peer->messages.pop_front();
      continue;
    }
    if (m->flush_first && peer->batches_issued < m->after_batches) break;
    peer->messages.pop_front();
    did = true;
    if (!m->flush_first) {
      SendAm(peer, m);
      continue;
    }
    m->stage = Message::Stage::kFlushing;
    auto* ctx = new OpContext{this, nullptr, m, 0};
    ucp_request_param_t param{};
    param.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
    param.cb.send = &UcxTransport::OnFlushDone;
    param.user_data = ctx;
    ucs_status_ptr_t request = ucp_ep_flush_nbx(peer->ep->get(), &param);
    if (request == nullptr) {
      delete ctx;
      SendAm(peer, m);
    } else if (UCS_PTR_IS_ERR(request)) {
      delete ctx;
      FinishMessage(m, FromUcsStatus(UCS_PTR_STATUS(request), "ucp_ep_flush_nbx"));
    } else {
      peer->message_flushing = true;
    }
  }
  return did;
}

void UcxTransport::OnFlushDone(void* request, ucs_status_t status, void* user_data) {
  auto* ctx = static_cast<OpContext*>(user_data);
  UcxTransport* self = ctx->transport;
  std::shared_ptr<Message> m = std::move(ctx->message);
  delete ctx;
  ucp_request_free(request);
  m->peer->message_flushing = false;
  if (m->stage == Message::Stage::kDone) return;  // already failed (deadline / reset)
  if (status != UCS_OK) {
    self->FinishMessage(m, m->peer->failed && !m->peer->reset_status.ok()
                               ? m->peer->reset_status
                               : FromUcsStatus(status, "ucp_ep_flush_nbx"));
    return;
  }
  self->SendAm(m->peer, m);
}

void UcxTransport::SendAm(const std::shared_ptr<Peer>& peer, const std::shared_ptr<Message>& m) {
  if (peer->failed) {
    FinishMessage(m, peer->reset_status);
    return;
  }
  m->stage = Message::Stage::kSending;
  auto* ctx = new OpContext{this, nullptr, m, 0};
  ucp_request_param_t param{};
  param.op_attr_mask =
      UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_FLAGS;
  param.flags = UCP_AM_SEND_FLAG_EAGER;
  param.cb.send = &UcxTransport::OnAmSent;
  param.user_data = ctx;
  ucs_status_ptr_t request = ucp_am_send_nbx(peer->ep->get(), m->channel, nullptr, 0,
                                             m->envelope.data(), m->envelope.size(), &param);
  if (request == nullptr) {
    delete ctx;
    FinishMessage(m, Status::Ok());
  } else if (UCS_PTR_IS_ERR(request)) {
    delete ctx;
    FinishMessage(m, FromUcsStatus(UCS_PTR_STATUS(request), "ucp_am_send_nbx"));
  }
}

void UcxTransport::OnAmSent(void* request, ucs_status_t status, void* user_data) {
  auto* ctx = static_cast<OpContext*>(user_data);
  UcxTransport* self = ctx->transport;
  std::shared_ptr<Message> m = std::move(ctx->message);
  delete ctx;
  ucp_request_free(request);
  if (status == UCS_OK) {
    self->FinishMessage(m, Status::Ok());
  } else {
    self->FinishMessage(m, m->peer->failed && !m->peer->reset_status.ok()
                               ? m->peer->reset_status
                               : FromUcsStatus(status, "ucp_am_send_nbx"));
  }
}

void UcxTransport::FinishMessage(const std::shared_ptr<Message>& m, const Status& status) {
  if (m->stage == Message::Stage::kDone) return;
  m->stage = Message::Stage::kDone;
  counters_.pending_messages--;
  if (status.ok()) counters_.messages_sent++;
  DoneCallback done = std::move(m->done);
  if (done) done(status);
}

ucs_status_t UcxTransport::OnAmReceived(void* arg, const void* header, size_t header_length,
                                        void* data, size_t length,
                                        const ucp_am_recv_param_t* param) {
  auto* am = static_cast<AmArg*>(arg);
  am->self->counters_.messages_received++;
  if (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) {
    GetLogger("kvtransfer")->warn("dropping a rendezvous active message (peers send eager only)");
    return UCS_OK;
  }
  const auto* bytes = static_cast<const char*>(data);
  if (length < 4) return UCS_OK;
  uint32_t address_length = 0;
  for (int i = 0; i < 4; ++i) {
    address_length |= static_cast<uint32_t>(static_cast<uint8_t>(bytes[i])) << (8 * i);
  }
  if (address_length > length - 4) return UCS_OK;
  std::string_view sender(bytes + 4, address_length);
  std::string_view payload(bytes + 4 + address_length, length - 4 - address_length);
  const Client& client = am->self->clients_[am->channel];
  if (client.on_message) client.on_message(sender, payload);
  return UCS_OK;
}

ucs_status_t UcxTransport::OnAmWrite(void* arg, const void* header, size_t header_length,
                                     void* data, size_t length,
                                     const ucp_am_recv_param_t* param) {
  auto* self = static_cast<UcxTransport*>(arg);
  auto reject = [&](std::string_view why) {
    self->counters_.rejected_writes++;
    GetLogger("kvtransfer")->warn("dropping an active-message write: {}", why);
    return UCS_OK;
  };
  if (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) return reject("rendezvous");
  const auto* h = static_cast<const uint8_t*>(header);
  uint32_t count = 0;
  if (header_length < 4) return reject("short header");
  std::memcpy(&count, h, 4);
  if (count == 0 || count > kMaxAmWriteEntries || header_length != 4 + 16ull * count) {
    return reject("malformed header");
  }
  // The receiver's own check, before any byte is written: every piece must lie inside memory
  // registered here, and the pieces must account for the payload exactly.
  uint64_t sum = 0;
  for (uint32_t i = 0; i < count; ++i) {
    uint64_t address, size;
    std::memcpy(&address, h + 4 + 16 * i, 8);
    std::memcpy(&size, h + 12 + 16 * i, 8);
    if (size > length - sum) return reject("pieces exceed the payload");
    sum += size;
    bool inside = false;
    for (const auto& [id, region] : self->regions_) {
      inside |= RangeWithin(address, size, reinterpret_cast<uint64_t>(region->data()),
                            region->size());
    }
    if (!inside) return reject(fmt::format("{:#x}+{} is outside every registered region", address, size));
  }
  if (sum != length) return reject("pieces do not cover the payload");
  const auto* src = static_cast<const uint8_t*>(data);
  for (uint32_t i = 0; i < count; ++i) {
    uint64_t address, size;
    std::memcpy(&address, h + 4 + 16 * i, 8);
    std::memcpy(&size, h + 12 + 16 * i, 8);
    std::memcpy(reinterpret_cast<void*>(address), src, size);
    src += size;
  }
  return UCS_OK;
}

}  // namespace pdserve::kvtransfer
