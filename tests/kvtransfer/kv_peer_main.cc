// kv_transfer_peer: one process of a multi-process KV transfer test (kv_transfer_mp_test.cc).
//
//   --role=decode   owns a UCX-allocated block pool and a KvReceiver; serves descriptors over
//                   ZeroMQ REP at --control (Cap'n Proto DescriptorRequest / DescriptorReply);
//                   checks every completed request byte for byte against the pattern.
//   --role=prefill  rank --rank of --cp: fetches each request's descriptor over ZeroMQ REQ,
//                   builds its KV (own block size) from the pattern, and sends it with a
//                   KvSender, layer by layer.
// Both read UCX_TLS / UCX_NET_DEVICES from the environment. Output: one line per event on
// stdout ("READY", "WROTE", "PAUSED", "RESULT k=v ...", "FINAL ...", "STATS ..."), which the
// test parses. Faults: --fault=bad_descriptor (decode corrupts every descriptor it sends),
// --fault=torn (prefill silently drops one write per request), --pause_after_first_layer
// (prefill waits for a line on stdin after the first layer of request 0).
// --write_protocol=auto|put|am selects UcxTransportOptions::write_protocol.
#include <cstdio>
#include <cstring>
#include <iostream>
#include <map>
#include <string>

#include <fmt/format.h>
#include <zmq.hpp>

#include "kvtransfer/block_allocator.h"
#include "kvtransfer/kv_receiver.h"
#include "kvtransfer/kv_sender.h"
#include "kvtransfer/kv_wire.h"
#include "kvtransfer/testing/fault_transport.h"
#include "kvtransfer/testing/kv_pattern.h"
#include "kvtransfer/ucx/ucx_transport.h"
#include "tests/kvtransfer/scenario.h"

namespace pdserve::kvtransfer::testing {
namespace {

using namespace std::chrono_literals;

struct Args {
  std::map<std::string, std::string> values;
  std::string Get(const std::string& key, const std::string& fallback = "") const {
    auto it = values.find(key);
    return it == values.end() ? fallback : it->second;
  }
  uint64_t Int(const std::string& key, uint64_t fallback) const {
    auto it = values.find(key);
    return it == values.end() ? fallback : std::stoull(it->second);
  }
};

void Emit(const std::string& line) {
  std::fwrite(line.data(), 1, line.size(), stdout);
  std::fputc('\n', stdout);
  std::fflush(stdout);
}

[[noreturn]] void Die(const std::string& what) {
  Emit("ERROR " + what);
  std::exit(3);
}

UcxTransportOptions TransportOptions(const Args& args) {
  UcxTransportOptions options;
  const std::string protocol = args.Get("write_protocol", "auto");
  if (protocol == "put") options.write_protocol = WriteProtocol::kPut;
  if (protocol == "am") options.write_protocol = WriteProtocol::kActiveMessage;
  return options;
}

int RunDecode(const Args& args) {
  const uint64_t seed = args.Int("seed", 1);
  const uint32_t requests = static_cast<uint32_t>(args.Int("requests", 4));
  const uint32_t cp = static_cast<uint32_t>(args.Int("cp", 1));
  const bool bad_descriptor = args.Get("fault") == "bad_descriptor";
  auto transport = UcxTransport::Create(TransportOptions(args));
  if (!transport.ok()) Die(transport.status().ToString());
  const KvLayout layout = ScenarioLayout(seed);
  const uint32_t pool_blocks =
      static_cast<uint32_t>(requests * layout.BlocksForTokens(kMaxScenarioTokens) + 4);
  auto region = (*transport)->AllocateRegion(pool_blocks * layout.BlockBytes());
  if (!region.ok()) Die(region.status().ToString());
  std::memset((*region)->data(), 0xee, (*region)->size());  // canary
  FreeListBlockAllocator allocator(pool_blocks);
  KvReceiverOptions options;
  options.transfer_timeout = std::chrono::milliseconds(args.Int("timeout_ms", 10000));
  options.lease = std::chrono::milliseconds(args.Int("lease_ms", 10000));
  options.quarantine_grace = 200ms;
  auto receiver = KvReceiver::Create(
      transport->get(), ReceiverBlockPool{region->get(), 0, layout, &allocator}, options);
  if (!receiver.ok()) Die(receiver.status().ToString());

  zmq::context_t context;
  zmq::socket_t rep(context, zmq::socket_type::rep);
  rep.set(zmq::sockopt::linger, 0);
  rep.bind(args.Get("control"));
  Emit(fmt::format("READY layout={} pool_blocks={}", layout.ToString(), pool_blocks));

  std::map<uint64_t, KvDescriptor> reserved;
  std::map<uint64_t, bool> finished;
  uint32_t served = 0;
  const auto give_up = Clock::now() + std::chrono::seconds(args.Int("run_s", 60));
  while (served < requests * cp || finished.size() < requests) {
    if (Clock::now() > give_up) Die("decode run did not finish in time");
    zmq::pollitem_t item{rep.handle(), 0, ZMQ_POLLIN, 0};
    zmq::poll(&item, 1, 20ms);
    if (item.revents & ZMQ_POLLIN) {
      zmq::message_t request;
      if (!rep.recv(request)) continue;
      uint64_t id = 0;
      uint32_t rank = 0;
      Result<KvDescriptor> reply = Status::Internal("unset");
      Status decoded = DecodeDescriptorRequest(request.to_string_view(), &id, &rank);
      if (!decoded.ok()) {
        reply = decoded;
      } else if (reserved.count(id) == 0) {
        RequestScenario s = MakeRequestScenario(seed, id, cp, args.Get("mode") == "replicated");
        auto writers = AssignWriters(s.num_tokens, s.holdings);
        reply = writers.ok() ? receiver.value()->Reserve(id, s.num_tokens, writers.value())
                             : Result<KvDescriptor>(writers.status());
        if (reply.ok()) reserved[id] = reply.value();
      } else {
        reply = reserved[id];
      }
      if (reply.ok() && bad_descriptor) {
        KvDescriptor bad = reply.value();
        // Even requests: a block that runs past the region end; odd: an address that wraps.
        bad.block_addresses.back() = (id % 2 == 0)
                                         ? bad.region.base_address + bad.region.length - 8
                                         : ~0ull - 4095;
        reply = bad;
      }
      const std::string bytes = EncodeDescriptorReply(reply);
      rep.send(zmq::buffer(bytes), zmq::send_flags::none);
      served++;
    }
    for (const ReceiverEvent& e : receiver.value()->TakeEvents()) {
      const KvDescriptor& d = reserved[e.request_id];
      std::string check = "none";
      if (e.state == TransferState::kComplete) {
        Status exact = CheckDestination(d, (*region)->data(), {{0, d.num_tokens}}, seed);
        check = exact.ok() ? "exact" : "MISMATCH:" + exact.message();
        auto blocks = receiver.value()->HandOver(e.request_id);
        if (blocks.ok()) allocator.Free(blocks.value());
      } else if (bad_descriptor) {
        bool untouched = true;
        for (uint64_t address : d.block_addresses) {
          const uint8_t* block = (*region)->data() + (address - d.region.base_address);
          for (uint64_t i = 0; i < layout.BlockBytes() && untouched; ++i) {
            untouched = block[i] == 0xee;
          }
        }
        check = untouched ? "canary_ok" : "CANARY_OVERWRITTEN";
      }
      finished[e.request_id] = true;
      Emit(fmt::format("RESULT request={} state={} code={} check={} blocks={}", e.request_id,
                       TransferStateName(e.state), StatusCodeName(e.status.code()), check,
                       d.block_ids.size()));
    }
  }
  Status idle = receiver.value()->WaitUntilIdle(Clock::now() + 10s);
  const ReceiverStats stats = receiver.value()->Stats();
  Emit(fmt::format("FINAL free={} total={} held={} idle={} digest_failures={}",
                   allocator.num_free(), pool_blocks, stats.held_blocks, idle.ok() ? 1 : 0,
                   stats.digest_failures));
  receiver.value().reset();
  region.value().reset();
  Emit(fmt::format("REGIONS {}", (*transport)->Stats().registered_regions));
  return 0;
}

int RunPrefill(const Args& args) {
  const uint64_t seed = args.Int("seed", 1);
  const uint32_t requests = static_cast<uint32_t>(args.Int("requests", 4));
  const uint32_t cp = static_cast<uint32_t>(args.Int("cp", 1));
  const uint32_t rank = static_cast<uint32_t>(args.Int("rank", 0));
  const bool pause = args.Get("pause_after_first_layer") == "1";
  auto ucx = UcxTransport::Create(TransportOptions(args));
  if (!ucx.ok()) Die(ucx.status().ToString());
  FaultTransport transport(ucx->get());
  auto sender = KvSender::Create(&transport);
  if (!sender.ok()) Die(sender.status().ToString());

  bool peer_failed = false;  // some request ended kUnavailable / kDeadlineExceeded
  zmq::context_t context;
  zmq::socket_t req(context, zmq::socket_type::req);
  req.set(zmq::sockopt::linger, 0);
  req.connect(args.Get("control"));
  for (uint32_t i = 0; i < requests; ++i) {
    const std::string ask = EncodeDescriptorRequest(i, rank);
    req.send(zmq::buffer(ask), zmq::send_flags::none);
    zmq::pollitem_t item{req.handle(), 0, ZMQ_POLLIN, 0};
    if (zmq::poll(&item, 1, 30s) <= 0) Die("no descriptor from the decode side");
    zmq::message_t reply;
    if (!req.recv(reply)) Die("recv failed");
    Result<KvDescriptor> desc = DecodeDescriptorReply(reply.to_string_view());
    if (!desc.ok()) {
      Emit(fmt::format("RESULT request={} rank={} code={} bytes=0 stage=descriptor", i, rank,
                       StatusCodeName(desc.status().code())));
      continue;
    }
    RequestScenario s = MakeRequestScenario(seed, i, cp, args.Get("mode") == "replicated");
    SourceCache cache(s.prefill_layout, s.holdings[rank], seed, i);
    if (args.Get("fault") == "torn") transport.set_drop_writes(1);
    const uint64_t bytes_before = sender.value()->Stats().bytes_submitted;
    const auto start = Clock::now();
    Status status = sender.value()->Start(desc.value(), rank, cache.source());
    if (!status.ok()) {
      Emit(fmt::format("RESULT request={} rank={} code={} bytes=0 stage=start", i, rank,
                       StatusCodeName(status.code())));
      continue;
    }
    for (uint32_t l = 0; l < desc->layout.num_layers && status.ok(); ++l) {
      status = sender.value()->WriteLayers(i, l);
      Emit(fmt::format("WROTE request={} layer={}", i, l));
      if (pause && i == 0 && l == 0) {
        // Mid-transfer for real: `begin` sent and the first layer's bytes written.
        const auto until = Clock::now() + 5s;
        while (Clock::now() < until && (transport.Stats().messages_sent == 0 ||
                                        transport.Stats().bytes_written == 0)) {
          std::this_thread::sleep_for(1ms);  // polling counters the I/O thread updates
        }
        Emit("PAUSED");
        std::string line;
        std::getline(std::cin, line);
      }
    }
    status = sender.value()->Finish(i);
    peer_failed |= status.code() == StatusCode::kUnavailable ||
                   status.code() == StatusCode::kDeadlineExceeded;
    const double ms =
        std::chrono::duration<double, std::milli>(Clock::now() - start).count();
    Emit(fmt::format("RESULT request={} rank={} code={} bytes={} ms={:.1f} message={}", i, rank,
                     StatusCodeName(status.code()),
                     sender.value()->Stats().bytes_submitted - bytes_before, ms,
                     status.ok() ? "" : status.message().substr(0, 120)));
  }
  // Let the transport settle: nothing pending, and after a peer failure nothing held.
  const auto settle = Clock::now() + 5s;
  TransportStats t = transport.Stats();
  while (Clock::now() < settle &&
         (t.pending_batches + t.pending_messages + t.inflight_ops > 0 ||
          (peer_failed && t.remote_keys + t.peers > 0))) {
    std::this_thread::sleep_for(1ms);  // polling a counter the I/O thread updates
    t = transport.Stats();
  }
  Emit(fmt::format("STATS pending={} inflight={} remote_keys={} peers={} active={}",
                   t.pending_batches + t.pending_messages, t.inflight_ops, t.remote_keys,
                   t.peers, sender.value()->Stats().active_requests));
  return 0;
}

}  // namespace
}  // namespace pdserve::kvtransfer::testing

int main(int argc, char** argv) {
  pdserve::kvtransfer::testing::Args args;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg.rfind("--", 0) != 0) continue;
    const size_t eq = arg.find('=');
    if (eq == std::string::npos) {
      args.values[arg.substr(2)] = "1";
    } else {
      args.values[arg.substr(2, eq - 2)] = arg.substr(eq + 1);
    }
  }
  const std::string role = args.Get("role");
  if (role == "decode") return pdserve::kvtransfer::testing::RunDecode(args);
  if (role == "prefill") return pdserve::kvtransfer::testing::RunPrefill(args);
  std::fprintf(stderr, "usage: kv_transfer_peer --role=decode|prefill --control=<zmq endpoint>\n");
  return 64;
}
