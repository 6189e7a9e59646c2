#include "services/control/control_codec.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include <capnp/message.h>
#include <capnp/serialize.h>
#include <kj/array.h>
#include <kj/exception.h>

#include "proto/control.capnp.h"

namespace pdserve::services {

namespace cp = ::pdserve::proto::control;

namespace {

// ---------------------------------------------------------------------------------------------
// Encoding

capnp::Data::Reader AsData(const std::string& s) {
  return capnp::Data::Reader(reinterpret_cast<const kj::byte*>(s.data()), s.size());
}
capnp::Text::Reader AsText(const std::string& s) { return capnp::Text::Reader(s.data(), s.size()); }

Status CheckText(const std::string& s, const char* field) {
  if (s.size() > ControlLimits::kMaxTextBytes)
    return Status::InvalidArgument(std::string(field) + " is longer than the control-plane limit");
  return Status::Ok();
}

void SetCapacity(cp::Capacity::Builder b, const WorkerCapacity& c) {
  b.setMaxBatch(c.max_batch);
  b.setKvBlocksTotal(c.kv_blocks_total);
  b.setKvBlocksFree(c.kv_blocks_free);
  b.setBlockTokens(c.block_tokens);
  b.setMaxContextTokens(c.max_context_tokens);
  b.setDpRanks(c.dp_ranks);
  b.setPrefixTierBlocks(c.prefix_tier_blocks);
}

void SetLogprob(cp::TokenLogprob::Builder b, const TokenLogprob& lp) {
  b.setLogprob(lp.logprob);
  auto top = b.initTop(static_cast<unsigned>(lp.top.size()));
  for (size_t i = 0; i < lp.top.size(); ++i) {
    top[i].setToken(lp.top[i].token);
    top[i].setLogprob(lp.top[i].logprob);
  }
}

cp::WorkerRole ToWire(WorkerRole r) {
  switch (r) {
    case WorkerRole::kPrefill: return cp::WorkerRole::PREFILL;
    case WorkerRole::kDecode: return cp::WorkerRole::DECODE;
    case WorkerRole::kColocated: break;
  }
  return cp::WorkerRole::COLOCATED;
}

cp::JobPhase ToWire(JobPhase p) {
  switch (p) {
    case JobPhase::kDecode: return cp::JobPhase::DECODE;
    case JobPhase::kPrefill: return cp::JobPhase::PREFILL;
    case JobPhase::kColocated: break;
  }
  return cp::JobPhase::COLOCATED;
}

cp::FinishReason ToWire(FinishReason f) {
  switch (f) {
    case FinishReason::kStop: return cp::FinishReason::STOP;
    case FinishReason::kLength: return cp::FinishReason::LENGTH;
    case FinishReason::kAbort: return cp::FinishReason::ABORT;
    case FinishReason::kError: return cp::FinishReason::ERROR;
    case FinishReason::kNone: break;
  }
  return cp::FinishReason::NONE;
}

Status CheckSampling(const SamplingParams& s) {
  if (s.stop_token_ids.size() > ControlLimits::kMaxStopTokenIds)
    return Status::InvalidArgument("too many stop token ids");
  if (s.stop.size() > ControlLimits::kMaxStopStrings)
    return Status::InvalidArgument("too many stop strings");
  for (const auto& str : s.stop)
    if (str.size() > ControlLimits::kMaxStopStringBytes)
      return Status::InvalidArgument("stop string longer than the control-plane limit");
  if (s.logprobs && (*s.logprobs < 0 || static_cast<size_t>(*s.logprobs) > ControlLimits::kMaxTopLogprobs))
    return Status::InvalidArgument("top_logprobs beyond the control-plane limit");
  if (s.max_tokens < 0) return Status::InvalidArgument("negative max_tokens");
  if (s.resumed_output < 0) return Status::InvalidArgument("negative resumed_output");
  if (s.logit_bias.size() > SamplingParams::kMaxLogitBias) return Status::InvalidArgument("too many logit_bias entries");
  return Status::Ok();
}

cp::ConstraintKind ToWire(grammar::ConstraintKind k) {
  switch (k) {
    case grammar::ConstraintKind::kJsonObject: return cp::ConstraintKind::JSON_OBJECT;
    case grammar::ConstraintKind::kJsonSchema: return cp::ConstraintKind::JSON_SCHEMA;
    case grammar::ConstraintKind::kRegex: return cp::ConstraintKind::REGEX;
    case grammar::ConstraintKind::kEbnf: return cp::ConstraintKind::EBNF;
    case grammar::ConstraintKind::kNone: break;
  }
  return cp::ConstraintKind::NONE;
}

Status SetConstraint(cp::Constraint::Builder b, const grammar::Constraint& c) {
  if (c.text.size() > ControlLimits::kMaxConstraintBytes)
    return Status::InvalidArgument("constraint text larger than the control-plane limit");
  PDSERVE_RETURN_IF_ERROR(CheckText(c.free_text_until, "constraint.freeTextUntil"));
  b.setKind(ToWire(c.kind));
  b.setText(AsText(c.text));
  b.setFreeTextUntil(AsText(c.free_text_until));
  b.setJsonCompact(c.json.compact);
  b.setJsonMaxWhitespace(c.json.max_whitespace);
  b.setJsonStrict(c.json.strict);
  return Status::Ok();
}

// kvEvents rules, for both directions: a block size, lists within the limit, no removals in a
// reset (the whole set follows).
Status CheckKvEvents(bool reset, uint32_t block_tokens, size_t n_stored, size_t n_removed) {
  if (block_tokens == 0) return Status::InvalidArgument("kvEvents.blockTokens is 0");
  if (n_stored > ControlLimits::kMaxKvEventHashes || n_removed > ControlLimits::kMaxKvEventHashes)
    return Status::InvalidArgument("kvEvents lists more hashes than the control-plane limit");
  if (reset && n_removed != 0) return Status::InvalidArgument("kvEvents.removed must be empty with reset");
  return Status::Ok();
}

struct Encoder {
  cp::ControlMessage::Builder root;

  Status operator()(const RegisterMsg& m) {
    PDSERVE_RETURN_IF_ERROR(CheckText(m.worker_id, "workerId"));
    PDSERVE_RETURN_IF_ERROR(CheckText(m.control_address, "controlAddress"));
    PDSERVE_RETURN_IF_ERROR(CheckText(m.http_address, "httpAddress"));
    PDSERVE_RETURN_IF_ERROR(CheckText(m.transfer_address, "transferAddress"));
    PDSERVE_RETURN_IF_ERROR(CheckText(m.model_name, "modelName"));
    PDSERVE_RETURN_IF_ERROR(CheckText(m.instance_id, "instanceId"));
    auto b = root.initRegister();
    b.setProtocolVersion(m.protocol_version);
    b.setRole(ToWire(m.role));
    b.setWorkerId(AsText(m.worker_id));
    b.setIncarnation(m.incarnation);
    b.setControlAddress(AsText(m.control_address));
    b.setHttpAddress(AsText(m.http_address));
    b.setTransferAddress(AsData(m.transfer_address));
    SetCapacity(b.initCapacity(), m.capacity);
    b.setModelName(AsText(m.model_name));
    b.setCompatHash(m.compat_hash);
    b.setInstanceId(AsText(m.instance_id));
    b.setDpRank(m.dp_rank);
    b.setVocabSize(m.vocab_size);
    b.setKvNamespace(m.kv_namespace);
    return Status::Ok();
  }
  Status operator()(const RegisterAckMsg& m) {
    auto b = root.initRegisterAck();
    b.setRouterIncarnation(m.router_incarnation);
    b.setHeartbeatIntervalMs(m.heartbeat_interval_ms);
    b.setHeartbeatTimeoutMs(m.heartbeat_timeout_ms);
    return Status::Ok();
  }
  Status operator()(const RegisterRefuseMsg& m) {
    PDSERVE_RETURN_IF_ERROR(CheckText(m.message, "message"));
    auto b = root.initRegisterRefuse();
    b.setCode(static_cast<uint32_t>(m.code));
    b.setMessage(AsText(m.message));
    return Status::Ok();
  }
  Status operator()(const HeartbeatMsg& m) {
    auto b = root.initHeartbeat();
    b.setSeq(m.seq);
    b.setDraining(m.draining);
    auto l = b.initLoad();
    l.setRunning(m.load.running);
    l.setWaiting(m.load.waiting);
    l.setQueuedTokens(m.load.queued_tokens);
    l.setKvBlocksFree(m.load.kv_blocks_free);
    l.setKvBlocksTotal(m.load.kv_blocks_total);
    return Status::Ok();
  }
  Status operator()(const HeartbeatAckMsg& m) {
    auto b = root.initHeartbeatAck();
    b.setSeq(m.seq);
    b.setKnown(m.known);
    b.setRouterIncarnation(m.router_incarnation);
    return Status::Ok();
  }
  Status operator()(const JobMsg& m) {
    if (m.prompt.size() > ControlLimits::kMaxPromptTokens)
      return Status::InvalidArgument("prompt longer than the control-plane limit");
    if (m.kv_descriptor.size() > ControlLimits::kMaxBlobBytes)
      return Status::InvalidArgument("kvDescriptor larger than the control-plane limit");
    PDSERVE_RETURN_IF_ERROR(CheckText(m.request_tag, "requestTag"));
    PDSERVE_RETURN_IF_ERROR(CheckText(m.decode_worker_id, "decodeWorkerId"));
    PDSERVE_RETURN_IF_ERROR(CheckText(m.decode_transfer_address, "decodeTransferAddress"));
    PDSERVE_RETURN_IF_ERROR(CheckSampling(m.sampling));
    auto b = root.initJob();
    b.setRequestId(m.request_id);
    b.setRequestTag(AsText(m.request_tag));
    b.setPhase(ToWire(m.phase));
    auto prompt = b.initPromptTokenIds(static_cast<unsigned>(m.prompt.size()));
    for (size_t i = 0; i < m.prompt.size(); ++i) prompt.set(static_cast<unsigned>(i), m.prompt[i]);
    auto s = b.initSampling();
    const SamplingParams& sp = m.sampling;
    s.setTemperature(sp.temperature);
    s.setTopP(sp.top_p);
    s.setTopK(sp.top_k);
    s.setMinP(sp.min_p);
    s.setRepetitionPenalty(sp.repetition_penalty);
    s.setPresencePenalty(sp.presence_penalty);
    s.setFrequencyPenalty(sp.frequency_penalty);
    s.setHasSeed(sp.seed.has_value());
    s.setSeed(sp.seed.value_or(0));
    s.setMaxTokens(static_cast<uint32_t>(sp.max_tokens));
    auto ids = s.initStopTokenIds(static_cast<unsigned>(sp.stop_token_ids.size()));
    for (size_t i = 0; i < sp.stop_token_ids.size(); ++i) ids.set(static_cast<unsigned>(i), sp.stop_token_ids[i]);
    auto strs = s.initStopStrings(static_cast<unsigned>(sp.stop.size()));
    for (size_t i = 0; i < sp.stop.size(); ++i) strs.set(static_cast<unsigned>(i), AsText(sp.stop[i]));
    // The wire's (logprobs, topLogprobs) pair is the struct's optional top-n.
    s.setLogprobs(sp.logprobs.has_value());
    s.setTopLogprobs(static_cast<uint32_t>(sp.logprobs.value_or(0)));
    s.setResumedOutput(static_cast<uint32_t>(sp.resumed_output));
    auto bias = s.initLogitBias(static_cast<unsigned>(sp.logit_bias.size()));
    for (size_t i = 0; i < sp.logit_bias.size(); ++i) {
      bias[static_cast<unsigned>(i)].setToken(sp.logit_bias[i].token);
      bias[static_cast<unsigned>(i)].setBias(sp.logit_bias[i].bias);
    }
    PDSERVE_RETURN_IF_ERROR(SetConstraint(b.initConstraint(), m.constraint));
    b.setPrefillKvNamespace(m.prefill_kv_namespace);
    b.setDeadlineUnixMs(m.deadline_unix_ms);
    b.setKvDescriptor(AsData(m.kv_descriptor));
    b.setDecodeWorkerId(AsText(m.decode_worker_id));
    b.setDecodeTransferAddress(AsData(m.decode_transfer_address));
    b.setDpRank(m.dp_rank);
    PDSERVE_RETURN_IF_ERROR(CheckText(m.pull_worker_id, "pullWorkerId"));
    if (m.pull_tokens > m.prompt.size()) return Status::InvalidArgument("pullTokens exceeds the prompt");
    b.setPullTokens(m.pull_tokens);
    b.setPullWorkerId(AsText(m.pull_worker_id));
    return Status::Ok();
  }
  Status operator()(const KvPullMsg& m) {
    if (m.descriptor.size() > ControlLimits::kMaxBlobBytes)
      return Status::InvalidArgument("kvPull.descriptor larger than the control-plane limit");
    auto b = root.initKvPull();
    b.setRequestId(m.request_id);
    b.setDescriptor(AsData(m.descriptor));
    b.setFirstToken(m.first_token);
    b.setNumTokens(m.num_tokens);
    b.setKvNamespace(m.kv_namespace);
    return Status::Ok();
  }
  Status operator()(const KvPushMsg& m) {
    if (m.descriptor.size() > ControlLimits::kMaxBlobBytes)
      return Status::InvalidArgument("kvPush.descriptor larger than the control-plane limit");
    if (m.tokens.size() > ControlLimits::kMaxPromptTokens) return Status::InvalidArgument("kvPush.tokenIds too long");
    if (uint64_t{m.first_token} + m.num_tokens != m.tokens.size())
      return Status::InvalidArgument("kvPush.tokenIds must hold firstToken + numTokens tokens");
    PDSERVE_RETURN_IF_ERROR(CheckText(m.request_tag, "requestTag"));
    auto b = root.initKvPush();
    b.setRequestId(m.request_id);
    b.setRequestTag(AsText(m.request_tag));
    auto toks = b.initTokenIds(static_cast<unsigned>(m.tokens.size()));
    for (size_t i = 0; i < m.tokens.size(); ++i) toks.set(static_cast<unsigned>(i), m.tokens[i]);
    b.setFirstToken(m.first_token);
    b.setNumTokens(m.num_tokens);
    b.setDescriptor(AsData(m.descriptor));
    b.setKvNamespace(m.kv_namespace);
    return Status::Ok();
  }
  Status operator()(const KvPushFailedMsg& m) {
    auto b = root.initKvPushFailed();
    b.setRequestId(m.request_id);
    // A diagnostic: cut rather than refuse to report a failure.
    b.setReason(AsText(m.reason.substr(0, ControlLimits::kMaxTextBytes)));
    return Status::Ok();
  }
  Status operator()(const KvReservedMsg& m) {
    if (m.descriptor.size() > ControlLimits::kMaxBlobBytes)
      return Status::InvalidArgument("descriptor larger than the control-plane limit");
    PDSERVE_RETURN_IF_ERROR(CheckText(m.transfer_address, "transferAddress"));
    auto b = root.initKvReserved();
    b.setRequestId(m.request_id);
    b.setDescriptor(AsData(m.descriptor));
    b.setTransferAddress(AsData(m.transfer_address));
    b.setBlocks(m.blocks);
    return Status::Ok();
  }
  Status operator()(const FirstTokenMsg& m) {
    if (m.logprob.top.size() > ControlLimits::kMaxTopLogprobs)
      return Status::InvalidArgument("too many top logprobs");
    if (m.constraint_state.size() > ControlLimits::kMaxBlobBytes)
      return Status::InvalidArgument("constraintState larger than the control-plane limit");
    auto b = root.initFirstToken();
    b.setRequestId(m.request_id);
    b.setToken(m.token);
    SetLogprob(b.initLogprob(), m.logprob);
    b.setConstraintState(AsData(m.constraint_state));
    return Status::Ok();
  }
  Status operator()(const TokenEventMsg& m) {
    if (m.tokens.size() > ControlLimits::kMaxEventTokens)
      return Status::InvalidArgument("too many tokens in one event");
    if (!m.logprobs.empty() && m.logprobs.size() != m.tokens.size())
      return Status::InvalidArgument("logprobs must be empty or parallel to tokenIds");
    for (const auto& lp : m.logprobs)
      if (lp.top.size() > ControlLimits::kMaxTopLogprobs)
        return Status::InvalidArgument("too many top logprobs");
    PDSERVE_RETURN_IF_ERROR(CheckText(m.stop_string, "stopString"));
    if (m.constraint_state.size() > ControlLimits::kMaxBlobBytes)
      return Status::InvalidArgument("constraintState larger than the control-plane limit");
    auto b = root.initTokenEvent();
    b.setRequestId(m.request_id);
    b.setFirstIndex(m.first_index);
    auto toks = b.initTokenIds(static_cast<unsigned>(m.tokens.size()));
    for (size_t i = 0; i < m.tokens.size(); ++i) toks.set(static_cast<unsigned>(i), m.tokens[i]);
    auto lps = b.initLogprobs(static_cast<unsigned>(m.logprobs.size()));
    for (size_t i = 0; i < m.logprobs.size(); ++i) SetLogprob(lps[static_cast<unsigned>(i)], m.logprobs[i]);
    b.setFinishReason(ToWire(m.finish));
    b.setErrorCode(static_cast<uint32_t>(m.error.code()));
    // Error messages are diagnostics: cut rather than refuse to report a failure.
    const std::string msg = m.error.message().substr(0, ControlLimits::kMaxTextBytes);
    b.setErrorMessage(AsText(msg));
    b.setPromptTokens(m.prompt_tokens);
    b.setCompletionTokens(m.completion_tokens);
    b.setStopString(AsText(m.stop_string));
    b.setConstraintState(AsData(m.constraint_state));
    b.setCachedPromptTokens(m.cached_prompt_tokens);
    return Status::Ok();
  }
  Status operator()(const AbortMsg& m) {
    PDSERVE_RETURN_IF_ERROR(CheckText(m.reason, "reason"));
    auto b = root.initAbort();
    b.setRequestId(m.request_id);
    b.setReason(AsText(m.reason));
    return Status::Ok();
  }
  Status operator()(const DrainMsg& m) {
    root.initDrain().setTimeoutMs(m.timeout_ms);
    return Status::Ok();
  }
  Status operator()(const DeregisterMsg& m) {
    PDSERVE_RETURN_IF_ERROR(CheckText(m.reason, "reason"));
    root.initDeregister().setReason(AsText(m.reason));
    return Status::Ok();
  }
  Status operator()(const KvEventsMsg& m) {
    PDSERVE_RETURN_IF_ERROR(CheckKvEvents(m.reset, m.block_tokens, m.stored.size(), m.removed.size()));
    auto b = root.initKvEvents();
    b.setReset(m.reset);
    b.setBlockTokens(m.block_tokens);
    b.setFirstChunkTokens(m.first_chunk_tokens);
    auto stored = b.initStored(static_cast<unsigned>(m.stored.size()));
    for (size_t i = 0; i < m.stored.size(); ++i) stored.set(static_cast<unsigned>(i), m.stored[i]);
    auto removed = b.initRemoved(static_cast<unsigned>(m.removed.size()));
    for (size_t i = 0; i < m.removed.size(); ++i) removed.set(static_cast<unsigned>(i), m.removed[i]);
    return Status::Ok();
  }
};

// ---------------------------------------------------------------------------------------------
// Decoding

std::string ToString(capnp::Text::Reader t) { return std::string(t.cStr(), t.size()); }
std::string ToString(capnp::Data::Reader d) {
  return std::string(reinterpret_cast<const char*>(d.begin()), d.size());
}

Result<std::string> ReadText(capnp::Text::Reader t, const char* field, size_t limit = ControlLimits::kMaxTextBytes) {
  if (t.size() > limit) return Status::InvalidArgument(std::string(field) + " exceeds its size limit");
  return ToString(t);
}
Result<std::string> ReadData(capnp::Data::Reader d, const char* field, size_t limit = ControlLimits::kMaxTextBytes) {
  if (d.size() > limit) return Status::InvalidArgument(std::string(field) + " exceeds its size limit");
  return ToString(d);
}

Status CheckFinite(float v, const char* field) {
  if (!std::isfinite(v)) return Status::InvalidArgument(std::string(field) + " is not a finite number");
  return Status::Ok();
}

Result<std::vector<int32_t>> ReadTokens(capnp::List<int32_t>::Reader list, size_t limit, const char* field) {
  if (list.size() > limit) return Status::InvalidArgument(std::string(field) + " has too many tokens");
  std::vector<int32_t> out;
  out.reserve(list.size());
  for (int32_t t : list) {
    if (t < 0) return Status::InvalidArgument(std::string(field) + " holds a negative token id");
    out.push_back(t);
  }
  return out;
}

Result<TokenLogprob> ReadLogprob(cp::TokenLogprob::Reader r) {
  TokenLogprob lp;
  lp.logprob = r.getLogprob();
  // -inf is a legitimate logprob (a token the sampler could never pick); NaN is not.
  if (std::isnan(lp.logprob)) return Status::InvalidArgument("logprob is NaN");
  auto top = r.getTop();
  if (top.size() > ControlLimits::kMaxTopLogprobs) return Status::InvalidArgument("too many top logprobs");
  for (auto t : top) {
    if (t.getToken() < 0) return Status::InvalidArgument("top logprob with a negative token id");
    if (std::isnan(t.getLogprob())) return Status::InvalidArgument("top logprob is NaN");
    lp.top.push_back({t.getToken(), t.getLogprob()});
  }
  return lp;
}

Result<StatusCode> ReadCode(uint32_t code) {
  if (code > static_cast<uint32_t>(StatusCode::kDataLoss)) return Status::InvalidArgument("unknown status code");
  return static_cast<StatusCode>(code);
}

Result<ControlMessage> DecodeRegister(cp::Register::Reader r) {
  RegisterMsg m;
  m.protocol_version = r.getProtocolVersion();
  switch (r.getRole()) {
    case cp::WorkerRole::PREFILL: m.role = WorkerRole::kPrefill; break;
    case cp::WorkerRole::DECODE: m.role = WorkerRole::kDecode; break;
    case cp::WorkerRole::COLOCATED: m.role = WorkerRole::kColocated; break;
    default: return Status::InvalidArgument("register.role is unknown");
  }
  PDSERVE_ASSIGN_OR_RETURN(m.worker_id, ReadText(r.getWorkerId(), "register.workerId"));
  if (m.worker_id.empty()) return Status::InvalidArgument("register.workerId is empty");
  m.incarnation = r.getIncarnation();
  PDSERVE_ASSIGN_OR_RETURN(m.control_address, ReadText(r.getControlAddress(), "register.controlAddress"));
  PDSERVE_ASSIGN_OR_RETURN(m.http_address, ReadText(r.getHttpAddress(), "register.httpAddress"));
  PDSERVE_ASSIGN_OR_RETURN(m.transfer_address, ReadData(r.getTransferAddress(), "register.transferAddress"));
  auto c = r.getCapacity();
  m.capacity = {c.getMaxBatch(), c.getKvBlocksTotal(), c.getKvBlocksFree(), c.getBlockTokens(),
                c.getMaxContextTokens(), c.getDpRanks(), c.getPrefixTierBlocks()};
  PDSERVE_ASSIGN_OR_RETURN(m.model_name, ReadText(r.getModelName(), "register.modelName"));
  m.compat_hash = r.getCompatHash();
  PDSERVE_ASSIGN_OR_RETURN(m.instance_id, ReadText(r.getInstanceId(), "register.instanceId"));
  m.dp_rank = r.getDpRank();
  m.vocab_size = r.getVocabSize();
  m.kv_namespace = r.getKvNamespace();
  if (m.capacity.dp_ranks < 1 || m.dp_rank >= m.capacity.dp_ranks)
    return Status::InvalidArgument("register.dpRank " + std::to_string(m.dp_rank) + " is outside the instance's " +
                                   std::to_string(m.capacity.dp_ranks) + " DP ranks");
  return ControlMessage(std::move(m));
}

Result<ControlMessage> DecodeHeartbeat(cp::Heartbeat::Reader r) {
  HeartbeatMsg m;
  m.seq = r.getSeq();
  m.draining = r.getDraining();
  auto l = r.getLoad();
  m.load.running = l.getRunning();
  m.load.waiting = l.getWaiting();
  m.load.queued_tokens = l.getQueuedTokens();
  m.load.kv_blocks_free = l.getKvBlocksFree();
  m.load.kv_blocks_total = l.getKvBlocksTotal();
  return ControlMessage(std::move(m));
}

Result<grammar::Constraint> ReadConstraint(cp::Constraint::Reader r) {
  grammar::Constraint c;
  switch (r.getKind()) {
    case cp::ConstraintKind::NONE: c.kind = grammar::ConstraintKind::kNone; break;
    case cp::ConstraintKind::JSON_OBJECT: c.kind = grammar::ConstraintKind::kJsonObject; break;
    case cp::ConstraintKind::JSON_SCHEMA: c.kind = grammar::ConstraintKind::kJsonSchema; break;
    case cp::ConstraintKind::REGEX: c.kind = grammar::ConstraintKind::kRegex; break;
    case cp::ConstraintKind::EBNF: c.kind = grammar::ConstraintKind::kEbnf; break;
    default: return Status::InvalidArgument("job.constraint.kind is unknown");
  }
  PDSERVE_ASSIGN_OR_RETURN(c.text, ReadText(r.getText(), "job.constraint.text", ControlLimits::kMaxConstraintBytes));
  PDSERVE_ASSIGN_OR_RETURN(c.free_text_until, ReadText(r.getFreeTextUntil(), "job.constraint.freeTextUntil"));
  c.json.compact = r.getJsonCompact();
  c.json.max_whitespace = r.getJsonMaxWhitespace();
  c.json.strict = r.getJsonStrict();
  if (c.json.max_whitespace < 0) return Status::InvalidArgument("job.constraint.jsonMaxWhitespace is negative");
  return c;
}

Result<ControlMessage> DecodeJob(cp::Job::Reader r) {
  JobMsg m;
  m.request_id = r.getRequestId();
  PDSERVE_ASSIGN_OR_RETURN(m.request_tag, ReadText(r.getRequestTag(), "job.requestTag"));
  switch (r.getPhase()) {
    case cp::JobPhase::COLOCATED: m.phase = JobPhase::kColocated; break;
    case cp::JobPhase::DECODE: m.phase = JobPhase::kDecode; break;
    case cp::JobPhase::PREFILL: m.phase = JobPhase::kPrefill; break;
    default: return Status::InvalidArgument("job.phase is unknown");
  }
  PDSERVE_ASSIGN_OR_RETURN(m.prompt, ReadTokens(r.getPromptTokenIds(), ControlLimits::kMaxPromptTokens, "job.promptTokenIds"));
  if (m.prompt.empty()) return Status::InvalidArgument("job.promptTokenIds is empty");
  auto s = r.getSampling();
  SamplingParams& sp = m.sampling;
  sp.temperature = s.getTemperature();
  sp.top_p = s.getTopP();
  sp.top_k = s.getTopK();
  sp.min_p = s.getMinP();
  sp.repetition_penalty = s.getRepetitionPenalty();
  sp.presence_penalty = s.getPresencePenalty();
  sp.frequency_penalty = s.getFrequencyPenalty();
  for (auto [v, name] : {std::pair{sp.temperature, "temperature"}, {sp.top_p, "topP"}, {sp.min_p, "minP"},
                         {sp.repetition_penalty, "repetitionPenalty"}, {sp.presence_penalty, "presencePenalty"},
                         {sp.frequency_penalty, "frequencyPenalty"}})
    PDSERVE_RETURN_IF_ERROR(CheckFinite(v, name));
  if (s.getHasSeed()) sp.seed = s.getSeed();
  if (s.getMaxTokens() == 0) return Status::InvalidArgument("job.sampling.maxTokens is 0");
  // The engine's request length is int32; no worker can produce 2^30 tokens anyway.
  sp.max_tokens = static_cast<int32_t>(std::min<uint32_t>(s.getMaxTokens(), 1u << 30));
  PDSERVE_ASSIGN_OR_RETURN(sp.stop_token_ids, ReadTokens(s.getStopTokenIds(), ControlLimits::kMaxStopTokenIds, "job.sampling.stopTokenIds"));
  auto strs = s.getStopStrings();
  if (strs.size() > ControlLimits::kMaxStopStrings) return Status::InvalidArgument("job.sampling.stopStrings too long");
  for (auto t : strs) {
    PDSERVE_ASSIGN_OR_RETURN(std::string str, ReadText(t, "job.sampling.stopStrings[]", ControlLimits::kMaxStopStringBytes));
    sp.stop.push_back(std::move(str));
  }
  if (s.getTopLogprobs() > ControlLimits::kMaxTopLogprobs) return Status::InvalidArgument("job.sampling.topLogprobs too large");
  // Alternatives beyond the sampler's limit are not an error on the wire: the worker reports
  // kMaxLogprobs of them.
  if (s.getLogprobs())
    sp.logprobs = static_cast<int32_t>(std::min<uint32_t>(s.getTopLogprobs(), SamplingParams::kMaxLogprobs));
  if (s.getResumedOutput() >= m.prompt.size())
    return Status::InvalidArgument("job.sampling.resumedOutput must be below the prompt length");
  sp.resumed_output = static_cast<int32_t>(s.getResumedOutput());
  auto bias = s.getLogitBias();
  if (bias.size() > SamplingParams::kMaxLogitBias) return Status::InvalidArgument("job.sampling.logitBias too long");
  for (auto b : bias) {
    PDSERVE_RETURN_IF_ERROR(CheckFinite(b.getBias(), "job.sampling.logitBias[].bias"));
    sp.logit_bias.push_back({b.getToken(), b.getBias()});
  }
  PDSERVE_ASSIGN_OR_RETURN(m.constraint, ReadConstraint(r.getConstraint()));
  m.prefill_kv_namespace = r.getPrefillKvNamespace();
  m.deadline_unix_ms = r.getDeadlineUnixMs();
  PDSERVE_ASSIGN_OR_RETURN(m.kv_descriptor, ReadData(r.getKvDescriptor(), "job.kvDescriptor", ControlLimits::kMaxBlobBytes));
  PDSERVE_ASSIGN_OR_RETURN(m.decode_worker_id, ReadText(r.getDecodeWorkerId(), "job.decodeWorkerId"));
  PDSERVE_ASSIGN_OR_RETURN(m.decode_transfer_address, ReadData(r.getDecodeTransferAddress(), "job.decodeTransferAddress"));
  m.dp_rank = r.getDpRank();
  m.pull_tokens = r.getPullTokens();
  if (m.pull_tokens > m.prompt.size()) return Status::InvalidArgument("job.pullTokens exceeds the prompt");
  PDSERVE_ASSIGN_OR_RETURN(m.pull_worker_id, ReadText(r.getPullWorkerId(), "job.pullWorkerId"));
  return ControlMessage(std::move(m));
}

Result<ControlMessage> DecodeKvPush(cp::KvPush::Reader r) {
  KvPushMsg m;
  m.request_id = r.getRequestId();
  PDSERVE_ASSIGN_OR_RETURN(m.request_tag, ReadText(r.getRequestTag(), "kvPush.requestTag"));
  PDSERVE_ASSIGN_OR_RETURN(m.tokens, ReadTokens(r.getTokenIds(), ControlLimits::kMaxPromptTokens, "kvPush.tokenIds"));
  m.first_token = r.getFirstToken();
  m.num_tokens = r.getNumTokens();
  if (uint64_t{m.first_token} + m.num_tokens != m.tokens.size())
    return Status::InvalidArgument("kvPush.tokenIds must hold firstToken + numTokens tokens");
  PDSERVE_ASSIGN_OR_RETURN(m.descriptor, ReadData(r.getDescriptor(), "kvPush.descriptor", ControlLimits::kMaxBlobBytes));
  m.kv_namespace = r.getKvNamespace();
  return ControlMessage(std::move(m));
}

Result<ControlMessage> DecodeTokenEvent(cp::TokenEvent::Reader r) {
  TokenEventMsg m;
  m.request_id = r.getRequestId();
  m.first_index = r.getFirstIndex();
  PDSERVE_ASSIGN_OR_RETURN(m.tokens, ReadTokens(r.getTokenIds(), ControlLimits::kMaxEventTokens, "tokenEvent.tokenIds"));
  auto lps = r.getLogprobs();
  if (lps.size() != 0 && lps.size() != m.tokens.size())
    return Status::InvalidArgument("tokenEvent.logprobs is not parallel to tokenIds");
  for (auto lp : lps) {
    PDSERVE_ASSIGN_OR_RETURN(TokenLogprob v, ReadLogprob(lp));
    m.logprobs.push_back(std::move(v));
  }
  switch (r.getFinishReason()) {
    case cp::FinishReason::NONE: m.finish = FinishReason::kNone; break;
    case cp::FinishReason::STOP: m.finish = FinishReason::kStop; break;
    case cp::FinishReason::LENGTH: m.finish = FinishReason::kLength; break;
    case cp::FinishReason::ABORT: m.finish = FinishReason::kAbort; break;
    case cp::FinishReason::ERROR: m.finish = FinishReason::kError; break;
    default: return Status::InvalidArgument("tokenEvent.finishReason is unknown");
  }
  PDSERVE_ASSIGN_OR_RETURN(StatusCode code, ReadCode(r.getErrorCode()));
  PDSERVE_ASSIGN_OR_RETURN(std::string msg, ReadText(r.getErrorMessage(), "tokenEvent.errorMessage"));
  if (code != StatusCode::kOk) {
    m.error = Status(code, msg.empty() ? "worker reported an error" : msg);
  } else if (m.finish == FinishReason::kError) {
    m.error = Status::Internal(msg.empty() ? "worker reported an error without a code" : msg);
  }
  m.prompt_tokens = r.getPromptTokens();
  m.completion_tokens = r.getCompletionTokens();
  PDSERVE_ASSIGN_OR_RETURN(m.stop_string, ReadText(r.getStopString(), "tokenEvent.stopString"));
  PDSERVE_ASSIGN_OR_RETURN(m.constraint_state,
                           ReadData(r.getConstraintState(), "tokenEvent.constraintState", ControlLimits::kMaxBlobBytes));
  m.cached_prompt_tokens = r.getCachedPromptTokens();
  return ControlMessage(std::move(m));
}

Result<ControlMessage> DecodeKvEvents(cp::KvEvents::Reader r) {
  KvEventsMsg m;
  m.reset = r.getReset();
  m.block_tokens = r.getBlockTokens();
  m.first_chunk_tokens = r.getFirstChunkTokens();
  auto stored = r.getStored();
  auto removed = r.getRemoved();
  PDSERVE_RETURN_IF_ERROR(CheckKvEvents(m.reset, m.block_tokens, stored.size(), removed.size()));
  m.stored.reserve(stored.size());
  for (uint64_t h : stored) m.stored.push_back(h);
  m.removed.reserve(removed.size());
  for (uint64_t h : removed) m.removed.push_back(h);
  return ControlMessage(std::move(m));
}

Result<ControlMessage> DecodeRoot(cp::ControlMessage::Reader root) {
  switch (root.which()) {
    case cp::ControlMessage::REGISTER: return DecodeRegister(root.getRegister());
    case cp::ControlMessage::REGISTER_ACK: {
      auto r = root.getRegisterAck();
      return ControlMessage(RegisterAckMsg{r.getRouterIncarnation(), r.getHeartbeatIntervalMs(), r.getHeartbeatTimeoutMs()});
    }
    case cp::ControlMessage::REGISTER_REFUSE: {
      auto r = root.getRegisterRefuse();
      RegisterRefuseMsg m;
      PDSERVE_ASSIGN_OR_RETURN(m.code, ReadCode(r.getCode()));
      PDSERVE_ASSIGN_OR_RETURN(m.message, ReadText(r.getMessage(), "registerRefuse.message"));
      return ControlMessage(std::move(m));
    }
    case cp::ControlMessage::HEARTBEAT: return DecodeHeartbeat(root.getHeartbeat());
    case cp::ControlMessage::HEARTBEAT_ACK: {
      auto r = root.getHeartbeatAck();
      return ControlMessage(HeartbeatAckMsg{r.getSeq(), r.getKnown(), r.getRouterIncarnation()});
    }
    case cp::ControlMessage::JOB: return DecodeJob(root.getJob());
    case cp::ControlMessage::KV_RESERVED: {
      auto r = root.getKvReserved();
      KvReservedMsg m;
      m.request_id = r.getRequestId();
      PDSERVE_ASSIGN_OR_RETURN(m.descriptor, ReadData(r.getDescriptor(), "kvReserved.descriptor", ControlLimits::kMaxBlobBytes));
      PDSERVE_ASSIGN_OR_RETURN(m.transfer_address, ReadData(r.getTransferAddress(), "kvReserved.transferAddress"));
      m.blocks = r.getBlocks();
      return ControlMessage(std::move(m));
    }
    case cp::ControlMessage::FIRST_TOKEN: {
      auto r = root.getFirstToken();
      FirstTokenMsg m;
      m.request_id = r.getRequestId();
      m.token = r.getToken();
      if (m.token < 0) return Status::InvalidArgument("firstToken.token is negative");
      PDSERVE_ASSIGN_OR_RETURN(m.logprob, ReadLogprob(r.getLogprob()));
      PDSERVE_ASSIGN_OR_RETURN(m.constraint_state,
                               ReadData(r.getConstraintState(), "firstToken.constraintState", ControlLimits::kMaxBlobBytes));
      return ControlMessage(std::move(m));
    }
    case cp::ControlMessage::TOKEN_EVENT: return DecodeTokenEvent(root.getTokenEvent());
    case cp::ControlMessage::ABORT: {
      auto r = root.getAbort();
      AbortMsg m;
      m.request_id = r.getRequestId();
      PDSERVE_ASSIGN_OR_RETURN(m.reason, ReadText(r.getReason(), "abort.reason"));
      return ControlMessage(std::move(m));
    }
    case cp::ControlMessage::DRAIN: return ControlMessage(DrainMsg{root.getDrain().getTimeoutMs()});
    case cp::ControlMessage::DEREGISTER: {
      DeregisterMsg m;
      PDSERVE_ASSIGN_OR_RETURN(m.reason, ReadText(root.getDeregister().getReason(), "deregister.reason"));
      return ControlMessage(std::move(m));
    }
    case cp::ControlMessage::KV_EVENTS: return DecodeKvEvents(root.getKvEvents());
    case cp::ControlMessage::KV_PULL: {
      auto r = root.getKvPull();
      KvPullMsg m;
      m.request_id = r.getRequestId();
      PDSERVE_ASSIGN_OR_RETURN(m.descriptor, ReadData(r.getDescriptor(), "kvPull.descriptor", ControlLimits::kMaxBlobBytes));
      m.first_token = r.getFirstToken();
      m.num_tokens = r.getNumTokens();
      m.kv_namespace = r.getKvNamespace();
      return ControlMessage(std::move(m));
    }
    case cp::ControlMessage::KV_PUSH: return DecodeKvPush(root.getKvPush());
    case cp::ControlMessage::KV_PUSH_FAILED: {
      auto r = root.getKvPushFailed();
      KvPushFailedMsg m;
      m.request_id = r.getRequestId();
      PDSERVE_ASSIGN_OR_RETURN(m.reason, ReadText(r.getReason(), "kvPushFailed.reason"));
      return ControlMessage(std::move(m));
    }
  }
  return Status::Unimplemented("control message of an unknown kind (a newer peer?)");
}

}  // namespace

Result<std::string> EncodeControlMessage(const ControlMessage& message) {
  try {
    capnp::MallocMessageBuilder builder;
    auto root = builder.initRoot<cp::ControlMessage>();
    PDSERVE_RETURN_IF_ERROR(std::visit(Encoder{root}, message));
    kj::Array<capnp::word> words = capnp::messageToFlatArray(builder);
    auto bytes = words.asBytes();
    if (bytes.size() > ControlLimits::kMaxMessageBytes)
      return Status::InvalidArgument("control message larger than the control-plane limit");
    return std::string(reinterpret_cast<const char*>(bytes.begin()), bytes.size());
  } catch (const kj::Exception& e) {
    return Status::Internal(std::string("encoding a control message failed: ") + e.getDescription().cStr());
  }
}

Result<ControlMessage> DecodeControlMessage(std::string_view bytes) {
  if (bytes.empty()) return Status::InvalidArgument("empty control message");
  if (bytes.size() % sizeof(capnp::word) != 0)
    return Status::InvalidArgument("control message size is not a multiple of 8 bytes");
  if (bytes.size() > ControlLimits::kMaxMessageBytes)
    return Status::InvalidArgument("control message larger than the control-plane limit");
  // ZeroMQ frames carry no alignment guarantee; Cap'n Proto readers need word alignment.
  kj::Array<capnp::word> words = kj::heapArray<capnp::word>(bytes.size() / sizeof(capnp::word));
  std::memcpy(words.begin(), bytes.data(), bytes.size());
  try {
    capnp::ReaderOptions options;
    options.traversalLimitInWords = ControlLimits::kMaxMessageBytes / sizeof(capnp::word);
    options.nestingLimit = 16;
    capnp::FlatArrayMessageReader reader(words.asPtr(), options);
    return DecodeRoot(reader.getRoot<cp::ControlMessage>());
  } catch (const kj::Exception& e) {
    return Status::InvalidArgument(std::string("malformed control message: ") + e.getDescription().cStr());
  }
}

}  // namespace pdserve::services
