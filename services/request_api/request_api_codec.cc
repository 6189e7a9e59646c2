#include "services/request_api/request_api_codec.h"

#include <cmath>
#include <cstring>

#include <capnp/message.h>
#include <capnp/serialize.h>
#include <kj/array.h>
#include <kj/exception.h>

#include "proto/request_api.capnp.h"

namespace pdserve::services::api {

namespace rp = ::pdserve::proto::request_api;

const char* MessageName(const Message& m) {
  static constexpr const char* kNames[] = {"submit", "abort", "ping", "accepted", "output", "error", "pong", "keepalive"};
  return kNames[m.index()];
}

namespace {

capnp::Text::Reader AsText(const std::string& s) { return capnp::Text::Reader(s.data(), s.size()); }

Status CheckSize(size_t n, size_t limit, const char* field) {
  if (n > limit) return Status::InvalidArgument(std::string(field) + " exceeds its size limit");
  return Status::Ok();
}

template <typename T>
void SetInts(typename capnp::List<T>::Builder b, const std::vector<T>& v) {
  for (size_t i = 0; i < v.size(); ++i) b.set(static_cast<unsigned>(i), v[i]);
}

void SetLogprobs(capnp::List<rp::TokenLogprob>::Builder b, const std::vector<TokenLogprob>& v) {
  for (size_t i = 0; i < v.size(); ++i) {
    b[i].setLogprob(v[i].logprob);
    auto top = b[i].initTop(static_cast<unsigned>(v[i].top.size()));
    for (size_t j = 0; j < v[i].top.size(); ++j) {
      top[j].setToken(v[i].top[j].token);
      top[j].setLogprob(v[i].top[j].logprob);
    }
  }
}

struct Encoder {
  rp::RequestApiMessage::Builder root;

  Status operator()(const Submit& m) {
    PDSERVE_RETURN_IF_ERROR(CheckSize(m.prompt_ids.size(), Limits::kMaxPromptTokens, "submit.prompt.tokenIds"));
    PDSERVE_RETURN_IF_ERROR(CheckSize(m.prompt_text.size(), Limits::kMaxTextBytes, "submit.prompt.text"));
    PDSERVE_RETURN_IF_ERROR(CheckSize(m.messages.size(), Limits::kMaxMessages, "submit.prompt.messages"));
    PDSERVE_RETURN_IF_ERROR(CheckSize(m.stop.size(), Limits::kMaxListItems, "submit.stop"));
    PDSERVE_RETURN_IF_ERROR(CheckSize(m.stop_token_ids.size(), Limits::kMaxListItems, "submit.stopTokenIds"));
    auto b = root.initSubmit();
    b.setRequestId(m.request_id);
    b.setModel(AsText(m.model));
    switch (m.kind) {
      case PromptKind::kTokenIds:
        SetInts<int32_t>(b.getPrompt().initTokenIds(static_cast<unsigned>(m.prompt_ids.size())), m.prompt_ids);
        break;
      case PromptKind::kText: b.getPrompt().setText(AsText(m.prompt_text)); break;
      case PromptKind::kChat: {
        auto list = b.getPrompt().initMessages(static_cast<unsigned>(m.messages.size()));
        for (size_t i = 0; i < m.messages.size(); ++i) {
          const ChatMessage& cm = m.messages[i];
          PDSERVE_RETURN_IF_ERROR(CheckSize(cm.tool_calls.size(), Limits::kMaxListItems, "submit.messages[].toolCalls"));
          list[i].setRole(AsText(cm.role));
          list[i].setHasContent(cm.content.has_value());
          if (cm.content) list[i].setContent(AsText(*cm.content));
          auto calls = list[i].initToolCalls(static_cast<unsigned>(cm.tool_calls.size()));
          for (size_t j = 0; j < cm.tool_calls.size(); ++j) {
            calls[j].setName(AsText(cm.tool_calls[j].name));
            calls[j].setArguments(AsText(cm.tool_calls[j].arguments));
          }
        }
        break;
      }
    }
    b.setThinking(!m.thinking ? rp::Thinking::UNSET : *m.thinking ? rp::Thinking::ON : rp::Thinking::OFF);
    auto s = b.initSampling();
    const Sampling& sp = m.sampling;
    if (sp.max_tokens) s.setHasMaxTokens(true), s.setMaxTokens(*sp.max_tokens);
    if (sp.temperature) s.setHasTemperature(true), s.setTemperature(*sp.temperature);
    if (sp.top_p) s.setHasTopP(true), s.setTopP(*sp.top_p);
    if (sp.top_k) s.setHasTopK(true), s.setTopK(*sp.top_k);
    if (sp.min_p) s.setHasMinP(true), s.setMinP(*sp.min_p);
    if (sp.presence_penalty) s.setHasPresencePenalty(true), s.setPresencePenalty(*sp.presence_penalty);
    if (sp.frequency_penalty) s.setHasFrequencyPenalty(true), s.setFrequencyPenalty(*sp.frequency_penalty);
    if (sp.repetition_penalty) s.setHasRepetitionPenalty(true), s.setRepetitionPenalty(*sp.repetition_penalty);
    if (sp.seed) s.setHasSeed(true), s.setSeed(*sp.seed);
    auto stop = b.initStop(static_cast<unsigned>(m.stop.size()));
    for (size_t i = 0; i < m.stop.size(); ++i) stop.set(static_cast<unsigned>(i), AsText(m.stop[i]));
    SetInts<int32_t>(b.initStopTokenIds(static_cast<unsigned>(m.stop_token_ids.size())), m.stop_token_ids);
    b.setIgnoreEos(m.ignore_eos);
    b.setSkipSpecialTokens(m.skip_special_tokens);
    b.setLogprobs(m.logprobs);
    b.setTopLogprobs(m.top_logprobs);
    b.setUser(AsText(m.user));
    b.setApiKey(AsText(m.api_key));
    PDSERVE_RETURN_IF_ERROR(CheckSize(m.logit_bias.size(), Limits::kMaxListItems, "submit.logitBias"));
    PDSERVE_RETURN_IF_ERROR(CheckSize(m.tools.size(), Limits::kMaxListItems, "submit.tools"));
    b.setN(m.n);
    auto bias = b.initLogitBias(static_cast<unsigned>(m.logit_bias.size()));
    for (size_t i = 0; i < m.logit_bias.size(); ++i) {
      bias[i].setToken(m.logit_bias[i].token);
      bias[i].setBias(m.logit_bias[i].bias);
    }
    auto tools = b.initTools(static_cast<unsigned>(m.tools.size()));
    for (size_t i = 0; i < m.tools.size(); ++i) {
      tools[i].setName(AsText(m.tools[i].name));
      tools[i].setDescription(AsText(m.tools[i].description));
      tools[i].setParameters(AsText(m.tools[i].parameters));
    }
    auto choice = b.initToolChoice();
    switch (m.tool_choice.mode) {
      case ToolChoiceMode::kAuto: choice.setMode(rp::ToolChoiceMode::AUTO); break;
      case ToolChoiceMode::kNone: choice.setMode(rp::ToolChoiceMode::NONE); break;
      case ToolChoiceMode::kRequired: choice.setMode(rp::ToolChoiceMode::REQUIRED); break;
      case ToolChoiceMode::kFunction: choice.setMode(rp::ToolChoiceMode::FUNCTION); break;
    }
    choice.setFunction(AsText(m.tool_choice.function));
    auto rf = b.initResponseFormat();
    switch (m.response_format.type) {
      case ResponseFormatType::kText: rf.setType(rp::ResponseFormatType::TEXT); break;
      case ResponseFormatType::kJsonObject: rf.setType(rp::ResponseFormatType::JSON_OBJECT); break;
      case ResponseFormatType::kJsonSchema: rf.setType(rp::ResponseFormatType::JSON_SCHEMA); break;
      case ResponseFormatType::kRegex: rf.setType(rp::ResponseFormatType::REGEX); break;
      case ResponseFormatType::kGrammar: rf.setType(rp::ResponseFormatType::GRAMMAR); break;
    }
    rf.setText(AsText(m.response_format.text));
    rf.setStrict(m.response_format.strict);
    return Status::Ok();
  }
  Status operator()(const Abort& m) {
    auto b = root.initAbort();
    b.setRequestId(m.request_id);
    b.setReason(AsText(m.reason));
    return Status::Ok();
  }
  Status operator()(const Ping& m) {
    root.setPing(m.nonce);
    return Status::Ok();
  }
  Status operator()(const Accepted& m) {
    auto b = root.initAccepted();
    b.setRequestId(m.request_id);
    b.setTag(AsText(m.tag));
    b.setPromptTokens(m.prompt_tokens);
    b.setMaxTokens(m.max_tokens);
    return Status::Ok();
  }
  Status operator()(const Output& m) {
    if (!m.logprobs.empty() && m.logprobs.size() != m.tokens.size())
      return Status::InvalidArgument("output.logprobs is not parallel to tokenIds");
    PDSERVE_RETURN_IF_ERROR(CheckSize(m.tool_calls.size(), Limits::kMaxListItems, "output.toolCalls"));
    if (m.tool_calls_finish && m.finish != FinishReason::kStop)
      return Status::InvalidArgument("output: a tool-calls finish is a stop");
    auto b = root.initOutput();
    b.setRequestId(m.request_id);
    b.setIndex(m.index);
    SetInts<int32_t>(b.initTokenIds(static_cast<unsigned>(m.tokens.size())), m.tokens);
    b.setText(AsText(m.text));
    b.setReasoningText(AsText(m.reasoning_text));
    auto calls = b.initToolCalls(static_cast<unsigned>(m.tool_calls.size()));
    for (size_t i = 0; i < m.tool_calls.size(); ++i) {
      calls[i].setIndex(m.tool_calls[i].index);
      calls[i].setId(AsText(m.tool_calls[i].id));
      calls[i].setName(AsText(m.tool_calls[i].name));
      calls[i].setArguments(AsText(m.tool_calls[i].arguments));
    }
    b.setReasoningTokens(m.reasoning_tokens);
    SetLogprobs(b.initLogprobs(static_cast<unsigned>(m.logprobs.size())), m.logprobs);
    switch (m.finish) {
      case FinishReason::kNone: b.setFinishReason(rp::FinishReason::NONE); break;
      case FinishReason::kStop:
        b.setFinishReason(m.tool_calls_finish ? rp::FinishReason::TOOL_CALLS : rp::FinishReason::STOP);
        break;
      case FinishReason::kLength: b.setFinishReason(rp::FinishReason::LENGTH); break;
      case FinishReason::kAbort: b.setFinishReason(rp::FinishReason::ABORT); break;
      case FinishReason::kError:
        return Status::InvalidArgument("an Output cannot finish with 'error': a failed request ends with an Error message");
    }
    b.setPromptTokens(m.prompt_tokens);
    b.setCompletionTokens(m.completion_tokens);
    return Status::Ok();
  }
  Status operator()(const Error& m) {
    auto b = root.initError();
    b.setRequestId(m.request_id);
    b.setHttpStatus(m.http_status);
    b.setType(AsText(m.type));
    b.setCode(AsText(m.code));
    b.setParam(AsText(m.param));
    b.setMessage(AsText(m.message));
    return Status::Ok();
  }
  Status operator()(const Pong& m) {
    root.setPong(m.nonce);
    return Status::Ok();
  }
  Status operator()(const Keepalive&) {
    root.setKeepalive();
    return Status::Ok();
  }
};

Result<std::string> ReadText(capnp::Text::Reader t, const char* field, size_t limit = 64 * 1024) {
  PDSERVE_RETURN_IF_ERROR(CheckSize(t.size(), limit, field));
  return std::string(t.cStr(), t.size());
}

std::vector<int32_t> ReadInts(capnp::List<int32_t>::Reader list) {
  std::vector<int32_t> out;
  out.reserve(list.size());
  for (int32_t v : list) out.push_back(v);
  return out;
}

Result<Message> DecodeSubmit(rp::Submit::Reader r) {
  Submit m;
  m.request_id = r.getRequestId();
  PDSERVE_ASSIGN_OR_RETURN(m.model, ReadText(r.getModel(), "submit.model"));
  auto p = r.getPrompt();
  switch (p.which()) {
    case rp::Submit::Prompt::TOKEN_IDS: {
      m.kind = PromptKind::kTokenIds;
      PDSERVE_RETURN_IF_ERROR(CheckSize(p.getTokenIds().size(), Limits::kMaxPromptTokens, "submit.prompt.tokenIds"));
      m.prompt_ids = ReadInts(p.getTokenIds());
      break;
    }
    case rp::Submit::Prompt::TEXT: {
      m.kind = PromptKind::kText;
      PDSERVE_ASSIGN_OR_RETURN(m.prompt_text, ReadText(p.getText(), "submit.prompt.text", Limits::kMaxTextBytes));
      break;
    }
    case rp::Submit::Prompt::MESSAGES: {
      m.kind = PromptKind::kChat;
      auto list = p.getMessages();
      PDSERVE_RETURN_IF_ERROR(CheckSize(list.size(), Limits::kMaxMessages, "submit.prompt.messages"));
      for (auto cm : list) {
        ChatMessage out;
        PDSERVE_ASSIGN_OR_RETURN(out.role, ReadText(cm.getRole(), "submit.prompt.messages[].role"));
        if (cm.getHasContent()) {
          PDSERVE_ASSIGN_OR_RETURN(std::string c,
                                   ReadText(cm.getContent(), "submit.prompt.messages[].content", Limits::kMaxTextBytes));
          out.content = std::move(c);
        }
        PDSERVE_RETURN_IF_ERROR(CheckSize(cm.getToolCalls().size(), Limits::kMaxListItems, "submit.prompt.messages[].toolCalls"));
        for (auto tc : cm.getToolCalls()) {
          ToolCall call;
          PDSERVE_ASSIGN_OR_RETURN(call.name, ReadText(tc.getName(), "toolCalls[].name"));
          PDSERVE_ASSIGN_OR_RETURN(call.arguments, ReadText(tc.getArguments(), "toolCalls[].arguments", Limits::kMaxTextBytes));
          out.tool_calls.push_back(std::move(call));
        }
        m.messages.push_back(std::move(out));
      }
      break;
    }
    default: return Status::InvalidArgument("submit.prompt is of an unknown kind");
  }
  switch (r.getThinking()) {
    case rp::Thinking::UNSET: break;
    case rp::Thinking::OFF: m.thinking = false; break;
    case rp::Thinking::ON: m.thinking = true; break;
    default: return Status::InvalidArgument("submit.thinking is unknown");
  }
  auto s = r.getSampling();
  Sampling& sp = m.sampling;
  if (s.getHasMaxTokens()) sp.max_tokens = s.getMaxTokens();
  if (s.getHasTemperature()) sp.temperature = s.getTemperature();
  if (s.getHasTopP()) sp.top_p = s.getTopP();
  if (s.getHasTopK()) sp.top_k = s.getTopK();
  if (s.getHasMinP()) sp.min_p = s.getMinP();
  if (s.getHasPresencePenalty()) sp.presence_penalty = s.getPresencePenalty();
  if (s.getHasFrequencyPenalty()) sp.frequency_penalty = s.getFrequencyPenalty();
  if (s.getHasRepetitionPenalty()) sp.repetition_penalty = s.getRepetitionPenalty();
  if (s.getHasSeed()) sp.seed = s.getSeed();
  PDSERVE_RETURN_IF_ERROR(CheckSize(r.getStop().size(), Limits::kMaxListItems, "submit.stop"));
  for (auto t : r.getStop()) {
    PDSERVE_ASSIGN_OR_RETURN(std::string str, ReadText(t, "submit.stop[]"));
    m.stop.push_back(std::move(str));
  }
  PDSERVE_RETURN_IF_ERROR(CheckSize(r.getStopTokenIds().size(), Limits::kMaxListItems, "submit.stopTokenIds"));
  m.stop_token_ids = ReadInts(r.getStopTokenIds());
  m.ignore_eos = r.getIgnoreEos();
  m.skip_special_tokens = r.getSkipSpecialTokens();
  m.logprobs = r.getLogprobs();
  m.top_logprobs = r.getTopLogprobs();
  PDSERVE_ASSIGN_OR_RETURN(m.user, ReadText(r.getUser(), "submit.user"));
  PDSERVE_ASSIGN_OR_RETURN(m.api_key, ReadText(r.getApiKey(), "submit.apiKey"));
  m.n = r.getN() == 0 ? 1 : r.getN();
  if (m.n > Limits::kMaxChoices) return Status::InvalidArgument("submit.n exceeds its limit");
  PDSERVE_RETURN_IF_ERROR(CheckSize(r.getLogitBias().size(), Limits::kMaxListItems, "submit.logitBias"));
  for (auto lb : r.getLogitBias()) m.logit_bias.push_back({lb.getToken(), lb.getBias()});
  PDSERVE_RETURN_IF_ERROR(CheckSize(r.getTools().size(), Limits::kMaxListItems, "submit.tools"));
  for (auto t : r.getTools()) {
    Tool tool;
    PDSERVE_ASSIGN_OR_RETURN(tool.name, ReadText(t.getName(), "submit.tools[].name"));
    PDSERVE_ASSIGN_OR_RETURN(tool.description, ReadText(t.getDescription(), "submit.tools[].description", Limits::kMaxTextBytes));
    PDSERVE_ASSIGN_OR_RETURN(tool.parameters, ReadText(t.getParameters(), "submit.tools[].parameters", Limits::kMaxTextBytes));
    m.tools.push_back(std::move(tool));
  }
  auto choice = r.getToolChoice();
  switch (choice.getMode()) {
    case rp::ToolChoiceMode::AUTO: m.tool_choice.mode = ToolChoiceMode::kAuto; break;
    case rp::ToolChoiceMode::NONE: m.tool_choice.mode = ToolChoiceMode::kNone; break;
    case rp::ToolChoiceMode::REQUIRED: m.tool_choice.mode = ToolChoiceMode::kRequired; break;
    case rp::ToolChoiceMode::FUNCTION: m.tool_choice.mode = ToolChoiceMode::kFunction; break;
    default: return Status::InvalidArgument("submit.toolChoice.mode is unknown");
  }
  PDSERVE_ASSIGN_OR_RETURN(m.tool_choice.function, ReadText(choice.getFunction(), "submit.toolChoice.function"));
  auto rf = r.getResponseFormat();
  switch (rf.getType()) {
    case rp::ResponseFormatType::TEXT: m.response_format.type = ResponseFormatType::kText; break;
    case rp::ResponseFormatType::JSON_OBJECT: m.response_format.type = ResponseFormatType::kJsonObject; break;
    case rp::ResponseFormatType::JSON_SCHEMA: m.response_format.type = ResponseFormatType::kJsonSchema; break;
    case rp::ResponseFormatType::REGEX: m.response_format.type = ResponseFormatType::kRegex; break;
    case rp::ResponseFormatType::GRAMMAR: m.response_format.type = ResponseFormatType::kGrammar; break;
    default: return Status::InvalidArgument("submit.responseFormat.type is unknown");
  }
  PDSERVE_ASSIGN_OR_RETURN(m.response_format.text,
                           ReadText(rf.getText(), "submit.responseFormat.text", Limits::kMaxTextBytes));
  m.response_format.strict = rf.getStrict();
  return Message(std::move(m));
}

Result<Message> DecodeOutput(rp::Output::Reader r) {
  Output m;
  m.request_id = r.getRequestId();
  m.index = r.getIndex();
  PDSERVE_RETURN_IF_ERROR(CheckSize(r.getTokenIds().size(), Limits::kMaxPromptTokens, "output.tokenIds"));
  m.tokens = ReadInts(r.getTokenIds());
  PDSERVE_ASSIGN_OR_RETURN(m.text, ReadText(r.getText(), "output.text", Limits::kMaxTextBytes));
  PDSERVE_ASSIGN_OR_RETURN(m.reasoning_text, ReadText(r.getReasoningText(), "output.reasoningText", Limits::kMaxTextBytes));
  PDSERVE_RETURN_IF_ERROR(CheckSize(r.getToolCalls().size(), Limits::kMaxListItems, "output.toolCalls"));
  for (auto tc : r.getToolCalls()) {
    ToolCallDelta d;
    d.index = tc.getIndex();
    PDSERVE_ASSIGN_OR_RETURN(d.id, ReadText(tc.getId(), "output.toolCalls[].id"));
    PDSERVE_ASSIGN_OR_RETURN(d.name, ReadText(tc.getName(), "output.toolCalls[].name"));
    PDSERVE_ASSIGN_OR_RETURN(d.arguments, ReadText(tc.getArguments(), "output.toolCalls[].arguments", Limits::kMaxTextBytes));
    m.tool_calls.push_back(std::move(d));
  }
  m.reasoning_tokens = r.getReasoningTokens();
  auto lps = r.getLogprobs();
  if (lps.size() != 0 && lps.size() != m.tokens.size())
    return Status::InvalidArgument("output.logprobs is not parallel to tokenIds");
  for (auto lp : lps) {
    TokenLogprob v;
    v.logprob = lp.getLogprob();
    PDSERVE_RETURN_IF_ERROR(CheckSize(lp.getTop().size(), Limits::kMaxListItems, "output.logprobs[].top"));
    for (auto t : lp.getTop()) v.top.push_back({t.getToken(), t.getLogprob()});
    m.logprobs.push_back(std::move(v));
  }
  switch (r.getFinishReason()) {
    case rp::FinishReason::NONE: m.finish = FinishReason::kNone; break;
    case rp::FinishReason::STOP: m.finish = FinishReason::kStop; break;
    case rp::FinishReason::LENGTH: m.finish = FinishReason::kLength; break;
    case rp::FinishReason::ABORT: m.finish = FinishReason::kAbort; break;
    case rp::FinishReason::TOOL_CALLS:
      m.finish = FinishReason::kStop;
      m.tool_calls_finish = true;
      break;
    default: return Status::InvalidArgument("output.finishReason is unknown");
  }
  m.prompt_tokens = r.getPromptTokens();
  m.completion_tokens = r.getCompletionTokens();
  return Message(std::move(m));
}

Result<Message> DecodeRoot(rp::RequestApiMessage::Reader root) {
  if (root.getProtocolVersion() != kRequestApiProtocolVersion)
    return Status::InvalidArgument("request API protocol version " + std::to_string(root.getProtocolVersion()) +
                                   " is not supported (this router speaks " +
                                   std::to_string(kRequestApiProtocolVersion) + ")");
  switch (root.which()) {
    case rp::RequestApiMessage::SUBMIT: return DecodeSubmit(root.getSubmit());
    case rp::RequestApiMessage::ABORT: {
      Abort m;
      m.request_id = root.getAbort().getRequestId();
      PDSERVE_ASSIGN_OR_RETURN(m.reason, ReadText(root.getAbort().getReason(), "abort.reason"));
      return Message(std::move(m));
    }
    case rp::RequestApiMessage::PING: return Message(Ping{root.getPing()});
    case rp::RequestApiMessage::ACCEPTED: {
      auto r = root.getAccepted();
      Accepted m;
      m.request_id = r.getRequestId();
      PDSERVE_ASSIGN_OR_RETURN(m.tag, ReadText(r.getTag(), "accepted.tag"));
      m.prompt_tokens = r.getPromptTokens();
      m.max_tokens = r.getMaxTokens();
      return Message(std::move(m));
    }
    case rp::RequestApiMessage::OUTPUT: return DecodeOutput(root.getOutput());
    case rp::RequestApiMessage::ERROR: {
      auto r = root.getError();
      Error m;
      m.request_id = r.getRequestId();
      m.http_status = r.getHttpStatus();
      PDSERVE_ASSIGN_OR_RETURN(m.type, ReadText(r.getType(), "error.type"));
      PDSERVE_ASSIGN_OR_RETURN(m.code, ReadText(r.getCode(), "error.code"));
      PDSERVE_ASSIGN_OR_RETURN(m.param, ReadText(r.getParam(), "error.param"));
      PDSERVE_ASSIGN_OR_RETURN(m.message, ReadText(r.getMessage(), "error.message"));
      return Message(std::move(m));
    }
    case rp::RequestApiMessage::PONG: return Message(Pong{root.getPong()});
    case rp::RequestApiMessage::KEEPALIVE: return Message(Keepalive{});
  }
  return Status::Unimplemented("request API message of an unknown kind (a newer peer?)");
}

}  // namespace

Result<std::string> EncodeMessage(const Message& message) {
  try {
    capnp::MallocMessageBuilder builder;
    auto root = builder.initRoot<rp::RequestApiMessage>();
    root.setProtocolVersion(kRequestApiProtocolVersion);
    PDSERVE_RETURN_IF_ERROR(std::visit(Encoder{root}, message));
    kj::Array<capnp::word> words = capnp::messageToFlatArray(builder);
    auto bytes = words.asBytes();
    if (bytes.size() > Limits::kMaxMessageBytes)
      return Status::InvalidArgument("request API message larger than the limit");
    return std::string(reinterpret_cast<const char*>(bytes.begin()), bytes.size());
  } catch (const kj::Exception& e) {
    return Status::Internal(std::string("encoding a request API message failed: ") + e.getDescription().cStr());
  }
}

Result<Message> DecodeMessage(std::string_view bytes) {
  if (bytes.empty()) return Status::InvalidArgument("empty message");
  if (bytes.size() % sizeof(capnp::word) != 0)
    return Status::InvalidArgument("message size " + std::to_string(bytes.size()) +
                                   " is not a multiple of 8 bytes (not a Cap'n Proto message)");
  if (bytes.size() > Limits::kMaxMessageBytes) return Status::InvalidArgument("message larger than the limit");
  // ZeroMQ frames carry no alignment guarantee; Cap'n Proto readers need word alignment.
  kj::Array<capnp::word> words = kj::heapArray<capnp::word>(bytes.size() / sizeof(capnp::word));
  std::memcpy(words.begin(), bytes.data(), bytes.size());
  try {
    capnp::ReaderOptions options;
    options.traversalLimitInWords = Limits::kMaxMessageBytes / sizeof(capnp::word);
    options.nestingLimit = 16;
    capnp::FlatArrayMessageReader reader(words.asPtr(), options);
    return DecodeRoot(reader.getRoot<rp::RequestApiMessage>());
  } catch (const kj::Exception& e) {
    return Status::InvalidArgument(std::string("malformed message: ") + e.getDescription().cStr());
  }
}

}  // namespace pdserve::services::api
