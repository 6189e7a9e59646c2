#include "services/router/openai_request.h"

#include <cmath>
#include <limits>

#include <nlohmann/json.hpp>

#include "grammar/json_schema.h"
#include "tokenizer/chat_request.h"
#include "tokenizer/tools.h"

namespace pdserve::router {

namespace {
// Ordered: a JSON Schema's property order is the order the constrained output writes them in.
using json = nlohmann::ordered_json;

// Looks up `key`; absent and JSON null are both "not given".
const json* Field(const json& body, const char* key) {
  auto it = body.find(key);
  if (it == body.end() || it->is_null()) return nullptr;
  return &*it;
}

std::optional<ApiError> GetNumber(const json& body, const char* key, double lo, double hi, bool lo_open,
                                  float* out) {
  const json* v = Field(body, key);
  if (!v) return std::nullopt;
  if (!v->is_number()) return ApiError::BadRequest(std::string("'") + key + "' must be a number", key);
  const double x = v->get<double>();
  if (!std::isfinite(x) || x > hi || (lo_open ? x <= lo : x < lo)) {
    return ApiError::BadRequest(std::string("'") + key + "' must be in " + (lo_open ? "(" : "[") +
                                    json(lo).dump() + ", " + json(hi).dump() + "], got " + v->dump(),
                                key);
  }
  *out = static_cast<float>(x);
  return std::nullopt;
}

std::optional<ApiError> GetInt(const json& body, const char* key, int64_t lo, int64_t hi, std::optional<int64_t>* out) {
  const json* v = Field(body, key);
  if (!v) return std::nullopt;
  // 5.0 is accepted as 5 by OpenAI's validators; 5.5 and "5" are not integers.
  int64_t x;
  if (v->is_number_integer()) {
    x = v->get<int64_t>();
  } else if (v->is_number_float() && std::floor(v->get<double>()) == v->get<double>() &&
             std::fabs(v->get<double>()) < 9e15) {
    x = static_cast<int64_t>(v->get<double>());
  } else {
    return ApiError::BadRequest(std::string("'") + key + "' must be an integer", key);
  }
  if (v->is_number_unsigned() && v->get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
    return ApiError::BadRequest(std::string("'") + key + "' is out of range", key);
  if (x < lo || x > hi)
    return ApiError::BadRequest(std::string("'") + key + "' must be in [" + std::to_string(lo) + ", " +
                                    std::to_string(hi) + "], got " + std::to_string(x),
                                key);
  *out = x;
  return std::nullopt;
}

std::optional<ApiError> GetBool(const json& body, const char* key, bool* out) {
  const json* v = Field(body, key);
  if (!v) return std::nullopt;
  if (!v->is_boolean()) return ApiError::BadRequest(std::string("'") + key + "' must be a boolean", key);
  *out = v->get<bool>();
  return std::nullopt;
}

std::optional<ApiError> ParseTokenIds(const json& arr, const char* param, std::vector<int32_t>* out) {
  out->clear();
  for (const auto& t : arr) {
    if (!t.is_number_integer() || t.get<int64_t>() < 0 || t.get<int64_t>() > std::numeric_limits<int32_t>::max())
      return ApiError::BadRequest(std::string("'") + param + "' token ids must be non-negative integers", param);
    out->push_back(static_cast<int32_t>(t.get<int64_t>()));
  }
  return std::nullopt;
}

std::optional<ApiError> ParsePrompt(const json& body, ParsedRequest* out) {
  const json* p = Field(body, "prompt");
  if (!p) return ApiError::BadRequest("'prompt' is required", "prompt");
  if (p->is_string()) {
    out->prompt_text = p->get<std::string>();
    return std::nullopt;
  }
  if (!p->is_array()) return ApiError::BadRequest("'prompt' must be a string, a list of token ids, or a list of one of those", "prompt");
  if (p->empty()) return ApiError::BadRequest("'prompt' is empty", "prompt");
  if ((*p)[0].is_number()) return ParseTokenIds(*p, "prompt", &out->prompt_ids);
  if (p->size() != 1)
    return ApiError::BadRequest("only one prompt per request is supported (got a batch of " + std::to_string(p->size()) + ")",
                                "prompt");
  const json& one = (*p)[0];
  if (one.is_string()) {
    out->prompt_text = one.get<std::string>();
    return std::nullopt;
  }
  if (one.is_array()) {
    if (one.empty()) return ApiError::BadRequest("'prompt' is empty", "prompt");
    return ParseTokenIds(one, "prompt", &out->prompt_ids);
  }
  return ApiError::BadRequest("'prompt' must be a string, a list of token ids, or a list of one of those", "prompt");
}

std::optional<ApiError> ParseStop(const json& body, ParsedRequest* out) {
  const json* s = Field(body, "stop");
  if (s) {
    std::vector<std::string> stops;
    if (s->is_string()) {
      stops.push_back(s->get<std::string>());
    } else if (s->is_array()) {
      for (const auto& x : *s) {
        if (!x.is_string()) return ApiError::BadRequest("'stop' must be a string or a list of strings", "stop");
        stops.push_back(x.get<std::string>());
      }
    } else {
      return ApiError::BadRequest("'stop' must be a string or a list of strings", "stop");
    }
    if (stops.size() > kMaxStopSequences)
      return ApiError::BadRequest("at most " + std::to_string(kMaxStopSequences) + " stop sequences are supported", "stop");
    for (const auto& x : stops) {
      if (x.empty()) return ApiError::BadRequest("stop sequences must not be empty", "stop");
      if (x.size() > kMaxStopSequenceBytes) return ApiError::BadRequest("stop sequence too long", "stop");
    }
    out->stop = std::move(stops);
  }
  if (const json* ids = Field(body, "stop_token_ids")) {
    if (!ids->is_array()) return ApiError::BadRequest("'stop_token_ids' must be a list of token ids", "stop_token_ids");
    if (ids->size() > 1024) return ApiError::BadRequest("too many stop_token_ids", "stop_token_ids");
    if (auto e = ParseTokenIds(*ids, "stop_token_ids", &out->stop_token_ids)) return e;
  }
  return std::nullopt;
}

std::optional<ApiError> ParseChoicesAndUnsupported(const json& body, ApiEndpoint endpoint, ParsedRequest* out) {
  std::optional<int64_t> n;
  if (auto e = GetInt(body, "n", 1, kMaxChoices, &n)) return e;
  if (n) out->n = static_cast<uint32_t>(*n);
  std::optional<int64_t> best_of;
  if (auto e = GetInt(body, "best_of", std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max(), &best_of)) return e;
  // best_of > n would generate choices nobody sees; equal to n it asks for nothing more.
  if (best_of && *best_of != 1 && *best_of != out->n)
    return ApiError::BadRequest("only best_of=1 (or equal to n) is supported", "best_of");
  if (endpoint == ApiEndpoint::kCompletions) {
    bool echo = false;
    if (auto e = GetBool(body, "echo", &echo)) return e;
    if (echo) return ApiError::BadRequest("'echo' is not supported", "echo");
    if (Field(body, "suffix")) return ApiError::BadRequest("'suffix' is not supported", "suffix");
  }
  return std::nullopt;
}

// OpenAI's logit_bias: {"<token id>": bias}. Ids are checked against the vocabulary by
// request_prep.h.
std::optional<ApiError> ParseLogitBias(const json& body, ParsedRequest* out) {
  const json* lb = Field(body, "logit_bias");
  if (!lb) return std::nullopt;
  if (!lb->is_object())
    return ApiError::BadRequest("'logit_bias' must be an object mapping token ids (as strings) to biases", "logit_bias");
  if (lb->size() > SamplingParams::kMaxLogitBias)
    return ApiError::BadRequest("'logit_bias' has more than " + std::to_string(SamplingParams::kMaxLogitBias) +
                                    " entries",
                                "logit_bias");
  for (const auto& [key, value] : lb->items()) {
    int64_t id = -1;
    const bool digits = !key.empty() && key.size() <= 10 &&
                        key.find_first_not_of("0123456789") == std::string::npos;
    if (digits) id = std::stoll(key);
    if (!digits || id > std::numeric_limits<int32_t>::max())
      return ApiError::BadRequest("'logit_bias' key '" + key + "' is not a token id", "logit_bias");
    if (!value.is_number() || !std::isfinite(value.get<double>()) || value.get<double>() < -100 ||
        value.get<double>() > 100)
      return ApiError::BadRequest("'logit_bias' value for token " + key + " must be a number in [-100, 100]",
                                  "logit_bias");
    out->sampling.logit_bias.push_back({static_cast<int32_t>(id), static_cast<float>(value.get<double>())});
  }
  return std::nullopt;
}

// Escapes `s` as a literal of an ECMAScript regex.
std::string RegexLiteral(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (std::string_view("\\^$.|?*+()[]{}/").find(c) != std::string_view::npos) out.push_back('\\');
    out.push_back(c);
  }
  return out;
}

// The schema text of `v` (an object or boolean schema, or a string holding one), keeping the
// property order. nullopt when `v` is neither.
std::optional<std::string> SchemaText(const json& v) {
  if (v.is_object() || v.is_boolean()) return v.dump();
  if (v.is_string()) return v.get<std::string>();
  return std::nullopt;
}

// Sets the constraint from one source and checks it: a schema with ValidateJsonSchema (the
// message names `where`, the keyword and its pointer), a regex or grammar by building it.
std::optional<ApiError> SetConstraint(grammar::ConstraintKind kind, std::string text, const std::string& where,
                                      const std::string& param, ParsedRequest* out) {
  if (out->constraint.active())
    return ApiError::BadRequest("'" + param + "' cannot be combined with '" + out->constraint_param +
                                    "': a request has one output constraint",
                                param);
  grammar::Constraint& c = out->constraint;
  c.kind = kind;
  c.text = std::move(text);
  out->constraint_param = param;
  Status st = kind == grammar::ConstraintKind::kJsonSchema ? grammar::ValidateJsonSchema(c.text, where, c.json)
                                                           : grammar::BuildGrammar(c).status();
  if (!st.ok()) {
    std::string msg = st.message();
    if (kind != grammar::ConstraintKind::kJsonSchema) msg = where + ": " + msg;
    return ApiError::BadRequest(std::move(msg), param);
  }
  return std::nullopt;
}

std::optional<ApiError> ParseResponseFormat(const json& body, ParsedRequest* out) {
  using grammar::ConstraintKind;
  if (const json* rf = Field(body, "response_format")) {
    const char* p = "response_format";
    if (!rf->is_object() || !rf->contains("type") || !(*rf)["type"].is_string())
      return ApiError::BadRequest("'response_format' must be an object with a string 'type'", p);
    const std::string type = (*rf)["type"].get<std::string>();
    auto text_field = [&](const char* key) -> std::optional<std::string> {
      const json* v = Field(*rf, key);
      if (!v || !v->is_string()) return std::nullopt;
      return v->get<std::string>();
    };
    if (type == "text") {
      // free text: nothing to constrain
    } else if (type == "json_object") {
      if (auto e = SetConstraint(ConstraintKind::kJsonObject, "", "response_format", p, out)) return e;
    } else if (type == "json_schema") {
      const json* js = Field(*rf, "json_schema");
      if (!js || !js->is_object())
        return ApiError::BadRequest("'response_format.json_schema' must be an object with a 'schema'", p);
      if (const json* name = Field(*js, "name")) {
        const bool ok = name->is_string() && !name->get<std::string>().empty() && name->get<std::string>().size() <= 64 &&
                        name->get<std::string>().find_first_not_of(
                            "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-") == std::string::npos;
        if (!ok) return ApiError::BadRequest("'response_format.json_schema.name' must match [A-Za-z0-9_-]{1,64}", p);
      }
      bool strict = true;
      if (auto e = GetBool(*js, "strict", &strict))
        return ApiError::BadRequest("'response_format.json_schema.strict' must be a boolean", p);
      const json* schema = Field(*js, "schema");
      std::optional<std::string> text = schema ? SchemaText(*schema) : std::nullopt;
      if (!text) return ApiError::BadRequest("'response_format.json_schema.schema' must be a JSON Schema object", p);
      out->constraint.json.strict = strict;
      if (auto e = SetConstraint(ConstraintKind::kJsonSchema, std::move(*text), "response_format.json_schema.schema",
                                 p, out))
        return e;
    } else if (type == "regex") {
      auto re = text_field("regex");
      if (!re) return ApiError::BadRequest("'response_format.regex' must be a string", p);
      if (auto e = SetConstraint(ConstraintKind::kRegex, std::move(*re), "response_format.regex", p, out)) return e;
    } else if (type == "grammar" || type == "ebnf") {
      auto g = text_field(type.c_str());
      if (!g) return ApiError::BadRequest("'response_format." + type + "' must be a string (EBNF)", p);
      if (auto e = SetConstraint(ConstraintKind::kEbnf, std::move(*g), "response_format." + type, p, out)) return e;
    } else {
      return ApiError::BadRequest("'response_format.type' must be one of text, json_object, json_schema, regex, "
                                  "grammar; got '" + type + "'",
                                  p);
    }
  }
  // vLLM's spellings.
  if (const json* gj = Field(body, "guided_json")) {
    std::optional<std::string> text = SchemaText(*gj);
    if (!text) return ApiError::BadRequest("'guided_json' must be a JSON Schema (an object or its text)", "guided_json");
    if (auto e = SetConstraint(ConstraintKind::kJsonSchema, std::move(*text), "guided_json", "guided_json", out))
      return e;
  }
  if (const json* gr = Field(body, "guided_regex")) {
    if (!gr->is_string()) return ApiError::BadRequest("'guided_regex' must be a string", "guided_regex");
    if (auto e = SetConstraint(ConstraintKind::kRegex, gr->get<std::string>(), "guided_regex", "guided_regex", out))
      return e;
  }
  if (const json* gg = Field(body, "guided_grammar")) {
    if (!gg->is_string()) return ApiError::BadRequest("'guided_grammar' must be a string (EBNF)", "guided_grammar");
    if (auto e = SetConstraint(ConstraintKind::kEbnf, gg->get<std::string>(), "guided_grammar", "guided_grammar", out))
      return e;
  }
  if (const json* gc = Field(body, "guided_choice")) {
    if (!gc->is_array() || gc->empty())
      return ApiError::BadRequest("'guided_choice' must be a non-empty list of strings", "guided_choice");
    std::string re;
    for (const auto& c : *gc) {
      if (!c.is_string() || c.get<std::string>().empty())
        return ApiError::BadRequest("'guided_choice' must be a non-empty list of non-empty strings", "guided_choice");
      re += (re.empty() ? "" : "|") + RegexLiteral(c.get<std::string>());
    }
    if (auto e = SetConstraint(ConstraintKind::kRegex, "(?:" + re + ")", "guided_choice", "guided_choice", out))
      return e;
  }
  return std::nullopt;
}

std::optional<ApiError> ParseTools(const json& body, ParsedRequest* out) {
  const json* t = Field(body, "tools");
  const json* tc = Field(body, "tool_choice");
  if (out->endpoint != ApiEndpoint::kChat) {
    if (t) return ApiError::BadRequest("'tools' are only supported by /v1/chat/completions", "tools");
    if (tc) return ApiError::BadRequest("'tool_choice' is only supported by /v1/chat/completions", "tool_choice");
    return std::nullopt;
  }
  auto tools = tokenizer::ParseTools(t ? *t : json(nullptr));
  if (!tools.ok()) return ApiError::BadRequest(tools.status().message(), "tools");
  // Each function's parameters on their own first, so a refusal names the tool.
  for (size_t i = 0; i < tools.value().size(); ++i) {
    const std::string& params = tools.value()[i].parameters;
    if (params.empty()) continue;
    const std::string where = "tools[" + std::to_string(i) + "].function.parameters";
    if (Status st = grammar::ValidateJsonSchema(params, where); !st.ok())
      return ApiError::BadRequest(st.message(), "tools");
  }
  auto choice = tokenizer::ParseToolChoice(tc ? *tc : json(nullptr), tools.value());
  if (!choice.ok()) return ApiError::BadRequest(choice.status().message(), "tool_choice");
  out->chat_options.tools = std::move(tools).value();
  out->chat_options.tool_choice = std::move(choice).value();
  const auto mode = out->chat_options.tool_choice.mode;
  if (out->constraint.active() &&
      (mode == tokenizer::ToolChoiceMode::kRequired || mode == tokenizer::ToolChoiceMode::kFunction))
    return ApiError::BadRequest("'tool_choice' " + std::string(mode == tokenizer::ToolChoiceMode::kRequired
                                                                    ? "\"required\""
                                                                    : "naming a function") +
                                    " cannot be combined with '" + out->constraint_param +
                                    "': both constrain the output",
                                "tool_choice");
  if (const json* ptc = Field(body, "parallel_tool_calls")) {
    if (!ptc->is_boolean())
      return ApiError::BadRequest("'parallel_tool_calls' must be a boolean", "parallel_tool_calls");
    out->chat_options.tool_choice.parallel = ptc->get<bool>();
  }
  return std::nullopt;
}

std::optional<ApiError> ParseLogprobs(const json& body, ParsedRequest* out) {
  const json* lp = Field(body, "logprobs");
  if (out->endpoint == ApiEndpoint::kCompletions) {
    // Legacy completions: logprobs is the number of alternatives (0..20).
    if (!lp) return std::nullopt;
    if (lp->is_boolean()) {
      out->logprobs = lp->get<bool>();
      return std::nullopt;
    }
    std::optional<int64_t> n;
    if (auto e = GetInt(body, "logprobs", 0, kMaxTopLogprobs, &n)) return e;
    out->logprobs = true;
    out->top_logprobs = static_cast<uint32_t>(*n);
    return std::nullopt;
  }
  if (auto e = GetBool(body, "logprobs", &out->logprobs)) return e;
  std::optional<int64_t> top;
  if (auto e = GetInt(body, "top_logprobs", 0, kMaxTopLogprobs, &top)) return e;
  if (top) {
    if (!out->logprobs) return ApiError::BadRequest("'top_logprobs' requires 'logprobs': true", "top_logprobs");
    out->top_logprobs = static_cast<uint32_t>(*top);
  }
  return std::nullopt;
}

std::optional<ApiError> ParseChat(const json& body, ParsedRequest* out) {
  const json* m = Field(body, "messages");
  if (!m) return ApiError::BadRequest("'messages' is required", "messages");
  if (!m->is_array() || m->empty()) return ApiError::BadRequest("'messages' must be a non-empty list", "messages");
  auto messages = tokenizer::ParseChatMessages(*m);
  if (!messages.ok()) return ApiError::BadRequest(messages.status().message(), "messages");
  out->messages = std::move(messages).value();
  out->chat_options.add_generation_prompt = true;
  bool thinking = false;
  bool has_thinking = Field(body, "thinking") != nullptr;
  if (auto e = GetBool(body, "thinking", &thinking)) return e;
  if (const json* kw = Field(body, "chat_template_kwargs")) {
    if (!kw->is_object()) return ApiError::BadRequest("'chat_template_kwargs' must be an object", "chat_template_kwargs");
    // DeepSeek's own key, and the one vLLM / SGLang users send for other models.
    for (const char* key : {"thinking", "enable_thinking"}) {
      if (!Field(*kw, key)) continue;
      if (GetBool(*kw, key, &thinking))
        return ApiError::BadRequest(std::string("'chat_template_kwargs.") + key + "' must be a boolean",
                                    "chat_template_kwargs");
      has_thinking = true;
    }
  }
  if (has_thinking) out->chat_options.thinking = thinking;
  return std::nullopt;
}

}  // namespace

std::optional<ApiError> ParseRequestJson(ApiEndpoint endpoint, const nlohmann::ordered_json& body, ParsedRequest* out) {
  *out = ParsedRequest();
  out->endpoint = endpoint;
  if (!body.is_object()) return ApiError::BadRequest("the request body must be a JSON object");
  const json* model = Field(body, "model");
  if (!model) return ApiError::BadRequest("'model' is required", "model");
  if (!model->is_string()) return ApiError::BadRequest("'model' must be a string", "model");
  out->model = model->get<std::string>();

  if (auto e = ParseChoicesAndUnsupported(body, endpoint, out)) return e;
  if (endpoint == ApiEndpoint::kCompletions) {
    if (auto e = ParsePrompt(body, out)) return e;
  } else {
    if (auto e = ParseChat(body, out)) return e;
  }
  if (auto e = ParseResponseFormat(body, out)) return e;
  if (auto e = ParseTools(body, out)) return e;
  if (auto e = ParseLogitBias(body, out)) return e;

  std::optional<int64_t> max_tokens;
  if (auto e = GetInt(body, "max_tokens", 1, std::numeric_limits<int32_t>::max(), &max_tokens)) return e;
  if (endpoint == ApiEndpoint::kChat) {
    std::optional<int64_t> mct;
    if (auto e = GetInt(body, "max_completion_tokens", 1, std::numeric_limits<int32_t>::max(), &mct)) return e;
    if (mct) max_tokens = mct;
  }
  if (max_tokens) out->max_tokens = static_cast<uint32_t>(*max_tokens);

  SamplingParams& s = out->sampling;
  if (auto e = GetNumber(body, "temperature", 0, 2, false, &s.temperature)) return e;
  if (auto e = GetNumber(body, "top_p", 0, 1, true, &s.top_p)) return e;
  std::optional<int64_t> top_k;
  if (auto e = GetInt(body, "top_k", -1, std::numeric_limits<int32_t>::max(), &top_k)) return e;
  if (top_k) s.top_k = *top_k < 0 ? 0 : static_cast<int32_t>(*top_k);
  if (auto e = GetNumber(body, "min_p", 0, 1, false, &s.min_p)) return e;
  if (auto e = GetNumber(body, "presence_penalty", -2, 2, false, &s.presence_penalty)) return e;
  if (auto e = GetNumber(body, "frequency_penalty", -2, 2, false, &s.frequency_penalty)) return e;
  if (auto e = GetNumber(body, "repetition_penalty", 0, 10, true, &s.repetition_penalty)) return e;
  std::optional<int64_t> seed;
  if (auto e = GetInt(body, "seed", std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max(), &seed)) return e;
  if (seed) s.seed = static_cast<uint64_t>(*seed);

  if (auto e = ParseStop(body, out)) return e;
  if (auto e = GetBool(body, "ignore_eos", &out->ignore_eos)) return e;
  if (auto e = GetBool(body, "return_token_ids", &out->return_token_ids)) return e;
  if (auto e = GetBool(body, "skip_special_tokens", &out->skip_special_tokens)) return e;
  if (auto e = GetBool(body, "stream", &out->stream)) return e;
  if (const json* so = Field(body, "stream_options")) {
    if (!out->stream) return ApiError::BadRequest("'stream_options' is only allowed with 'stream': true", "stream_options");
    if (!so->is_object()) return ApiError::BadRequest("'stream_options' must be an object", "stream_options");
    if (auto e = GetBool(*so, "include_usage", &out->include_usage))
      return ApiError::BadRequest("'stream_options.include_usage' must be a boolean", "stream_options");
  }
  if (auto e = ParseLogprobs(body, out)) return e;
  if (const json* u = Field(body, "user")) {
    if (!u->is_string()) return ApiError::BadRequest("'user' must be a string", "user");
    out->user = u->get<std::string>();
  }
  return std::nullopt;
}

std::optional<ApiError> ParseRequest(ApiEndpoint endpoint, std::string_view body, ParsedRequest* out) {
  json parsed;
  try {
    parsed = json::parse(body);
  } catch (const json::exception& e) {
    return ApiError::BadRequest(std::string("the request body is not valid JSON: ") + e.what());
  }
  try {
    return ParseRequestJson(endpoint, parsed, out);
  } catch (const json::exception& e) {  // defensive: a shape we did not anticipate
    return ApiError::BadRequest(std::string("malformed request: ") + e.what());
  }
}

}  // namespace pdserve::router
