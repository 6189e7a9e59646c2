# The router's ZeroMQ request API (docs/request-api.md; services/router/request_api_server.h,
# the client library services/client/request_client.h).
#
# Transport: the router binds a ZeroMQ ROUTER socket at router.request_endpoint; a client
# connects a DEALER socket. Every ZeroMQ message is exactly one frame holding one
# RequestApiMessage (unpacked Cap'n Proto). One connection may carry many requests at once;
# the client names each with its own requestId. With router.request_curve_secret_key_file the
# socket is a ZeroMQ CURVE server (the client needs the router's public key).
#
# Flows (C = client, R = router):
#   Generate   C -> R submit         (prompt: token ids, text, or chat messages; sampling;
#                                     output constraint, tools, n choices)
#              R -> C accepted       (the request's tag -- the X-Request-Id of the HTTP API --
#                                     prompt tokens, resolved max tokens), then
#              R -> C output*        (one choice's token ids + text delta, and for chat its
#                                     reasoning and tool-call deltas; each choice's last one has
#                                     finishReason != none and its usage: the request ends
#                                     when all n choices have ended)
#           or R -> C error          (at any point; ends the request; OpenAI's error type and
#                                     code, and the HTTP status the HTTP API would have used)
#   Abort      C -> R abort          R aborts the request on every worker and ends it with
#                                     output(finishReason abort). Unknown ids are ignored (the
#                                     request may have just finished).
#   Liveness   C -> R ping           R -> C pong (same nonce)
#              R -> C keepalive      sent to a client whose requests have had no message for
#                                     router.request_keepalive_ms; a client that is gone (its
#                                     connection closed) makes the send fail and the router
#                                     aborts all its requests, as it does for a client that
#                                     disappears mid-stream.
#   Auth       with router.api_keys_file set, a submit without one of its keys in apiKey gets
#              error(httpStatus 401, code invalid_api_key) and is not run, as over HTTP. Abort
#              needs no key: request ids are scoped to the connection that submitted them, so
#              a connection can only abort its own requests.
#   Malformed  anything the router cannot decode, or a message kind a client must not send,
#              gets error(requestId 0 when unknown, httpStatus 400, code malformed_message or
#              unexpected_message); the router keeps serving.
#
# Validation is the HTTP API's (services/router/openai_request.h): the same ranges, the same
# error messages, params and codes. Optional numbers carry a has* flag: unset means "as if the
# JSON key were absent" (the router's default).
@0xcecbb43a74cec214;

using Cxx = import "/capnp/c++.capnp";
$Cxx.namespace("pdserve::proto::request_api");

const protocolVersion :UInt32 = 1;

struct ToolCall {
  name @0 :Text;
  arguments @1 :Text;  # JSON text
}

struct ChatMessage {
  role @0 :Text;              # system | user | assistant | tool
  hasContent @1 :Bool;        # false: null content (an assistant turn with tool calls only)
  content @2 :Text;
  toolCalls @3 :List(ToolCall);
}

enum Thinking {
  unset @0;  # the template's default
  off @1;
  on @2;
}

struct Sampling {
  hasMaxTokens @0 :Bool;
  maxTokens @1 :Int64;
  hasTemperature @2 :Bool;
  temperature @3 :Float64;
  hasTopP @4 :Bool;
  topP @5 :Float64;
  hasTopK @6 :Bool;
  topK @7 :Int64;
  hasMinP @8 :Bool;
  minP @9 :Float64;
  hasPresencePenalty @10 :Bool;
  presencePenalty @11 :Float64;
  hasFrequencyPenalty @12 :Bool;
  frequencyPenalty @13 :Float64;
  hasRepetitionPenalty @14 :Bool;
  repetitionPenalty @15 :Float64;
  hasSeed @16 :Bool;
  seed @17 :Int64;
}

struct LogitBias {
  token @0 :Int32;
  bias @1 :Float32;   # [-100, 100]
}

struct Tool {
  name @0 :Text;         # [A-Za-z0-9_-]{1,64}
  description @1 :Text;
  parameters @2 :Text;   # a JSON Schema as JSON text; empty: no parameters
}

enum ToolChoiceMode {
  auto @0;       # the model may call a tool or answer
  none @1;       # no calls
  required @2;   # one or more calls (constrained)
  function @3;   # one call of ToolChoice.function (constrained)
}

struct ToolChoice {
  mode @0 :ToolChoiceMode;
  function @1 :Text;
}

enum ResponseFormatType {
  text @0;        # unconstrained
  jsonObject @1;  # any JSON object
  jsonSchema @2;  # ResponseFormat.text: the schema (JSON text; its property order is kept)
  regex @3;       # ResponseFormat.text: a regex the whole output matches
  grammar @4;     # ResponseFormat.text: pdserve's EBNF
}

struct ResponseFormat {
  type @0 :ResponseFormatType;
  text @1 :Text;
  strict @2 :Bool = true;   # jsonSchema: absent additionalProperties means false
}

struct Submit {
  requestId @0 :UInt64;   # the client's id; unique among its requests in flight
  model @1 :Text;
  prompt :union {
    tokenIds @2 :List(Int32);       # as /v1/completions with a token-id prompt (no BOS added)
    text @3 :Text;                  # as /v1/completions with a text prompt (BOS added)
    messages @4 :List(ChatMessage); # as /v1/chat/completions (chat template)
  }
  thinking @5 :Thinking;            # chat only
  sampling @6 :Sampling;
  stop @7 :List(Text);
  stopTokenIds @8 :List(Int32);
  ignoreEos @9 :Bool;
  skipSpecialTokens @10 :Bool = true;
  logprobs @11 :Bool;
  topLogprobs @12 :UInt32;
  user @13 :Text;
  apiKey @14 :Text;       # one of router.api_keys_file when the router has it set (else ignored)
  n @15 :UInt32;          # choices to generate; 0 means 1
  logitBias @16 :List(LogitBias);
  tools @17 :List(Tool);            # chat only
  toolChoice @18 :ToolChoice;       # chat only
  responseFormat @19 :ResponseFormat;
}

struct Abort {
  requestId @0 :UInt64;
  reason @1 :Text;
}

struct Accepted {
  requestId @0 :UInt64;
  tag @1 :Text;             # the router's request id (logs on the router and the workers)
  promptTokens @2 :UInt32;
  maxTokens @3 :UInt32;     # as resolved for the chosen worker
}

enum FinishReason {
  none @0;
  stop @1;     # a stop token or stop string
  length @2;   # max tokens
  abort @3;    # the client aborted
  toolCalls @4;  # chat: stopped, and the message holds tool calls
}

struct TopLogprob {
  token @0 :Int32;
  logprob @1 :Float32;
}

struct TokenLogprob {
  logprob @0 :Float32;
  top @1 :List(TopLogprob);
}

struct ToolCallDelta {
  index @0 :UInt32;      # the call's position in the message
  id @1 :Text;           # "call_..."; on the call's first delta only
  name @2 :Text;         # on the call's first delta only
  arguments @3 :Text;    # the next piece of the arguments' JSON text
}

struct Output {
  requestId @0 :UInt64;
  tokenIds @1 :List(Int32);        # tokens rendered by this event (a hidden stop token is not)
  text @2 :Text;                   # text delta (never a partial UTF-8 character, never a byte
                                   # of a stop string)
  logprobs @3 :List(TokenLogprob); # parallel to tokenIds when requested
  finishReason @4 :FinishReason;
  promptTokens @5 :UInt32;         # usage, on the finishing event (of this choice)
  completionTokens @6 :UInt32;
  index @7 :UInt32;                # the choice (0 .. n-1)
  reasoningText @8 :Text;          # chat: reasoning delta (text is then the content delta)
  toolCalls @9 :List(ToolCallDelta);  # chat: tool-call deltas
  reasoningTokens @10 :UInt32;     # usage: completion tokens that were reasoning
}

struct Error {
  requestId @0 :UInt64;   # 0: the message it answers could not be attributed
  httpStatus @1 :UInt32;  # what the HTTP API answers for the same failure (400, 404, 429, ...)
  type @2 :Text;          # OpenAI error type: invalid_request_error, rate_limit_error, ...
  code @3 :Text;          # model_not_found, context_length_exceeded, no_workers, ... or empty
  param @4 :Text;         # the offending request field, or empty
  message @5 :Text;
}

struct RequestApiMessage {
  protocolVersion @0 :UInt32;
  union {
    submit @1 :Submit;        # C -> R
    abort @2 :Abort;          # C -> R
    ping @3 :UInt64;          # C -> R (nonce)
    accepted @4 :Accepted;    # R -> C
    output @5 :Output;        # R -> C
    error @6 :Error;          # R -> C
    pong @7 :UInt64;          # R -> C (the ping's nonce)
    keepalive @8 :Void;       # R -> C
  }
}
