#include "services/router/request_prep.h"

#include <atomic>

#include <fmt/format.h>

#include "services/common/process_util.h"
#include "tokenizer/deepseek_markers.h"
#include "tokenizer/tool_call_grammar.h"

namespace pdserve::router {

std::string NewRequestTag(bool chat) {
  static std::atomic<uint32_t> counter{0};
  return fmt::format("{}-{:016x}{:08x}", chat ? "chatcmpl" : "cmpl", services::RandomU64(), ++counter);
}

namespace {

tokenizer::ChatFormat ChooseFormat(const std::string& configured, const tokenizer::ChatTemplateOptions& o) {
  if (configured == "deepseek_v31") return tokenizer::ChatFormat::kDeepSeekV31;
  if (configured == "deepseek_v3") return tokenizer::ChatFormat::kDeepSeekV3;
  return o.tools.empty() ? tokenizer::ChatFormat::kDeepSeekV3 : tokenizer::ChatFormat::kDeepSeekV31;
}

bool ConstrainsToolCalls(const tokenizer::ChatTemplateOptions& o) {
  return !o.tools.empty() && (o.tool_choice.mode == tokenizer::ToolChoiceMode::kRequired ||
                              o.tool_choice.mode == tokenizer::ToolChoiceMode::kFunction);
}

}  // namespace

std::optional<ApiError> BuildPrompt(const RouterConfig& config, const tokenizer::Tokenizer& tokenizer,
                                    const tokenizer::ChatTemplate& chat_template, ParsedRequest& pr,
                                    bool add_bos_to_text, std::vector<int32_t>* prompt, bool* opens_reasoning) {
  *opens_reasoning = false;
  if (pr.endpoint == ApiEndpoint::kChat) {
    tokenizer::ChatTemplateOptions& o = pr.chat_options;
    o.format = ChooseFormat(config.chat_format, o);
    if (o.format == tokenizer::ChatFormat::kDeepSeekV3 && !o.tools.empty())
      return ApiError::BadRequest("'tools' need the DeepSeek-V3.1 chat format; this router's chat_format is "
                                  "deepseek_v3",
                                  "tools");
    auto text = chat_template.Render(pr.messages, o);
    if (!text.ok()) return ApiError::BadRequest(text.status().message(), "messages");
    *opens_reasoning = tokenizer::ChatTemplate::OpensReasoning(text.value());
    auto ids = tokenizer.Encode(text.value(), {/*add_bos=*/false, /*parse_special_tokens=*/true});
    if (!ids.ok()) return ApiError::BadRequest(ids.status().message(), "messages");
    *prompt = std::move(ids).value();
  } else if (pr.prompt_text) {
    // Plain-text prompts get BOS, as the model was trained (the chat template adds its own).
    auto ids = tokenizer.Encode(*pr.prompt_text, {add_bos_to_text && tokenizer.bos_id().has_value(), true});
    if (!ids.ok()) return ApiError::BadRequest(ids.status().message(), "prompt");
    *prompt = std::move(ids).value();
  } else {
    for (int32_t id : pr.prompt_ids)
      if (!tokenizer.IsValidId(id))
        return ApiError::BadRequest(fmt::format("token id {} is not in the vocabulary", id), "prompt");
    *prompt = std::move(pr.prompt_ids);
  }
  return std::nullopt;
}

std::optional<ApiError> PrepareRequest(const RouterConfig& config, const tokenizer::Tokenizer& tokenizer,
                                       const tokenizer::ChatTemplate& chat_template, ParsedRequest& pr,
                                       const std::string& tag, std::chrono::steady_clock::time_point arrival,
                                       PreparedRequest* out) {
  const bool chat = pr.endpoint == ApiEndpoint::kChat;
  // An empty model (the request API's default) means the one model this router serves; the
  // HTTP API requires the field, as OpenAI's does.
  if (pr.model.empty()) pr.model = config.model_name;
  if (pr.model != config.model_name)
    return ApiError::NotFound(
        fmt::format("The model '{}' does not exist (this server serves '{}')", pr.model, config.model_name),
        "model_not_found");
  std::vector<int32_t> prompt;
  const char* prompt_param = chat ? "messages" : "prompt";
  bool opens_reasoning = false;
  if (auto e = BuildPrompt(config, tokenizer, chat_template, pr, true, &prompt, &opens_reasoning)) return e;
  for (const LogitBias& b : pr.sampling.logit_bias)
    if (!tokenizer.IsValidId(b.token))
      return ApiError::BadRequest(fmt::format("logit_bias: token id {} is not in the vocabulary", b.token),
                                  "logit_bias");

  // The output constraint: response_format's, or the tool-call grammar; in a prompt that opens
  // the model's reasoning, the reasoning stays free and the constraint applies after it.
  grammar::Constraint constraint = pr.constraint;
  std::string constraint_param = pr.constraint_param;
  if (chat && ConstrainsToolCalls(pr.chat_options)) {
    auto text = tokenizer::ToolCallGrammar(pr.chat_options.tools, pr.chat_options.tool_choice);
    if (!text.ok()) return ApiError::BadRequest(text.status().message(), "tool_choice");
    constraint.kind = grammar::ConstraintKind::kEbnf;
    constraint.text = std::move(text).value();
    constraint_param = "tool_choice";
  }
  if (constraint.active() && opens_reasoning) constraint.free_text_until = std::string(tokenizer::markers::kThinkClose);
  // The parser validated response_format's constraint alone; the tool grammar and the
  // reasoning prefix are checked here.
  if (constraint.active() && (constraint_param == "tool_choice" || !constraint.free_text_until.empty())) {
    if (auto g = grammar::BuildGrammar(constraint); !g.ok())
      return ApiError::BadRequest(g.status().message(), constraint_param);
  }

  if (prompt.empty()) return ApiError::BadRequest("the prompt is empty", prompt_param);
  if (config.max_prompt_tokens != 0 && prompt.size() > config.max_prompt_tokens)
    return ApiError::BadRequest(fmt::format("the prompt has {} tokens, more than this server's limit of {} "
                                            "(router.max_prompt_tokens)",
                                            prompt.size(), config.max_prompt_tokens),
                                prompt_param, "context_length_exceeded");

  SubmitSpec& spec = out->spec;
  spec.tag = tag;
  out->prompt_tokens = static_cast<uint32_t>(prompt.size());
  spec.prompt = std::move(prompt);
  spec.sampling = pr.sampling;
  spec.sampling.stop = pr.stop;
  spec.sampling.stop_token_ids = pr.stop_token_ids;
  if (!pr.ignore_eos && tokenizer.eos_id()) spec.sampling.stop_token_ids.push_back(*tokenizer.eos_id());
  if (pr.logprobs) spec.sampling.logprobs = static_cast<int32_t>(pr.top_logprobs);
  spec.max_tokens = pr.max_tokens;
  spec.arrival = arrival;
  spec.deadline_unix_ms = services::UnixMillis() + config.request_timeout.count();
  spec.constraint = std::move(constraint);
  out->n = pr.n;
  out->session.stop_strings = pr.stop;
  out->session.stop_token_ids = spec.sampling.stop_token_ids;
  // A constrained output ends with the grammar's stop token (EOS) even under ignore_eos; it
  // is never text.
  if (spec.constraint.active() && tokenizer.eos_id()) out->session.stop_token_ids.push_back(*tokenizer.eos_id());
  out->session.skip_special_tokens = pr.skip_special_tokens;
  if (chat) {
    tokenizer::ChatOutputParserOptions parser;
    parser.starts_in_reasoning = opens_reasoning;
    parser.parse_tool_calls = !pr.chat_options.tools.empty() &&
                              pr.chat_options.tool_choice.mode != tokenizer::ToolChoiceMode::kNone;
    out->session.chat = parser;
  }
  return std::nullopt;
}

Result<std::vector<std::shared_ptr<ActiveRequest>>> SubmitChoices(RouterCore& core, const PreparedRequest& prepared) {
  std::vector<std::shared_ptr<ActiveRequest>> choices;
  for (uint32_t i = 0; i < prepared.n; ++i) {
    SubmitSpec spec = prepared.spec;
    if (spec.sampling.seed) spec.sampling.seed = *spec.sampling.seed + i;
    if (i > 0) spec.affinity = choices[0]->id();
    auto submitted = core.Submit(std::move(spec));
    if (!submitted.ok()) {
      for (const auto& c : choices) core.Cancel(c->id(), "another choice of the request was refused");
      return submitted.status();
    }
    choices.push_back(std::move(submitted).value());
  }
  return choices;
}

ApiError SubmitError(const Status& st, const std::string& tag, bool chat) {
  ApiError e = ApiError::FromStatus(st, tag);
  if (st.code() == StatusCode::kInvalidArgument) {
    e.param = chat ? "messages" : "prompt";
    e.code = "context_length_exceeded";
  } else if (st.code() == StatusCode::kUnavailable) {
    e.code = "no_workers";
  }
  return e;
}

}  // namespace pdserve::router
