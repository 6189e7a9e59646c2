#include "bench/kvtransfer/kv_bench_peer.h"

#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <thread>

#include <fmt/format.h>

#include "kvtransfer/block_allocator.h"
#include "kvtransfer/kv_receiver.h"
#include "kvtransfer/kv_wire.h"
#include "kvtransfer/ucx/ucx_transport.h"

extern char** environ;

namespace pdserve::bench::kv {

using namespace std::chrono_literals;
using kvtransfer::KvDescriptor;

namespace {
constexpr uint64_t kQuit = ~0ull;
}

KvLayout SmallPresetLayout(uint32_t tokens_per_block) {
  return KvLayout::DeepSeekV32(6, tokens_per_block);
}

std::vector<std::string> PeerArguments(const PeerOptions& o) {
  return {"--peer", fmt::format("--block={}", o.tokens_per_block),
          fmt::format("--max_tokens={}", o.max_tokens), fmt::format("--verify={}", o.verify ? 1 : 0),
          fmt::format("--timeout_s={}", o.timeout_s),
          "--control=" + o.control};
}

int RunDecodePeer(const PeerOptions& o) {
  using namespace kvtransfer;
  auto transport = UcxTransport::Create();
  if (!transport.ok()) {
    std::fprintf(stderr, "peer: %s\n", transport.status().ToString().c_str());
    return 3;
  }
  const KvLayout layout = SmallPresetLayout(o.tokens_per_block);
  const uint32_t blocks = static_cast<uint32_t>(layout.BlocksForTokens(o.max_tokens) + 2);
  auto region = (*transport)->AllocateRegion(blocks * layout.BlockBytes());
  if (!region.ok()) return 3;
  FreeListBlockAllocator allocator(blocks);
  KvReceiverOptions options;
  options.verify_digest = o.verify;
  options.transfer_timeout = std::chrono::seconds(o.timeout_s);
  options.lease = 60s;
  auto receiver = KvReceiver::Create(transport->get(),
                                     ReceiverBlockPool{region->get(), 0, layout, &allocator},
                                     options);
  if (!receiver.ok()) return 3;
  auto drain = [&] {
    for (const ReceiverEvent& e : receiver.value()->TakeEvents()) {
      if (e.state != TransferState::kComplete) {
        std::fprintf(stderr, "peer: request %lu %s\n", static_cast<unsigned long>(e.request_id),
                     e.status.ToString().c_str());
        continue;
      }
      auto handed = receiver.value()->HandOver(e.request_id);
      if (handed.ok()) allocator.Free(handed.value());
    }
  };
  zmq::context_t context;
  zmq::socket_t rep(context, zmq::socket_type::rep);
  rep.set(zmq::sockopt::linger, 0);
  rep.bind(o.control);
  while (true) {
    zmq::message_t request;
    if (!rep.recv(request)) continue;
    uint64_t id = 0;
    uint32_t rank = 0;
    uint32_t tokens = 0;
    Result<KvDescriptor> reply = Status::Internal("unset");
    Status decoded = DecodeDescriptorRequest(request.to_string_view(), &id, &rank, &tokens);
    if (decoded.ok() && id == kQuit) {
      rep.send(zmq::buffer(EncodeDescriptorReply(Status::Cancelled("bye"))), zmq::send_flags::none);
      break;
    }
    if (!decoded.ok()) {
      reply = decoded;
    } else {
      drain();
      std::vector<WriterAssignment> writers = {WriterAssignment{0, {{0, tokens}}}};
      reply = receiver.value()->Reserve(id, tokens, writers);
      // The previous request's completion event may still be on its way.
      for (int i = 0; i < 100 && !reply.ok() &&
                      reply.status().code() == StatusCode::kResourceExhausted;
           ++i) {
        receiver.value()->WaitForEvents(Clock::now() + 50ms);
        drain();
        reply = receiver.value()->Reserve(id, tokens, writers);
      }
    }
    rep.send(zmq::buffer(EncodeDescriptorReply(reply)), zmq::send_flags::none);
  }
  receiver.value().reset();
  region.value().reset();
  return 0;
}

DecodePeerClient::DecodePeerClient(pid_t pid, const std::string& control)
    : pid_(pid), control_(control), socket_(context_, zmq::socket_type::req) {
  socket_.set(zmq::sockopt::linger, 0);
  socket_.connect(control);
}

Result<std::unique_ptr<DecodePeerClient>> DecodePeerClient::Spawn(
    const std::string& self_path, const std::map<std::string, std::string>& env,
    const PeerOptions& options, const std::vector<std::string>& command_prefix) {
  std::vector<std::string> env_strings;
  for (char** e = environ; *e != nullptr; ++e) {
    std::string_view entry(*e);
    if (env.count(std::string(entry.substr(0, entry.find('=')))) == 0) {
      env_strings.emplace_back(entry);
    }
  }
  for (const auto& [k, v] : env) env_strings.push_back(k + "=" + v);
  std::vector<std::string> args = command_prefix;
  args.push_back(self_path);
  for (auto& a : PeerArguments(options)) args.push_back(a);
  std::vector<char*> argv, envp;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  for (auto& e : env_strings) envp.push_back(e.data());
  envp.push_back(nullptr);
  const pid_t pid = fork();
  if (pid < 0) return Status::Internal("fork failed");
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);  // never outlive the driver
    if (command_prefix.empty()) {
      execve(self_path.c_str(), argv.data(), envp.data());
    } else {
      execvpe(argv[0], argv.data(), envp.data());
    }
    _exit(127);
  }
  return std::unique_ptr<DecodePeerClient>(new DecodePeerClient(pid, options.control));
}

Result<KvDescriptor> DecodePeerClient::Reserve(uint64_t request_id, uint32_t num_tokens) {
  const std::string ask = kvtransfer::EncodeDescriptorRequest(request_id, 0, num_tokens);
  socket_.send(zmq::buffer(ask), zmq::send_flags::none);
  zmq::pollitem_t item{socket_.handle(), 0, ZMQ_POLLIN, 0};
  if (zmq::poll(&item, 1, 60s) <= 0) return Status::DeadlineExceeded("decode peer did not answer");
  zmq::message_t reply;
  if (!socket_.recv(reply)) return Status::Unavailable("decode peer recv failed");
  Result<KvDescriptor> d = kvtransfer::DecodeDescriptorReply(reply.to_string_view());
  if (d.ok()) address_ = d->decode_address;
  return d;
}

DecodePeerClient::~DecodePeerClient() {
  const std::string quit = kvtransfer::EncodeDescriptorRequest(kQuit, 0, 0);
  socket_.send(zmq::buffer(quit), zmq::send_flags::dontwait);
  zmq::pollitem_t item{socket_.handle(), 0, ZMQ_POLLIN, 0};
  zmq::poll(&item, 1, 5s);
  bool exited = false;
  for (int i = 0; i < 500 && !exited; ++i) {  // up to 5 s for a clean exit
    exited = waitpid(pid_, nullptr, WNOHANG) == pid_;
    if (!exited) std::this_thread::sleep_for(10ms);
  }
  if (!exited) {
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
  }
  // ZeroMQ leaves ipc socket files behind.
  if (control_.rfind("ipc://", 0) == 0) std::filesystem::remove(control_.substr(6));
}

}  // namespace pdserve::bench::kv
