// Control-plane messages as plain C++ values (proto/control.capnp describes the wire form and
// the flows; docs/control-plane.md explains them). Services build and read these structs;
// control_codec.h turns them into bytes and back, so no service touches Cap'n Proto builders.
//
// Thread-safety: value types.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "common/finish_reason.h"
#include "common/sampling_params.h"
#include "grammar/constraint.h"
#include "common/status.h"

namespace pdserve::services {

inline constexpr uint32_t kControlProtocolVersion = 1;

enum class WorkerRole : uint8_t { kPrefill, kDecode, kColocated };
const char* WorkerRoleName(WorkerRole role);  // "prefill" | "decode" | "colocated"
// Errors: InvalidArgument for any other name.
Result<WorkerRole> ParseWorkerRole(std::string_view name);

struct WorkerCapacity {
  uint32_t max_batch = 0;
  uint32_t kv_blocks_total = 0;
  uint32_t kv_blocks_free = 0;
  uint32_t block_tokens = 0;
  uint32_t max_context_tokens = 0;
  uint32_t dp_ranks = 1;  // DP ranks of the worker's instance (each registers on its own)
  uint32_t prefix_tier_blocks = 0;  // blocks its prefix cache's disk tier may hold (0: none)
  bool operator==(const WorkerCapacity&) const = default;
};

struct RegisterMsg {
  uint32_t protocol_version = kControlProtocolVersion;
  WorkerRole role = WorkerRole::kColocated;
  std::string worker_id;
  uint64_t incarnation = 0;
  std::string control_address;
  std::string http_address;
  std::string transfer_address;  // opaque bytes
  WorkerCapacity capacity;
  std::string model_name;
  uint64_t compat_hash = 0;
  std::string instance_id;  // "" for a one-process worker
  uint32_t dp_rank = 0;
  uint32_t vocab_size = 0;  // 0: unknown (not a model)
  uint64_t kv_namespace = 0;  // the engine's prefix-cache namespace (0: cache off / not a model)
  bool operator==(const RegisterMsg&) const = default;
};

struct RegisterAckMsg {
  uint64_t router_incarnation = 0;
  uint32_t heartbeat_interval_ms = 0;
  uint32_t heartbeat_timeout_ms = 0;
  bool operator==(const RegisterAckMsg&) const = default;
};

struct RegisterRefuseMsg {
  StatusCode code = StatusCode::kFailedPrecondition;
  std::string message;
  bool operator==(const RegisterRefuseMsg&) const = default;
};

struct WorkerLoad {
  uint32_t running = 0;
  uint32_t waiting = 0;
  uint64_t queued_tokens = 0;
  uint32_t kv_blocks_free = 0;
  uint32_t kv_blocks_total = 0;
  bool operator==(const WorkerLoad&) const = default;
};

struct HeartbeatMsg {
  uint64_t seq = 0;
  WorkerLoad load;
  bool draining = false;
  bool operator==(const HeartbeatMsg&) const = default;
};

struct HeartbeatAckMsg {
  uint64_t seq = 0;
  bool known = false;
  uint64_t router_incarnation = 0;
  bool operator==(const HeartbeatAckMsg&) const = default;
};

enum class JobPhase : uint8_t { kColocated, kDecode, kPrefill };
const char* JobPhaseName(JobPhase phase);

struct JobMsg {
  uint64_t request_id = 0;
  std::string request_tag;
  JobPhase phase = JobPhase::kColocated;
  std::vector<int32_t> prompt;
  SamplingParams sampling;  // common/sampling_params.h; the codec maps it to the wire
  int64_t deadline_unix_ms = 0;
  std::string kv_descriptor;            // prefill phase: opaque descriptor bytes
  std::string decode_worker_id;         // prefill phase
  std::string decode_transfer_address;  // prefill phase
  uint32_t dp_rank = 0;                 // the target DP rank (RegisterMsg::dp_rank)
  grammar::Constraint constraint;       // inactive: unconstrained
  uint64_t prefill_kv_namespace = 0;    // decode phase: the paired prefill worker's kv_namespace
  uint32_t pull_tokens = 0;             // prefill phase: prefix cached on pull_worker_id (0: none)
  std::string pull_worker_id;
  bool operator==(const JobMsg&) const = default;
};

struct KvReservedMsg {
  uint64_t request_id = 0;
  std::string descriptor;
  std::string transfer_address;
  uint32_t blocks = 0;
  bool operator==(const KvReservedMsg&) const = default;
};

struct TopLogprob {
  int32_t token = 0;
  float logprob = 0.0f;
  bool operator==(const TopLogprob&) const = default;
};

struct TokenLogprob {
  float logprob = 0.0f;
  std::vector<TopLogprob> top;
  bool operator==(const TokenLogprob&) const = default;
};

struct FirstTokenMsg {
  uint64_t request_id = 0;
  int32_t token = -1;
  TokenLogprob logprob;
  std::string constraint_state;  // the prefill's matcher state (TokenEventMsg::constraint_state)
  bool operator==(const FirstTokenMsg&) const = default;
};

struct TokenEventMsg {
  uint64_t request_id = 0;
  uint32_t first_index = 0;
  std::vector<int32_t> tokens;
  std::vector<TokenLogprob> logprobs;  // empty, or parallel to tokens
  FinishReason finish = FinishReason::kNone;
  Status error;                        // OK unless finish == kError
  uint32_t prompt_tokens = 0;
  uint32_t completion_tokens = 0;
  std::string stop_string;
  std::string constraint_state;  // prefill's finishing event of a constrained request
  uint32_t cached_prompt_tokens = 0;  // finishing event: prompt tokens the prefix cache supplied

  // A finishing event ends the sender's part of the job.
  bool finishing() const { return finish != FinishReason::kNone || !error.ok(); }
  bool operator==(const TokenEventMsg& o) const;
};

struct AbortMsg {
  uint64_t request_id = 0;
  std::string reason;
  bool operator==(const AbortMsg&) const = default;
};

struct DrainMsg {
  uint32_t timeout_ms = 0;
  bool operator==(const DrainMsg&) const = default;
};

struct DeregisterMsg {
  std::string reason;
  bool operator==(const DeregisterMsg&) const = default;
};

// Worker -> router: what the worker's prefix cache stored and removed (proto/control.capnp
// KvEvents; docs/router.md "KV-aware routing"). Hashes are chained block names under the
// worker's RegisterMsg::kv_namespace (common/block_hash.h).
struct KvEventsMsg {
  bool reset = false;               // `stored` is the whole set: forget what was known before
  uint32_t block_tokens = 0;        // B: hits are whole blocks (> 0)
  uint32_t first_chunk_tokens = 0;  // C: a hit maps at least C tokens or none
  std::vector<uint64_t> stored;     // now cached
  std::vector<uint64_t> removed;    // no longer cached (empty with reset)
  bool empty() const { return !reset && stored.empty() && removed.empty(); }
  bool operator==(const KvEventsMsg&) const = default;
};

// Pulls (proto/control.capnp KvPull / KvPush / KvPushFailed; docs/prefix-cache.md "Pulls").
struct KvPullMsg {
  uint64_t request_id = 0;
  std::string descriptor;  // opaque KV descriptor of the puller's blocks
  uint32_t first_token = 0;
  uint32_t num_tokens = 0;
  uint64_t kv_namespace = 0;
  bool operator==(const KvPullMsg&) const = default;
};

struct KvPushMsg {
  uint64_t request_id = 0;
  std::string request_tag;
  std::vector<int32_t> tokens;  // the prompt's first first_token + num_tokens tokens
  uint32_t first_token = 0;
  uint32_t num_tokens = 0;
  std::string descriptor;
  uint64_t kv_namespace = 0;
  bool operator==(const KvPushMsg&) const = default;
};

struct KvPushFailedMsg {
  uint64_t request_id = 0;
  std::string reason;
  bool operator==(const KvPushFailedMsg&) const = default;
};

using ControlMessage =
    std::variant<RegisterMsg, RegisterAckMsg, RegisterRefuseMsg, HeartbeatMsg, HeartbeatAckMsg,
                 JobMsg, KvReservedMsg, FirstTokenMsg, TokenEventMsg, AbortMsg, DrainMsg,
                 DeregisterMsg, KvEventsMsg, KvPullMsg, KvPushMsg, KvPushFailedMsg>;

// The message's name as in the schema ("register", "tokenEvent", ...), for logs and metrics.
const char* ControlMessageName(const ControlMessage& message);

}  // namespace pdserve::services
