// Helpers shared by the engine-backed workers' end-to-end tests (worker_e2e_test.cc,
// worker_fault_test.cc): the tiny DeepSeek-vocabulary model made once per test binary, prompts,
// the single-process greedy reference, request bodies, SSE collection, and Workers: real
// pdserve-colocated / -prefill / -decode processes next to a TestCluster's router.
//
// Thread-safety: Reference and Tok may be called from many threads; Workers from the test thread
// (Metrics / NoBlocksUsed from any).
#pragma once

#include <chrono>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/status.h"
#include "services/testing/child_process.h"
#include "services/testing/http_test_client.h"
#include "services/testing/cluster_fixture.h"
#include "tokenizer/tokenizer.h"

namespace pdserve::services::worker::e2e {

const tokenizer::Tokenizer& Tok();
// The tiny model (make-model --preset tiny --vocab 128815 --seed 3), made once per build tree
// (services::testing::CachedTestModel).
const std::string& ModelDir();
// A short text prompt, different for each k.
std::vector<int32_t> Prompt(int k);
// A prompt of about `n` tokens (distinct per k): long enough that its prefill takes a while.
std::vector<int32_t> LongPrompt(int k, size_t n);
// Single-process greedy output (the Engine with one request at a time), cached. `whole_prompts`:
// an engine that computes each prompt in one call, as a CP prefill instance does.
std::vector<int32_t> Reference(const std::vector<int32_t>& prompt, int max_tokens, bool whole_prompts = false);
std::string Text(const std::vector<int32_t>& tokens);
// A greedy /v1/completions body with ignore_eos (streaming with usage when `stream`).
std::string Body(const std::vector<int32_t>& prompt, int max_tokens, bool stream);

struct Streamed {
  std::string text;
  nlohmann::json usage;
  bool error = false;
  std::string error_message;
  double error_at = -1;  // seconds since the request was sent
};
Streamed Collect(const services::testing::SseReply& r);

// The P/D tests move KV over UCX tcp on loopback; UCX finds interfaces through sysfs, which a
// bare chroot lacks.
bool UcxTcpUsable();

class Workers {
 public:
  explicit Workers(router::testing::TestCluster* c) : c_(c) {}
  // Starts pdserve-<role> `id` (small KV pool, one thread, 4 s leases) and waits for its ready
  // file. Registration is not awaited (TestCluster::WaitForWorkers). A flag in `extra` that has
  // a default here (e.g. --kv-gib) replaces it. With a fault flag in `extra`
  // (--fault-tear-kv-writes N, --fault-fail-prefill-at-layer N, --fault-kv-events-freeze-file F)
  // it starts the test-only pdserve-fault-worker --role <role> instead.
  Status Start(const std::string& id, const std::string& role, std::vector<std::string> extra = {});
  // Starts a multi-rank instance `id`: `mpirun -n <ranks> pdserve-<role> --plan <plan>` (the
  // same settings as Start), and waits for every DP rank's ready file. Its DP ranks register
  // as "<id>-dp<k>" when dp > 1 (else as `id`); Metrics / NoBlocksUsed take those ids.
  Status StartInstance(const std::string& id, const std::string& role, int ranks, const std::string& plan, int dp,
                       std::vector<std::string> extra = {});
  // Makes the next Start of `id` reach the router's control plane at `endpoint` instead (e.g.
  // through a TcpProxy that can cut the network).
  void RouteThrough(const std::string& id, const std::string& endpoint) { router_endpoints_[id] = endpoint; }
  services::testing::ChildProcess* proc(const std::string& id) { return procs_.at(id).get(); }
  int port(const std::string& id) { return ports_.at(id); }
  std::string Metrics(const std::string& id);
  // Waits until the worker's heartbeat-refreshed gauge says no KV block is in use.
  bool NoBlocksUsed(const std::string& id, std::chrono::milliseconds timeout);
  std::string Logs();
  // Kills `id` (SIGKILL) once the router counts a request outstanding on it, so a fault test's
  // kill hits work in flight; false (and nothing killed) when that did not happen in `timeout`.
  bool KillWhenBusy(const std::string& id, std::chrono::milliseconds timeout);

 private:
  router::testing::TestCluster* c_;
  std::map<std::string, std::unique_ptr<services::testing::ChildProcess>> procs_;
  std::map<std::string, int> ports_;
  std::map<std::string, std::string> router_endpoints_;  // id -> control endpoint override
};

#define ASSERT_OK_W(expr, w)                                      \
  do {                                                            \
    ::pdserve::Status s_ = (expr);                                \
    ASSERT_TRUE(s_.ok()) << s_.ToString() << "\n" << (w).Logs(); \
  } while (0)

}  // namespace pdserve::services::worker::e2e
