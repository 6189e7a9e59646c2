#include "services/control/control_messages.h"

namespace pdserve::services {

const char* WorkerRoleName(WorkerRole role) {
  switch (role) {
    case WorkerRole::kPrefill: return "prefill";
    case WorkerRole::kDecode: return "decode";
    case WorkerRole::kColocated: return "colocated";
  }
  return "unknown";
}

Result<WorkerRole> ParseWorkerRole(std::string_view name) {
  if (name == "prefill") return WorkerRole::kPrefill;
  if (name == "decode") return WorkerRole::kDecode;
  if (name == "colocated") return WorkerRole::kColocated;
  return Status::InvalidArgument("unknown worker role '" + std::string(name) +
                                 "' (expected prefill, decode or colocated)");
}

const char* JobPhaseName(JobPhase phase) {
  switch (phase) {
    case JobPhase::kColocated: return "colocated";
    case JobPhase::kDecode: return "decode";
    case JobPhase::kPrefill: return "prefill";
  }
  return "unknown";
}

bool TokenEventMsg::operator==(const TokenEventMsg& o) const {
  return request_id == o.request_id && first_index == o.first_index && tokens == o.tokens &&
         logprobs == o.logprobs && finish == o.finish && error.code() == o.error.code() &&
         error.message() == o.error.message() && prompt_tokens == o.prompt_tokens &&
         completion_tokens == o.completion_tokens && stop_string == o.stop_string &&
         constraint_state == o.constraint_state && cached_prompt_tokens == o.cached_prompt_tokens;
}

const char* ControlMessageName(const ControlMessage& message) {
  static constexpr const char* kNames[] = {
      "register", "registerAck", "registerRefuse", "heartbeat", "heartbeatAck", "job",
      "kvReserved", "firstToken", "tokenEvent", "abort", "drain", "deregister", "kvEvents",
      "kvPull", "kvPush", "kvPushFailed"};
  static_assert(std::variant_size_v<ControlMessage> == std::size(kNames));
  return kNames[message.index()];
}

}  // namespace pdserve::services
