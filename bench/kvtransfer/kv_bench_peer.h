// The decode side of bench_kvtransfer: a separate process (the benchmark binary re-executed
// with --peer) that owns a UCX-allocated block pool and a KvReceiver, and reserves blocks on
// request over ZeroMQ (Cap'n Proto DescriptorRequest with numTokens -> DescriptorReply),
// handing completed requests over and freeing them at once.
//
// DecodePeerClient is the driver's handle: it spawns the process with the UCX environment of
// the transport under test and asks it for descriptors.
// Thread-safety: one thread per object. Ownership: the client stops and reaps its process.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <zmq.hpp>

#include "common/status.h"
#include "kvtransfer/kv_descriptor.h"

namespace pdserve::bench::kv {

// The layout both sides use: the `small` model preset (6 layers, kv_lora_rank 512, rope 64,
// index 128, FP8 latent and indexer keys).
KvLayout SmallPresetLayout(uint32_t tokens_per_block);

struct PeerOptions {
  uint32_t tokens_per_block = 64;
  uint64_t max_tokens = 0;  // pool size
  bool verify = false;
  uint32_t timeout_s = 60;  // transfer timeout: must cover a simulated prefill
  std::string control;      // ZeroMQ endpoint
};

// The peer process's main (arguments parsed by the driver's main).
int RunDecodePeer(const PeerOptions& options);
std::vector<std::string> PeerArguments(const PeerOptions& options);

class DecodePeerClient {
 public:
  // `command_prefix` runs the peer through another command (e.g. `ip netns exec NS`: on another
  // host of a test bed); the peer's pid is then the prefix's, which must exec it.
  static Result<std::unique_ptr<DecodePeerClient>> Spawn(
      const std::string& self_path, const std::map<std::string, std::string>& env,
      const PeerOptions& options, const std::vector<std::string>& command_prefix = {});
  ~DecodePeerClient();

  Result<kvtransfer::KvDescriptor> Reserve(uint64_t request_id, uint32_t num_tokens);
  const std::string& address() const { return address_; }

 private:
  DecodePeerClient(pid_t pid, const std::string& control);
  pid_t pid_;
  std::string control_;
  zmq::context_t context_;
  zmq::socket_t socket_;
  std::string address_;  // the peer's transport address (from its first descriptor)
};

}  // namespace pdserve::bench::kv
