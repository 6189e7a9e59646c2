// EchoEngine: a deterministic token generator behind the real worker protocol, for testing
// and benchmarking the router and the control plane. It is NOT a model and never serves
// production traffic: pdserve-echo-worker exists only so the router, the WorkerAgent and
// pdserve-launch can be exercised with real processes on real sockets before (and
// independently of) the engine services.
//
// Output: token i of a request is prompt[i % prompt_len] (the prompt echoed cyclically; a
// migrated job continues where the original request was: JobTokenAt), so
// any client can predict it; logprobs are synthetic (-0.5 * (i % 4), alternatives are the next
// prompt tokens). It honours max_tokens, stop token ids (the stop token is the last one sent,
// finish "stop"), abort and drain, and models time: a prefill delay per prompt token and a
// delay per output token. Capacity is simulated too: each request holds
// ceil((prompt + max_tokens) / block_tokens) KV blocks of a fixed pool (a prefill worker:
// the prompt's blocks while it computes); a job that does not fit fails with
// ResourceExhausted, as a real worker's would.
//
// Roles: colocated (both phases); decode (answers kvReserved with an echo descriptor, waits for
// the first token relayed by the router, checks it is the one a prefill echo worker computes,
// then generates from index 1); prefill (checks the descriptor it received is the one the
// decode echo worker issued for this request and prompt -- proving the router relayed it
// intact -- then reports token 0). A disaggregated echo pair therefore produces exactly the
// colocated output. No KV bytes move: the KV transfer layer is not involved.
//
// Threading: WorkerHandler calls come on the WorkerAgent thread; one generator std::jthread
// emits events through the sinks (set before the agent starts). Destruction stops the
// generator; jobs still live get no further events.
#pragma once

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <thread>

#include "services/worker/agent/worker_agent.h"

namespace pdserve::services {

struct EchoOptions {
  WorkerRole role = WorkerRole::kColocated;
  std::string worker_id = "echo";
  std::chrono::microseconds token_delay{0};
  std::chrono::microseconds prefill_per_token{0};
  uint32_t max_batch = 256;
  uint32_t kv_blocks = 4096;
  uint32_t block_tokens = 64;
  uint32_t max_context = 8192;
  // Tests only: after this many output tokens of a job, emit nothing more for it (a wedged
  // engine whose control thread still heartbeats). 0: off.
  uint32_t stall_after = 0;
};

class EchoEngine : public WorkerHandler {
 public:
  using TokenSink = std::function<void(TokenEventMsg)>;
  using KvSink = std::function<void(KvReservedMsg)>;

  explicit EchoEngine(EchoOptions options);
  ~EchoEngine() override;
  // REQUIRES: called once, before any job arrives.
  void SetSinks(TokenSink tokens, KvSink kv);

  Status StartJob(const JobMsg& job) override;
  Status CommitFirstToken(const FirstTokenMsg& first) override;
  void AbortJob(uint64_t request_id, std::string_view reason) override;
  WorkerLoad CurrentLoad() override;

  WorkerCapacity Capacity() const;
  // The descriptor a decode echo worker issues (exposed for tests).
  static std::string Descriptor(uint64_t request_id, const std::vector<int32_t>& prompt, const std::string& decode_id);
  // The token an echo worker emits at output index i.
  static int32_t TokenAt(const std::vector<int32_t>& prompt, uint64_t i) { return prompt[i % prompt.size()]; }
  // Output token i of a job. A migrated job (sampling.resumed_output = k > 0) continues the
  // original request: its prompt is the original prompt plus the k tokens already echoed, so
  // its token i is the original request's token k + i.
  static int32_t JobTokenAt(const JobMsg& job, uint64_t i) {
    const uint64_t k = job.sampling.resumed_output;
    const uint64_t original = job.prompt.size() - std::min<uint64_t>(k, job.prompt.size() - 1);
    return job.prompt[(k + i) % original];
  }

 private:
  enum class Stage { kPrefilling, kSendKv, kAwaitingFirst, kGenerating, kAborting };
  struct Job {
    JobMsg msg;
    Stage stage = Stage::kPrefilling;
    uint64_t next_index = 0;
    std::chrono::steady_clock::time_point next_time{};
    uint32_t blocks = 0;
  };

  void Loop(std::stop_token stop);
  // Advances one due job; fills the events to send. Returns true when the job is over.
  bool Step(Job& job, std::chrono::steady_clock::time_point now, std::vector<TokenEventMsg>* events,
            std::vector<KvReservedMsg>* reserved);
  TokenEventMsg MakeToken(const Job& job, uint64_t index) const;

  const EchoOptions options_;
  TokenSink token_sink_;
  KvSink kv_sink_;

  std::mutex mu_;
  std::condition_variable_any cv_;
  std::map<uint64_t, Job> jobs_;
  uint32_t blocks_free_;
  std::jthread thread_;  // last
};

}  // namespace pdserve::services
