// Engine: one worker's generation engine: a Model, a paged KV BlockPool, a continuous-batching
// Scheduler and the Sampler, behind one request API used by the colocated worker and by the
// disaggregated prefill / decode services.
//
//   colocated:    AddRequest(prompt, {sampling, on_event}) -> prefill + decode here.
//   prefill side: AddRequest(..., hold_kv = true) with max_tokens = 1: the first token is
//                 sampled, the request finishes, its KV blocks stay allocated (HeldBlocks) for
//                 the KV transfer until ReleaseKv. With RequestOptions::kv_export the caller
//                 also learns, during the forward of the prompt's last chunk, when each
//                 layer's KV is final (request.h, KvExportHooks): it can send layer l while
//                 layer l + 1 computes.
//   decode side:  ReserveImport(prompt, ...) allocates blocks for the prompt's KV and returns
//                 their ids (the transfer layer writes pool().base() + id * block_bytes());
//                 CommitImport(id, first_token) then starts decoding after the first token.
// Every request ends with exactly one finished event (stop / length / abort / error).
//
// Driving: either Start() (an owned std::jthread runs Step() whenever there is work; Stop() or
// the destructor ends it) or call Step() from one owner thread (tests, benchmarks).
// Multi-rank (EngineOptions::group, engine/rank_group.h): the engine is a DP unit's leader;
// every step goes through the group (the unit's followers replay it, all DP units vote), so
// the loop keeps stepping (polling every group_idle_poll) while any rank of the instance has
// work, and Stop() (also the destructor's, also for an engine stepped by hand) returns only once
// every rank of the instance stopped: a stopping leader schedules nothing more but still takes
// the dummy steps the others need. A broken group (a
// rank failed) fails the step's requests and ends the loop; failure() then says why.
// Thread-safety: AddRequest, Abort, ReserveImport, CommitImport, HeldBlocks, ReleaseKv, Stats
// may be called from any thread (inputs go through a locked inbox applied at the next step).
// Event callbacks run on the stepping thread, outside every engine lock.
// Errors: AddRequest / ReserveImport: InvalidArgument (empty prompt, token outside the
// vocabulary, prompt not shorter than the model context or the KV pool capacity, invalid
// sampling parameters, stop strings without a detokenizer, kv_export without hold_kv and
// max_tokens 1, or on ReserveImport; a constraint that does not compile, is over another
// vocabulary, needs EngineOptions::grammars, or whose state / replay of the resumed output does
// not fit), ResourceExhausted (ReserveImport: no blocks); Abort / CommitImport / ReleaseKv /
// HeldBlocks: NotFound for an unknown id, FailedPrecondition for a request in the wrong state.
// Structured output: RequestOptions::constraint (RequestConstraint below).
#pragma once

#include <chrono>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <random>
#include <span>
#include <stop_token>
#include <string>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "common/op_profile.h"
#include "common/thread_pool.h"
#include "engine/block_pool.h"
#include "engine/rank_group.h"
#include "engine/request.h"
#include "engine/sampler.h"
#include "engine/scheduler.h"
#include "grammar/constraint.h"
#include "model/model.h"

namespace pdserve::engine {

struct EngineOptions {
  std::string model_dir;            // used by Create(options) (ignored when a model is given)
  int threads = 0;                  // compute threads when the engine loads the model (0: default)
  double kv_cache_gib = 1.0;        // block pool budget (ignored with kv_memory)
  int64_t block_tokens = 64;        // B
  KvLatentFormat latent_format = KvLatentFormat::kFp8Blockwise;
  KvIndexFormat index_format = KvIndexFormat::kFp8;
  SchedulerOptions scheduler;
  uint64_t seed = 0;                // seeds requests that have none (0: random_device)
  // Text of output tokens (the tokenizer's decode), for stop strings. Optional.
  std::function<std::string(const std::vector<int32_t>&)> detokenize;
  // Caller-provided pool memory (e.g. registered with the KV transfer layer), 4 KiB aligned.
  uint8_t* kv_memory = nullptr;
  int64_t kv_memory_bytes = 0;
  // Fault injection for tests (empty in production): called on the step thread after each
  // layer's layer_done hooks of a forward that exports KV (kv_export); a non-OK status fails
  // that forward there, as a real forward error would (every request of the step ends with an
  // error event).
  std::function<Status(int64_t layer)> layer_fault_hook;
  // Multi-rank: this engine leads its DP unit of `group` (borrowed; outlives the engine). The
  // model must be the one the group was created over. With cp > 1 prompts run whole and alone
  // (SchedulerOptions::whole_prompts is forced on).
  RankGroup* group = nullptr;
  std::chrono::milliseconds group_idle_poll{1};
  // When set (borrowed; outlives the engine, read it between steps): every step with work is
  // profiled op by op into it (model/profile_ops.h; phase prefill when the step computes
  // prompt rows, decode otherwise).
  OpProfile* profile = nullptr;
  // Compiles RequestConstraint::spec (borrowed; outlives the engine; built over this model's
  // vocabulary). Without it only precompiled constraints are accepted.
  grammar::GrammarCache* grammars = nullptr;
  // Prefix cache (docs/prefix-cache.md): full KV blocks stay resident after their request ends
  // and a later request with the same token prefix maps them instead of computing them. Outputs
  // are bitwise those of a cold run. Costs: idle cached blocks are evicted (LRU) only when the
  // pool needs room, so the pool looks full in a heap profile but Allocate never fails because
  // of the cache. When prompts are scheduled whole (CP prefill) only prompts' blocks are cached
  // (decoded positions take another form there), and a hit's rest runs in the whole prompt's.
  bool prefix_cache = true;
  // The weights' identity in the cache namespace (e.g. model::WeightsFingerprint): only
  // engines with equal namespaces may exchange cached blocks. 0: Create(options) fingerprints
  // model_dir; Create(options, model) then uses the model config alone.
  uint64_t model_identity = 0;
  // Disk tier of the prefix cache (engine/disk_tier.h, docs/prefix-cache.md "Disk tier"):
  // evicted cached blocks are written to files in this directory (the engine's own: one tier
  // per directory) and read back when a later prompt continues their prefix. Empty: off. Off
  // too (with a warning) when the prefix cache is off. In a multi-rank engine (`group`) the
  // leader holds the tier and sends restored blocks to its followers with the next step.
  // The bytes bound the files: more keeps older prefixes at the cost of disk space. Evictions
  // and restores do synchronous file I/O on the step thread.
  std::string prefix_cache_disk_dir;
  int64_t prefix_cache_disk_bytes = int64_t{4} << 30;
};

// Structured output (docs/structured-output.md): the grammar a request's output follows. Every
// sampled token of the request is drawn from the tokens the grammar allows next (the mask is
// applied to its logits before sampling, greedy or not); the request ends with kStop when the
// grammar is complete (the stop token, allowed only then, was sampled), or with kLength at
// max_tokens (the text is then a valid prefix, not a complete document).
struct RequestConstraint {
  // The constraint as the request carries it, compiled through EngineOptions::grammars on the
  // caller's thread (AddRequest / ReserveImport), unless `compiled` is given.
  grammar::Constraint spec;
  // A grammar already compiled over this model's vocabulary (GrammarCache::Get).
  std::shared_ptr<const grammar::CompiledGrammar> compiled;
  // The matcher state after the output the request already has (SamplingParams::
  // resumed_output tokens; TokenEvent::constraint_state of the attempt that made them). Empty:
  // the engine replays those tokens through the grammar.
  std::string state;
  // The finishing event carries the matcher state (TokenEvent::constraint_state).
  bool export_state = false;

  bool active() const { return compiled != nullptr || spec.active(); }
};

struct RequestOptions {
  SamplingParams sampling;
  EventCallback on_event;           // may be empty
  bool hold_kv = false;             // keep the KV blocks after finishing, until ReleaseKv
  // Layer-wise export of the prompt's KV (KvExportHooks). REQUIRES hold_kv and max_tokens 1
  // (the request then ends in the step that computed its last chunk, so the exported blocks
  // can never be preempted).
  KvExportHooks kv_export;
  RequestConstraint constraint;     // inactive by default
  // ReserveImport: the prefix-cache namespace of the engine that computes the imported KV (its
  // prefix_cache_namespace()). When it equals this engine's, the imported blocks join this
  // engine's prefix cache once the import commits (then the blocks it decodes too). 0 (unknown
  // origin): they never do.
  uint64_t imported_kv_namespace = 0;
};

struct EngineStats {
  int64_t steps = 0, preemptions = 0;
  int64_t blocks_total = 0, blocks_free = 0, blocks_used = 0, blocks_held = 0;
  int64_t running = 0, waiting = 0, awaiting_kv = 0;  // waiting includes AddRequests not yet applied
  // Work owed: prompt tokens still to compute plus output tokens still to generate (up to
  // max_tokens / the sequence cap), over every live request (and the inbox).
  int64_t queued_tokens = 0;
  int64_t kv_exports = 0;  // requests whose KV export began (kv_export.begin called)
  int64_t prompt_rows = 0, output_rows = 0, generated_tokens = 0;  // rows computed, tokens sampled
  int64_t finished = 0, aborted = 0;
  int64_t routed_expert_runs = 0, kv_bytes_read = 0;  // model::BatchStats, summed over steps
  double forward_seconds = 0, schedule_seconds = 0, sample_seconds = 0, event_seconds = 0;
  // Structured output: rows sampled under a grammar mask, and the time of their masks (filling
  // and applying them, and advancing the matchers; part of sample_seconds).
  int64_t constrained_rows = 0;
  double constraint_seconds = 0;
  // Prefix cache: prompt tokens of admitted requests looked up, found cached and left to
  // compute (counted once per request, at its first admission; all 0 with the cache off);
  // blocks registered in the cache (in use or idle; idle ones also count in blocks_free) and
  // the idle ones; cached blocks evicted to make room (or by ClearPrefixCache).
  int64_t prefix_lookup_tokens = 0, prefix_hit_tokens = 0, prefix_computed_tokens = 0;
  int64_t prefix_cached_blocks = 0, prefix_idle_blocks = 0, prefix_evictions = 0;
  // The cluster pool: tokens of blocks adopted from another engine's pull (they count as hits
  // once a request maps them), and tokens pinned here for another engine to pull.
  int64_t prefix_pulled_tokens = 0, prefix_pushed_tokens = 0;
  // Disk tier (all 0 without one): block files held and their bytes; blocks written and their
  // bytes; tokens of the blocks read back (restored) into the pool; files its LRU deleted;
  // damaged files found and deleted (their prefix was computed instead); failed writes.
  int64_t prefix_tier_blocks = 0, prefix_tier_bytes = 0;
  int64_t prefix_tier_stored_blocks = 0, prefix_tier_stored_bytes = 0;
  int64_t prefix_tier_restored_tokens = 0, prefix_tier_evictions = 0;
  int64_t prefix_tier_corrupt_files = 0, prefix_tier_write_errors = 0;
  // Share of step time spent outside the forward pass (scheduling, batch building,
  // sampling, stop checks, event delivery).
  double OverheadShare() const;
};

struct KvImport {
  RequestId id = 0;
  std::vector<int32_t> block_ids;   // BlocksForTokens(prompt) blocks; token t is in block_ids[t / B]
};

class Engine {
 public:
  // Loads options.model_dir with its own thread pool.
  static Result<std::unique_ptr<Engine>> Create(const EngineOptions& options);
  // Uses a loaded model (and its thread pool), which must outlive the engine.
  static Result<std::unique_ptr<Engine>> Create(const EngineOptions& options, const model::Model* model);
  // Stops the loop; requests still in flight get an abort event (on the calling thread).
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  Result<RequestId> AddRequest(std::vector<int32_t> prompt, RequestOptions options);
  Status Abort(RequestId id);

  Result<KvImport> ReserveImport(std::vector<int32_t> prompt, RequestOptions options);
  // `constraint_state` (a constrained request): the prefill side's matcher state after the
  // first token (TokenEvent::constraint_state); empty: the first token is replayed through the
  // grammar. A state that does not fit the request's grammar, or a first token the grammar does
  // not allow, ends the request with an error event.
  Status CommitImport(RequestId id, int32_t first_token, std::string constraint_state = {});
  Result<std::vector<int32_t>> HeldBlocks(RequestId id) const;
  Status ReleaseKv(RequestId id);

  void Start();
  void Stop();
  // One step on the calling thread: applies the inbox, schedules, runs the batch, samples and
  // delivers events. Returns false when there was nothing to do. REQUIRES: not Start()ed.
  bool Step();
  // Ok, or why the engine's rank group broke (the loop has ended; the process should exit).
  Status failure() const;
  // How long the step in progress has been running (0 between steps): a watchdog's input. A
  // step stuck far beyond its usual length (a multi-rank engine waiting in a collective for a
  // rank that stopped) means the engine cannot make progress. Any thread.
  double CurrentStepSeconds() const;
  // True when no request is queued, running or awaiting KV and the inbox is empty.
  bool Idle() const;

  EngineStats Stats() const;
  const BlockPool& pool() const { return *pool_; }
  // Whether the prefix cache is on, and this engine's namespace (engine/block_hash.h): what a
  // decode engine needs in RequestOptions::imported_kv_namespace to cache KV this one computed.
  bool prefix_cache_enabled() const { return scheduler_.prefix_policy().enabled; }
  uint64_t prefix_cache_namespace() const { return scheduler_.prefix_policy().ns; }
  // The hit rule's first-chunk size C: a hit maps at least C tokens or none (docs/prefix-cache.md).
  int64_t prefix_cache_first_chunk_tokens() const { return scheduler_.prefix_policy().first_chunk_tokens; }
  // Whether pulled blocks may join this cache (AllocatePullBlocks): with the cache on. In a
  // multi-rank engine the adopted blocks' bytes go to the followers with the next step.
  bool accepts_pulls() const { return prefix_cache_enabled(); }
  // Evicts every idle cached block (blocks of live requests stay; the disk tier keeps its
  // files). Returns how many. Any thread.
  int64_t ClearPrefixCache();
  // Moving cached blocks between engines (the cluster pool, docs/prefix-cache.md "Pulls"). Any
  // thread; the pool's lock orders these with the step thread. Equal namespaces on both sides
  // are the caller's contract (only then are the bytes interchangeable).
  //
  // Holder side: pins the longest cached prefix of `tokens` up to `max_blocks` whole blocks (a
  // disk-tier walk included) and returns its block ids, each with one reference, in order; the
  // blocks stay resident and unchanged until UnpinBlocks. Fewer than asked (even none) when the
  // cache holds less. Counts the pinned tokens as pushed. Empty with the cache off.
  std::vector<int32_t> PinCachedPrefix(std::span<const int32_t> tokens, int64_t max_blocks);
  void UnpinBlocks(std::span<const int32_t> ids);
  // How many whole blocks of `tokens` (up to `max_blocks`) this cache holds now in memory or on
  // disk: PinCachedPrefix and Unpin at once (a pull asks only for what follows them).
  int64_t CachedPrefixBlocks(std::span<const int32_t> tokens, int64_t max_blocks);
  // Puller side: `count` blocks for a pull to write into, each with one reference (free blocks
  // first, then evicting idle cached ones). Errors: ResourceExhausted; FailedPrecondition when
  // !accepts_pulls().
  Result<std::vector<int32_t>> AllocatePullBlocks(int64_t count);
  // The pull's blocks now hold the KV of tokens [first_block * B, (first_block + blocks.size())
  // * B): they join the cache as the continuation of this cache's own first `first_block`
  // blocks of `tokens` (which must still be cached; else nothing is adopted). Consumes the
  // blocks' references (adopted blocks become idle cached blocks, the rest go back to the free
  // list) and returns the tokens adopted, counted as pulled. REQUIRES: tokens cover the blocks.
  // In a multi-rank engine the blocks' bytes reach the unit's followers before the first step
  // that can read them (they are queued before they join the cache, sent after scheduling).
  int64_t AdoptPulledBlocks(std::span<const int32_t> tokens, int64_t first_block, std::span<const int32_t> blocks);
  // Whether evicted cached blocks spill to a disk tier (EngineOptions::prefix_cache_disk_dir).
  bool prefix_cache_disk_tier() const { return pool_->has_disk_tier(); }
  // Block files the disk tier may hold (0 without one): its names are in TakeKvEvents too.
  int64_t prefix_cache_disk_tier_blocks() const { return pool_->disk_tier_capacity_blocks(); }
  // The prefix cache's events for a cluster-wide index (docs/prefix-cache.md, "Events"): the
  // hashes of the blocks cached and no longer cached since the last call, or with `full` (or
  // once the bounded backlog overflowed) every cached hash with `reset`. Nothing is ever cached
  // with the cache off. Any thread (the pool's lock orders them with the step thread's changes).
  KvEventBatch TakeKvEvents(bool full) { return pool_->TakeKvEvents(full); }
  const model::ModelConfig& config() const { return model_->config(); }
  // Longest sequence (prompt + output) a request may reach.
  int64_t max_sequence_length() const { return max_len_; }

 private:
  Engine(const EngineOptions& options, const model::Model* model, std::unique_ptr<model::Model> owned,
         std::unique_ptr<ThreadPool> owned_pool, std::unique_ptr<BlockPool> pool);
  Result<std::unique_ptr<Request>> NewRequest(std::vector<int32_t> prompt, RequestOptions options);
  // The longest cached prefix of `tokens` (whole blocks, at most max_blocks), each block with one
  // more reference (the pulls' lookups; empty with the cache off).
  std::vector<int32_t> MatchCachedBlocks(std::span<const int32_t> tokens, int64_t max_blocks);
  // The request's grammar matcher after its resumed output (state restored or replayed).
  Result<grammar::GrammarMatcher> NewMatcher(const RequestConstraint& c, const std::vector<int32_t>& prompt,
                                             int64_t resumed) const;
  void Loop(std::stop_token st);
  // One step; `stopping`: schedule nothing (a group leader that is stopping still steps).
  // Returns whether a batch ran or events went out.
  bool StepOnce(bool stopping);
  // StepOnce's phases (engine_step.cc).
  struct StepBatch {
    std::vector<model::BatchSequence> sequences;  // one per scheduled chunk
    int64_t n_sample = 0;                         // chunks that sample a token (logits rows)
    int64_t prompt_rows = 0, output_rows = 0;     // positions computed, by kind
  };
  struct StepTimes {
    double schedule = 0, forward = 0, sample = 0, events = 0;  // seconds
  };
  // Logs preemptions; a request scheduled for the first time gets its queue time.
  void NoteScheduled(const SchedulerOutput& out, std::chrono::steady_clock::time_point now);
  // The forward's sequences, each sampling chunk with its logits_ row.
  StepBatch LayOutBatch(const std::vector<ScheduledChunk>& chunks);
  // Starts the KV exports whose prompts complete in this step (fills exporting_); returns the
  // per-layer callback for the forward (empty when none).
  model::LayerKvDone BeginKvExports(const std::vector<ScheduledChunk>& chunks);
  // Grammar masks applied in a step: constrained rows and the seconds they took.
  struct ConstraintStep {
    int64_t rows = 0;
    double seconds = 0;
    int64_t twin_tokens = 0;  // first tokens of twin prompts (scheduler.h), beside the batch's rows
  };
  // The waiting twins of the prompts that complete in this step: each gets blocks holding a
  // copy of its twin's KV and joins the running set; returned with the twin's logits row.
  std::vector<std::pair<Request*, int64_t>> AdoptTwins(const std::vector<ScheduledChunk>& chunks);
  ConstraintStep SampleAndEmit(const std::vector<ScheduledChunk>& chunks, std::vector<TokenEvent>* events);
  // A failed forward ends every request of the step with an error event.
  void FailChunks(const std::vector<ScheduledChunk>& chunks, const Status& why, std::vector<TokenEvent>* events);
  void PublishStepStats(const StepBatch& batch, const model::BatchStats& bstats, int64_t n_exports,
                        const StepTimes& times, const ConstraintStep& constrained);
  // Runs the step's batch: the model directly, or through the group (sets group_stopped_).
  Status RunForward(const std::vector<ScheduledChunk>& chunks, std::span<const model::BatchSequence> batch,
                    bool stopping, model::BatchStats* stats, const model::LayerKvDone& on_layer);
  void ApplyInbox(std::vector<TokenEvent>* events);
  // Appends `token` to r, checks stop conditions; returns the event (finished if it ends r).
  // `advance`: the token still has to go through the request's grammar matcher.
  TokenEvent Emit(Request* r, const SampleResult& s, bool advance = true);
  void Finish(Request* r, FinishReason reason, TokenEvent* ev);
  // Fills and applies the grammar masks of the constrained rows among `to_sample` (row k's
  // logits at logits_[k * V]); a row with nothing allowed ends with an error and becomes null.
  // Returns the number of constrained rows.
  int64_t MaskConstrainedRows(std::vector<Request*>* to_sample, std::vector<TokenEvent>* events);
  void Deliver(std::vector<TokenEvent>& events);
  // Moves a pending queue time into the request's next event.
  static void TakeQueueTime(Request* r, TokenEvent* ev);

  const EngineOptions options_;
  std::unique_ptr<ThreadPool> owned_pool_;
  std::unique_ptr<model::Model> owned_model_;
  const model::Model* model_;
  std::unique_ptr<BlockPool> pool_;
  Scheduler scheduler_;
  int64_t max_len_ = 0;
  size_t max_stop_bytes_ = 0;

  // Step-thread state.
  std::unordered_map<RequestId, std::unique_ptr<Request>> requests_;
  std::unordered_map<RequestId, EventCallback> callbacks_;  // of requests finished this step
  std::vector<float> logits_;
  std::vector<uint32_t> masks_;      // grammar masks of this step's constrained rows
  std::vector<int32_t> constrained_; // their indices among the sampled rows
  std::vector<uint8_t> mask_ok_;     // per constrained row: something is allowed
  double advance_seconds_ = 0;       // this step's matcher advances
  std::vector<Request*> exporting_;  // this step's requests with a kv_export that began
  std::vector<int32_t> imported_;    // group: blocks of imports (and pulls) to send with the step
  std::vector<GroupSequence> group_seqs_;  // group: this step's sequences (scratch)
  bool group_stopped_ = false;       // group: every rank voted stop (the group is done)
  int64_t next_arrival_ = 0;

  // Shared state.
  mutable std::mutex mu_;
  std::condition_variable_any cv_;
  std::vector<std::unique_ptr<Request>> inbox_adds_;
  std::vector<RequestId> inbox_aborts_;
  struct InboxCommit {
    RequestId id;
    int32_t token;
    std::string constraint_state;
  };
  std::vector<InboxCommit> inbox_commits_;
  // group: pulled blocks adopted since the last forward (AdoptPulledBlocks queues them before
  // they join the cache; RunForward sends their bytes to the followers with the step).
  std::vector<int32_t> pulled_for_followers_;
  std::unordered_set<RequestId> live_;                             // not yet finished
  std::unordered_map<RequestId, std::vector<int32_t>> held_;       // hold_kv, finished
  RequestId next_id_ = 1;
  std::mt19937_64 seed_rng_;
  EngineStats stats_;
  bool has_work_ = false;           // the step thread has queued or running requests
  bool kick_ = false;               // blocks were released: the loop should try again
  Status failure_;                  // the group broke
  std::atomic<int64_t> step_started_ns_{0};  // steady_clock ns of the step in progress; 0: none
  std::jthread loop_;               // last: joined before the members it uses go away
};

}  // namespace pdserve::engine
