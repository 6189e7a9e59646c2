# Control plane between the router and its workers (services/common/, services/router/,
# docs/control-plane.md).
#
# Transport: ZeroMQ over TCP. The router binds one ROUTER socket; every worker process connects
# one DEALER socket to it. Each ZeroMQ message carries exactly one ControlMessage (the ROUTER
# side adds the peer's routing-id frame). Messages between one worker and the router are
# delivered in order; nothing is acknowledged except Register and Heartbeat.
#
# Flows (W = worker, R = router, P = prefill worker, D = decode worker, C = colocated worker):
#
#   Registration   W -> R register         (retried every registerRetryMs until answered)
#                  R -> W registerAck      (the router's incarnation + heartbeat timing)
#                   or registerRefuse      (wrong protocol/model, compatibility hash mismatch)
#   Liveness       W -> R heartbeat        (every heartbeatIntervalMs, with the worker's load)
#                  R -> W heartbeatAck     (known = false: the router does not know this peer,
#                                           e.g. it restarted or timed the worker out: the
#                                           worker aborts its jobs and registers again)
#                  R removes a worker after heartbeatTimeoutMs of silence and fails its requests
#                  at once; W treats heartbeatTimeoutMs without an ack as "router lost", aborts
#                  its jobs (their clients were connected to that router) and re-registers.
#   Colocated      R -> C job(phase colocated)   C -> R tokenEvent* (the last one finishes)
#   Disaggregated  R -> D job(phase decode)      D reserves KV blocks for prompt + max tokens
#                  D -> R kvReserved             (opaque KV descriptor + D's transfer address;
#                                                 or a finishing tokenEvent with an error)
#                  R -> P job(phase prefill, kvDescriptor, decodeWorkerId)
#                  P computes the prompt, writes the KV layer by layer into D's blocks over the
#                  KV transfer layer and completes the transfer (proto/kv_transfer.capnp), then
#                  P -> R tokenEvent(first token, index 0) -- P's only event for the job; its
#                                                 finishReason is `none` unless the request
#                                                 ends at the first token (stop / length)
#                  R streams the first token to the client (TTFT is measured here), then
#                  R -> D firstToken             D commits the imported KV with the first token
#                                                 (it waits for the transfer's completion too)
#                  D -> R tokenEvent* from index 1 (the last one finishes)
#                  If the request ended at P, R sends abort to D (which frees its blocks).
#   Cancel         R -> W abort   (client gone, deadline, stop string matched, a peer of the
#                                  request failed). The worker still ends the job with one
#                                  finishing tokenEvent (finishReason abort); R ignores it.
#   Drain          R -> W drain   W stops taking jobs (heartbeats say draining), finishes the
#                                 running ones, then W -> R deregister and leaves.
#   Shutdown       W -> R deregister   R removes the worker, failing whatever it still had.
#   KV events      W -> R kvEvents     (every ~100 ms while there is news; engine workers with a
#                                       prefix cache) the block hashes its cache stored and
#                                       removed. The first one after each registerAck, and any
#                                       after the worker's bounded backlog overflowed, has
#                                       reset = true and the whole set. R keeps a global index
#                                       (hash -> workers) to predict each worker's cache hit for
#                                       routing; a stale entry costs a misprediction, never a
#                                       wrong token (the worker looks up its own cache).
#   Pulls          R -> P job(phase prefill, pullTokens, pullWorkerId): another worker H (prefill
#                  or decode) holds more of the prompt's prefix than P. P reserves blocks for
#                  the part it lacks and P -> R kvPull (descriptor); R -> H kvPush; H writes the
#                  blocks over the KV transfer layer. P adopts them into its prefix cache once the
#                  transfer is verified, then computes the rest. H -> R kvPushFailed (forwarded
#                  to P), a transfer failure or P's lease ending all cost P a recompute only.
#
# Every job ends with exactly one finishing tokenEvent from each worker it was sent to
# (finishReason != none, or errorCode != 0); a prefill job's single event counts as finishing.
@0x9668d0c5e49c4722;

using Cxx = import "/capnp/c++.capnp";
$Cxx.namespace("pdserve::proto::control");

const protocolVersion :UInt32 = 1;

enum WorkerRole {
  prefill @0;    # computes prompts and writes their KV into decode workers' blocks
  decode @1;     # owns a KV pool, imports prompts' KV, generates
  colocated @2;  # both phases in one worker (no KV transfer)
}

# What a worker can hold. Block counts are of the worker's own KV pool (decode / colocated);
# a prefill worker reports its pool for prompts in flight.
struct Capacity {
  maxBatch @0 :UInt32;          # requests it runs concurrently
  kvBlocksTotal @1 :UInt32;
  kvBlocksFree @2 :UInt32;
  blockTokens @3 :UInt32;       # tokens per KV block
  maxContextTokens @4 :UInt32;  # longest prompt + output a request may reach
  dpRanks @5 :UInt32;           # data-parallel ranks of this worker's instance (>= 1); each
                                # DP rank registers as a worker of its own (Register.dpRank)
  prefixTierBlocks @6 :UInt32;  # blocks its prefix cache's disk tier may hold (0: none); its
                                # kvEvents may name up to kvBlocksTotal + prefixTierBlocks
}

struct Register {
  protocolVersion @0 :UInt32;
  role @1 :WorkerRole;
  workerId @2 :Text;          # unique in the cluster, stable across restarts of the worker
  incarnation @3 :UInt64;     # random per process start: tells a restart from a retry
  controlAddress @4 :Text;    # the router address the worker dialled (for logs)
  httpAddress @5 :Text;       # host:port of the worker's /metrics endpoint
  transferAddress @6 :Data;   # the worker's KV-transfer-layer address (empty: none)
  capacity @7 :Capacity;
  modelName @8 :Text;
  compatHash @9 :UInt64;      # hash of model weights identity + KV layout: a prefill and a
                              # decode worker may pair only when equal
  instanceId @10 :Text;       # the multi-rank instance this worker is a DP rank of (empty: a
                              # one-process worker); shared by the instance's DP ranks
  dpRank @11 :UInt32;         # this worker's DP rank in its instance (< capacity.dpRanks)
  vocabSize @12 :UInt32;      # rows of the model's embedding / lm_head (0: not a model, e.g.
                              # the echo test worker); the router refuses a worker whose
                              # vocabulary does not cover its tokenizer's ids
  kvNamespace @13 :UInt64;    # the engine's prefix-cache namespace: KV it computes is bitwise
                              # what an engine of the same namespace computes (0: cache off)
}

struct RegisterAck {
  routerIncarnation @0 :UInt64;
  heartbeatIntervalMs @1 :UInt32;
  heartbeatTimeoutMs @2 :UInt32;
}

struct RegisterRefuse {
  code @0 :UInt32;      # pdserve::StatusCode
  message @1 :Text;
}

struct Load {
  running @0 :UInt32;       # requests in the running batch
  waiting @1 :UInt32;       # queued, not yet scheduled
  queuedTokens @2 :UInt64;  # prompt tokens not yet computed + output tokens still owed
  kvBlocksFree @3 :UInt32;
  kvBlocksTotal @4 :UInt32;
}

struct Heartbeat {
  seq @0 :UInt64;
  load @1 :Load;
  draining @2 :Bool;        # takes no new jobs
}

struct HeartbeatAck {
  seq @0 :UInt64;
  known @1 :Bool;           # false: register again
  routerIncarnation @2 :UInt64;
}

struct SamplingParams {
  temperature @0 :Float32;        # 0: greedy
  topP @1 :Float32;               # 1: off
  topK @2 :Int32;                 # 0 or -1: off
  minP @3 :Float32;               # 0: off
  repetitionPenalty @4 :Float32;  # 1: off
  presencePenalty @5 :Float32;
  frequencyPenalty @6 :Float32;
  seed @7 :UInt64;
  hasSeed @8 :Bool;               # false: the worker seeds the request itself
  maxTokens @9 :UInt32;           # output tokens, >= 1
  stopTokenIds @10 :List(Int32);  # includes EOS unless the client asked to ignore it
  stopStrings @11 :List(Text);    # the router also enforces these on the text it streams
  logprobs @12 :Bool;             # report the sampled token's logprob
  topLogprobs @13 :UInt32;        # and this many alternatives
  resumedOutput @14 :UInt32;      # a migrated request: the prompt's last N tokens are its
                                  # earlier output (penalties, sampling index; maxTokens counts
                                  # new tokens only). 0: a fresh request
  logitBias @15 :List(LogitBias); # added to the logits before the penalties
}

struct LogitBias {
  token @0 :Int32;
  bias @1 :Float32;               # [-100, 100]
}

# What the output must follow (grammar/constraint.h). The worker compiles it over its model's
# vocabulary (a cache per worker); the router has already checked it compiles.
enum ConstraintKind {
  none @0;
  jsonObject @1;   # any JSON object; text unused
  jsonSchema @2;   # text: a JSON Schema
  regex @3;        # text: a regex the whole output matches
  ebnf @4;         # text: a grammar in pdserve's EBNF (tool calls too)
}

struct Constraint {
  kind @0 :ConstraintKind;
  text @1 :Text;
  freeTextUntil @2 :Text;         # free text up to and including this marker first ("</think>")
  jsonCompact @3 :Bool;           # JSON shape options (grammar/json_schema.h JsonSchemaOptions)
  jsonMaxWhitespace @4 :Int32;
  jsonStrict @5 :Bool;
}

enum JobPhase {
  colocated @0;  # prefill + decode here
  decode @1;     # reserve KV for the prompt, answer kvReserved, wait for firstToken, decode
  prefill @2;    # compute the prompt, write its KV per kvDescriptor, report the first token
}

struct Job {
  requestId @0 :UInt64;         # router-assigned, unique per router incarnation
  requestTag @1 :Text;          # the client-visible id ("chatcmpl-..."), for logs
  phase @2 :JobPhase;
  promptTokenIds @3 :List(Int32);
  sampling @4 :SamplingParams;
  deadlineUnixMs @5 :Int64;     # wall clock; 0: none. The router cancels at this time anyway
  # Prefill phase only:
  kvDescriptor @6 :Data;        # the decode worker's KV descriptor, opaque here (the KV
                                # transfer layer's proto/kv_transfer.capnp KvDescriptor bytes)
  decodeWorkerId @7 :Text;
  decodeTransferAddress @8 :Data;
  # The placement: the DP rank (Register.dpRank) of the worker's instance the router chose.
  # A worker refuses a job for any other rank (mis-routed or stale) with an error.
  dpRank @9 :UInt32;
  constraint @10 :Constraint;     # kind none: unconstrained
  # Decode phase: the paired prefill worker's kvNamespace (Register). Equal to the decode
  # worker's own, the imported KV joins its prefix cache; 0: it does not.
  prefillKvNamespace @11 :UInt64;
  # Prefill phase: a pull (docs/prefix-cache.md "Pulls"). The prompt's first pullTokens
  # tokens (whole blocks) are cached on worker pullWorkerId, whose kvNamespace equals this
  # worker's: reserve blocks for the part this worker lacks and answer kvPull; the holder
  # writes them. 0: no pull.
  pullTokens @12 :UInt32;
  pullWorkerId @13 :Text;
}

# P -> R: blocks are reserved for a pull (answer to a job with pullTokens > 0). R forwards it
# to the holder as kvPush, or answers kvPushFailed when the holder is gone.
struct KvPull {
  requestId @0 :UInt64;         # the job's
  descriptor @1 :Data;          # opaque: P's blocks for tokens [firstToken, firstToken + numTokens)
  firstToken @2 :UInt32;        # a block multiple: what P holds already
  numTokens @3 :UInt32;
  kvNamespace @4 :UInt64;       # P's: the holder refuses to write KV of another namespace
}

# R -> H: write the cached KV of tokens[firstToken, firstToken + numTokens) into the blocks the
# descriptor names (the KV transfer layer, as a prefill worker writes a decode worker's).
struct KvPush {
  requestId @0 :UInt64;
  requestTag @1 :Text;
  tokenIds @2 :List(Int32);     # the prompt's first firstToken + numTokens tokens
  firstToken @3 :UInt32;
  numTokens @4 :UInt32;
  descriptor @5 :Data;
  kvNamespace @6 :UInt64;
}

# H -> R, and R -> P: the holder cannot write the pull (it no longer holds those blocks, another
# namespace, a transfer failure before it began). P computes the prefix instead.
struct KvPushFailed {
  requestId @0 :UInt64;
  reason @1 :Text;
}

# D -> R: blocks are reserved for the request (answer to a decode-phase job).
struct KvReserved {
  requestId @0 :UInt64;
  descriptor @1 :Data;          # opaque to the router; forwarded verbatim in the prefill job
  transferAddress @2 :Data;     # D's KV-transfer-layer address
  blocks @3 :UInt32;            # blocks reserved (for metrics)
}

struct TopLogprob {
  token @0 :Int32;
  logprob @1 :Float32;
}

struct TokenLogprob {
  logprob @0 :Float32;
  top @1 :List(TopLogprob);
}

# R -> D: the first token, computed by the prefill worker.
struct FirstToken {
  requestId @0 :UInt64;
  token @1 :Int32;
  logprob @2 :TokenLogprob;     # when logprobs were asked for
  constraintState @3 :Data;     # a constrained request: the prefill's matcher state after the
                                # first token (from its TokenEvent); empty: decode replays it
}

enum FinishReason {
  none @0;     # more events follow (or: the prefill part is done, decode continues)
  stop @1;     # a stop token / stop string
  length @2;   # maxTokens or the context limit
  abort @3;    # aborted (router abort, drain timeout, shutdown)
  error @4;    # errorCode / errorMessage say why
}

struct TokenEvent {
  requestId @0 :UInt64;
  firstIndex @1 :UInt32;        # output position of tokenIds[0]
  tokenIds @2 :List(Int32);     # may be empty (a finish or an error without a token)
  logprobs @3 :List(TokenLogprob);  # parallel to tokenIds when asked for, else empty
  finishReason @4 :FinishReason;
  errorCode @5 :UInt32;         # pdserve::StatusCode; 0 = OK
  errorMessage @6 :Text;
  promptTokens @7 :UInt32;      # usage, on the finishing event
  completionTokens @8 :UInt32;
  stopString @9 :Text;          # the stop string that matched, when the worker matched one
  constraintState @10 :Data;    # prefill's finishing event of a constrained request: the
                                # matcher state after the first token (forwarded in FirstToken)
  cachedPromptTokens @11 :UInt32;  # usage, on the finishing event (the prefill's, in P/D):
                                   # prompt tokens whose KV came from the prefix cache
}

struct Abort {
  requestId @0 :UInt64;
  reason @1 :Text;
}

struct Drain {
  timeoutMs @0 :UInt32;         # abort what is still running after this long (0: wait)
}

struct Deregister {
  reason @0 :Text;
}

# W -> R: prefix-cache events (docs/prefix-cache.md "Events", docs/router.md "KV-aware
# routing"). A block hash is the chained name of a full KV block under the worker's
# Register.kvNamespace (common/block_hash.h): the router computes the same names for a prompt.
struct KvEvents {
  reset @0 :Bool;               # forget every hash held for this worker: `stored` is its whole
                                # set (`removed` is empty)
  blockTokens @1 :UInt32;       # B: a hit is whole blocks (> 0)
  firstChunkTokens @2 :UInt32;  # C: a hit maps at least C tokens or none
  stored @3 :List(UInt64);      # hashes now cached (disjoint from removed)
  removed @4 :List(UInt64);     # hashes no longer cached (evicted, replaced, cleared)
}

struct ControlMessage {
  union {
    register @0 :Register;              # W -> R
    registerAck @1 :RegisterAck;        # R -> W
    registerRefuse @2 :RegisterRefuse;  # R -> W
    heartbeat @3 :Heartbeat;            # W -> R
    heartbeatAck @4 :HeartbeatAck;      # R -> W
    job @5 :Job;                        # R -> W
    kvReserved @6 :KvReserved;          # D -> R
    firstToken @7 :FirstToken;          # R -> D
    tokenEvent @8 :TokenEvent;          # W -> R
    abort @9 :Abort;                    # R -> W
    drain @10 :Drain;                   # R -> W
    deregister @11 :Deregister;         # W -> R
    kvEvents @12 :KvEvents;             # W -> R
    kvPull @13 :KvPull;                 # P -> R
    kvPush @14 :KvPush;                 # R -> holder (P or D)
    kvPushFailed @15 :KvPushFailed;     # holder -> R -> P
  }
}
