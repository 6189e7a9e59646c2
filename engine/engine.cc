#include "engine/engine.h"

#include <algorithm>
#include <chrono>
#include <optional>

#include <fmt/format.h>

#include "common/logging.h"
#include "engine/block_hash.h"
#include "model/fingerprint.h"
#include "model/parallel.h"

namespace pdserve::engine {

namespace {
using Clock = std::chrono::steady_clock;
}  // namespace

int64_t QueuedTokens(const Request& r) {
  const int64_t prompt_left = r.state == RequestState::kAwaitingKv ? 0 : std::max<int64_t>(0, r.prompt_len - r.num_computed);
  const int64_t cap = std::min<int64_t>(r.params.max_tokens, r.max_len - r.prompt_len);
  return prompt_left + std::max<int64_t>(0, cap - r.n_output());
}

double EngineStats::OverheadShare() const {
  const double total = forward_seconds + schedule_seconds + sample_seconds + event_seconds;
  return total > 0 ? (schedule_seconds + sample_seconds + event_seconds) / total : 0.0;
}

namespace {

// The pool the options ask for, in their memory or owned.
Result<std::unique_ptr<BlockPool>> MakePool(const EngineOptions& options, const model::Model& model) {
  if (options.block_tokens < 1) return Status::InvalidArgument("block_tokens must be >= 1");
  const KvLayout layout = model::KvLayoutFor(model.config(), options.block_tokens, options.latent_format, options.index_format);
  if (options.kv_memory) return BlockPool::CreateOver(layout, options.kv_memory, options.kv_memory_bytes);
  return BlockPool::Create(layout, static_cast<int64_t>(options.kv_cache_gib * (1ull << 30)));
}

EngineOptions Effective(EngineOptions options) {
  if (options.group && options.group->whole_prompts()) options.scheduler.whole_prompts = true;
  // A twin's KV is copied within this process's pool; a group's ranks hold theirs elsewhere.
  if (options.group) options.scheduler.twin_prompts = false;
  return options;
}

// The prefix cache as this engine's options and model define it (docs/prefix-cache.md).
PrefixCachePolicy PrefixPolicyFor(const EngineOptions& options, const model::Model& model, const BlockPool& pool) {
  KvNamespaceInputs in;
  in.model_identity = options.model_identity;
  in.config = &model.config();
  in.layout = pool.layout();
  // Whole prompts are one chunk whatever their length: their KV is another form (0).
  in.first_chunk_tokens = options.scheduler.whole_prompts ? 0 : options.scheduler.prefill_chunk;
  if (const model::ParallelContext* p = model.parallel()) {
    in.cp = p->plan().cp;
    in.tp = p->plan().tp;
    in.ep = p->plan().ep;
  }
  PrefixCachePolicy policy;
  policy.enabled = options.prefix_cache;
  policy.ns = KvNamespace(in);
  // A whole prompt's positions all take one form: a hit may be any whole blocks of a prompt.
  policy.first_chunk_tokens = options.scheduler.whole_prompts ? 1 : options.scheduler.prefill_chunk;
  policy.prompt_blocks_only = options.scheduler.whole_prompts;
  return policy;
}

// The disk tier the options ask for, attached to the pool (docs/prefix-cache.md "Disk tier").
Status AttachDiskTier(const EngineOptions& options, const model::Model& model, BlockPool* pool) {
  if (options.prefix_cache_disk_dir.empty()) return Status::Ok();
  const PrefixCachePolicy policy = PrefixPolicyFor(options, model, *pool);
  if (!policy.enabled) {
    GetLogger("engine")->warn("prefix cache disk tier {} off: the prefix cache is off", options.prefix_cache_disk_dir);
    return Status::Ok();
  }
  DiskTierOptions to;
  to.dir = options.prefix_cache_disk_dir;
  to.max_bytes = options.prefix_cache_disk_bytes;
  PDSERVE_ASSIGN_OR_RETURN(std::unique_ptr<DiskTier> tier, DiskTier::Create(to, pool->layout(), policy.ns));
  GetLogger("engine")->info("prefix cache disk tier: {} (at most {} MiB, {} KiB per block)", to.dir,
                            to.max_bytes >> 20, tier->file_bytes() >> 10);
  pool->AttachDiskTier(std::move(tier));
  // The leader's tier only: the followers' pools get the restored blocks' bytes with the step.
  if (options.group && options.group->unit_size() > 1) pool->RecordRestoredBlocks(true);
  return Status::Ok();
}

}  // namespace

Result<std::unique_ptr<Engine>> Engine::Create(const EngineOptions& options) {
  if (options.group) return Status::InvalidArgument("a multi-rank engine needs the group's model (Create(options, model))");
  auto pool = std::make_unique<ThreadPool>(options.threads > 0 ? options.threads : ThreadPool::Default().n_threads());
  PDSERVE_ASSIGN_OR_RETURN(std::unique_ptr<model::Model> m, model::Model::Load(options.model_dir, pool.get()));
  const model::Model* raw = m.get();
  PDSERVE_RETURN_IF_ERROR(options.scheduler.Validate());
  PDSERVE_ASSIGN_OR_RETURN(std::unique_ptr<BlockPool> bp, MakePool(options, *raw));
  EngineOptions o = options;
  if (o.model_identity == 0) {
    PDSERVE_ASSIGN_OR_RETURN(o.model_identity, model::WeightsFingerprint(o.model_dir));
  }
  PDSERVE_RETURN_IF_ERROR(AttachDiskTier(o, *raw, bp.get()));
  return std::unique_ptr<Engine>(new Engine(o, raw, std::move(m), std::move(pool), std::move(bp)));
}

Result<std::unique_ptr<Engine>> Engine::Create(const EngineOptions& options, const model::Model* model) {
  PDSERVE_RETURN_IF_ERROR(options.scheduler.Validate());
  if (options.group && !options.group->leader())
    return Status::InvalidArgument("only a DP unit's leader runs an engine (followers run RankGroup::FollowerLoop)");
  PDSERVE_ASSIGN_OR_RETURN(std::unique_ptr<BlockPool> bp, MakePool(options, *model));
  PDSERVE_RETURN_IF_ERROR(AttachDiskTier(Effective(options), *model, bp.get()));
  return std::unique_ptr<Engine>(new Engine(Effective(options), model, nullptr, nullptr, std::move(bp)));
}

Engine::Engine(const EngineOptions& options, const model::Model* model, std::unique_ptr<model::Model> owned,
               std::unique_ptr<ThreadPool> owned_pool, std::unique_ptr<BlockPool> pool)
    : options_(options),
      owned_pool_(std::move(owned_pool)),
      owned_model_(std::move(owned)),
      model_(model),
      pool_(std::move(pool)),
      scheduler_(options.scheduler, pool_.get(), PrefixPolicyFor(options, *model, *pool_)),
      seed_rng_(options.seed ? options.seed : std::random_device{}()) {
  max_len_ = std::min(model_->config().max_position_embeddings, pool_->capacity_tokens());
  GetLogger("engine")->info(
      "engine: {} blocks of {} tokens ({} MiB, {}), max sequence {} tokens, chunk {}, budget {}, prefix cache {}",
      pool_->n_blocks(), pool_->layout().tokens_per_block, pool_->size_bytes() >> 20, pool_->layout().ToString(),
      max_len_, options.scheduler.prefill_chunk, options.scheduler.max_step_tokens,
      prefix_cache_enabled() ? fmt::format("on (namespace {:016x})", prefix_cache_namespace()) : std::string("off"));
}

Engine::~Engine() {
  Stop();
  // Whatever is still in flight ends with an abort event.
  std::vector<TokenEvent> events;
  ApplyInbox(&events);
  // (Finish erases from requests_: iterate over a copy of the ids.)
  std::vector<RequestId> ids;
  for (const auto& [id, r] : requests_) ids.push_back(id);
  for (RequestId id : ids) {
    TokenEvent ev;
    ev.id = id;
    Finish(requests_.at(id).get(), FinishReason::kAbort, &ev);
    events.push_back(std::move(ev));
  }
  requests_.clear();
  Deliver(events);
}

Result<std::unique_ptr<Request>> Engine::NewRequest(std::vector<int32_t> prompt, RequestOptions o) {
  const model::ModelConfig& c = model_->config();
  if (prompt.empty()) return Status::InvalidArgument("empty prompt");
  for (size_t i = 0; i < prompt.size(); ++i)
    if (prompt[i] < 0 || prompt[i] >= c.vocab_size)
      return Status::InvalidArgument("prompt token " + std::to_string(prompt[i]) + " at position " + std::to_string(i) +
                                     " outside the vocabulary [0, " + std::to_string(c.vocab_size) + ")");
  const int64_t n = static_cast<int64_t>(prompt.size());
  if (n >= c.max_position_embeddings)
    return Status::InvalidArgument("prompt of " + std::to_string(n) + " tokens leaves no room in the model context of " +
                                   std::to_string(c.max_position_embeddings) + " tokens");
  if (n >= pool_->capacity_tokens())
    return Status::InvalidArgument("prompt of " + std::to_string(n) + " tokens does not fit the KV cache (" +
                                   std::to_string(pool_->capacity_tokens()) + " tokens)");
  PDSERVE_RETURN_IF_ERROR(o.sampling.Validate(c.vocab_size));
  if (!o.sampling.stop.empty() && !options_.detokenize)
    return Status::InvalidArgument("stop strings need a tokenizer (none configured)");
  const int64_t resumed = o.sampling.resumed_output;
  if (resumed >= n)
    return Status::InvalidArgument("resumed_output " + std::to_string(resumed) + " must be below the prompt length " +
                                   std::to_string(n));
  if (o.kv_export.enabled() && (!o.hold_kv || o.sampling.max_tokens != 1))
    return Status::InvalidArgument("KV export needs hold_kv and max_tokens 1");
  auto r = std::make_unique<Request>();
  if (o.constraint.active()) {
    PDSERVE_ASSIGN_OR_RETURN(grammar::GrammarMatcher m, NewMatcher(o.constraint, prompt, resumed));
    r->matcher.emplace(std::move(m));
    r->export_constraint_state = o.constraint.export_state;
  }
  // A resumed request's earlier output is output again: its positions are recomputed as output
  // rows (as after a preemption) and count for the penalties and the sampling index.
  r->prompt_len = n - resumed;
  r->penalties.SetPrompt(std::vector<int32_t>(prompt.begin(), prompt.begin() + r->prompt_len));
  for (int64_t i = r->prompt_len; i < n; ++i) r->penalties.AddOutput(prompt[static_cast<size_t>(i)]);
  r->tokens = std::move(prompt);
  r->tokens.reserve(static_cast<size_t>(std::min<int64_t>(n + o.sampling.max_tokens, max_len_)));
  r->params = std::move(o.sampling);
  r->params.max_tokens += static_cast<int32_t>(resumed);  // the engine's limit counts all output
  r->on_event = std::move(o.on_event);
  r->hold_kv = o.hold_kv;
  r->kv_export = std::move(o.kv_export);
  r->max_len = max_len_;
  r->added_at = Clock::now();
  r->queued_at = r->added_at;
  std::lock_guard<std::mutex> lock(mu_);
  r->seed = r->params.seed ? *r->params.seed : seed_rng_();
  r->id = next_id_++;
  return r;
}

Result<grammar::GrammarMatcher> Engine::NewMatcher(const RequestConstraint& c, const std::vector<int32_t>& prompt,
                                                   int64_t resumed) const {
  const int64_t V = model_->config().vocab_size;
  std::shared_ptr<const grammar::CompiledGrammar> g = c.compiled;
  if (!g) {
    if (!options_.grammars)
      return Status::InvalidArgument("constraint: this engine has no grammar cache (EngineOptions::grammars); "
                                     "pass a compiled grammar");
    // Compiles here, on the caller's thread: the step thread never waits for a new schema.
    PDSERVE_ASSIGN_OR_RETURN(g, options_.grammars->Get(c.spec));
  }
  if (g->vocabulary().size() != V)
    return Status::InvalidArgument("constraint: the grammar is compiled over a vocabulary of " +
                                   std::to_string(g->vocabulary().size()) + " ids; the model has " + std::to_string(V));
  std::optional<grammar::GrammarMatcher> m;
  if (!c.state.empty()) {
    Result<grammar::GrammarMatcher> restored = grammar::GrammarMatcher::Deserialize(g, c.state);
    if (!restored.ok()) return Status::InvalidArgument("constraint state: " + restored.status().message());
    if (restored.value().n_tokens() != resumed)
      return Status::InvalidArgument("constraint state: it follows " + std::to_string(restored.value().n_tokens()) +
                                     " output tokens; the request resumes " + std::to_string(resumed));
    m.emplace(std::move(restored).value());
  } else {
    m.emplace(g);
    const std::span<const int32_t> earlier(prompt.data() + (prompt.size() - static_cast<size_t>(resumed)),
                                           static_cast<size_t>(resumed));
    if (Status st = m->AcceptTokens(earlier); !st.ok())
      return Status::InvalidArgument("constraint: the resumed output does not follow the grammar: " + st.message());
  }
  if (m->IsTerminated()) return Status::InvalidArgument("constraint: the resumed output already completes the grammar");
  // The first mask computes the token sets of the start node: do it here, off the step thread.
  std::vector<uint32_t> mask(static_cast<size_t>(g->vocabulary().mask_words()));
  if (!m->FillNextTokenBitmask(mask.data()))
    return Status::InvalidArgument("constraint: no token may follow the resumed output (nesting too deep)");
  return std::move(*m);
}

Result<RequestId> Engine::AddRequest(std::vector<int32_t> prompt, RequestOptions options) {
  PDSERVE_ASSIGN_OR_RETURN(std::unique_ptr<Request> r, NewRequest(std::move(prompt), std::move(options)));
  const RequestId id = r->id;
  {
    std::lock_guard<std::mutex> lock(mu_);
    live_.insert(id);
    inbox_adds_.push_back(std::move(r));
  }
  cv_.notify_all();
  return id;
}

Result<KvImport> Engine::ReserveImport(std::vector<int32_t> prompt, RequestOptions options) {
  if (options.kv_export.enabled()) return Status::InvalidArgument("an imported request cannot export its KV");
  const uint64_t origin = options.imported_kv_namespace;
  PDSERVE_ASSIGN_OR_RETURN(std::unique_ptr<Request> r, NewRequest(std::move(prompt), std::move(options)));
  PDSERVE_RETURN_IF_ERROR(r->blocks.EnsureCapacity(pool_.get(), r->n_tokens()));  // every imported position
  r->state = RequestState::kAwaitingKv;
  // Imported KV joins the cache only when it was made exactly as this engine would make it.
  r->cache_kv = origin != 0 && origin == prefix_cache_namespace();
  KvImport out{r->id, r->blocks.ids()};
  {
    std::lock_guard<std::mutex> lock(mu_);
    live_.insert(r->id);
    inbox_adds_.push_back(std::move(r));
  }
  cv_.notify_all();
  return out;
}

Status Engine::CommitImport(RequestId id, int32_t first_token, std::string constraint_state) {
  if (first_token < 0 || first_token >= model_->config().vocab_size)
    return Status::InvalidArgument("first token " + std::to_string(first_token) + " outside the vocabulary");
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!live_.count(id)) return Status::NotFound("no request " + std::to_string(id));
    inbox_commits_.push_back({id, first_token, std::move(constraint_state)});
  }
  cv_.notify_all();
  return Status::Ok();
}

Status Engine::Abort(RequestId id) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!live_.count(id)) return Status::NotFound("no live request " + std::to_string(id));
    inbox_aborts_.push_back(id);
  }
  cv_.notify_all();
  return Status::Ok();
}

Result<std::vector<int32_t>> Engine::HeldBlocks(RequestId id) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = held_.find(id);
  if (it == held_.end()) return Status::NotFound("request " + std::to_string(id) + " holds no KV blocks");
  return it->second;
}

Status Engine::ReleaseKv(RequestId id) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = held_.find(id);
    if (it == held_.end()) return Status::NotFound("request " + std::to_string(id) + " holds no KV blocks");
    pool_->Free(it->second);
    held_.erase(it);
    kick_ = true;
  }
  cv_.notify_all();  // blocks came back: waiting requests may now fit
  return Status::Ok();
}

void Engine::Start() {
  if (loop_.joinable()) return;
  loop_ = std::jthread([this](std::stop_token st) { Loop(st); });
}

void Engine::Stop() {
  if (loop_.joinable()) {
    loop_.request_stop();
    cv_.notify_all();
    loop_.join();
  }
  // A group engine stepped by hand (or never started) still owes the group its stop votes.
  while (options_.group && !group_stopped_ && !options_.group->broken()) StepOnce(true);
}

void Engine::Loop(std::stop_token st) {
  if (options_.group) {
    // Step while the group lives: idle polls keep this rank voting (and taking the dummy
    // steps other units need); a stop request becomes this rank's stop vote.
    while (true) {
      const bool worked = StepOnce(st.stop_requested());
      if (group_stopped_ || options_.group->broken()) break;
      if (worked || st.stop_requested()) continue;
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait_for(lock, options_.group_idle_poll, [&] {
        return kick_ || !inbox_adds_.empty() || !inbox_aborts_.empty() || !inbox_commits_.empty();
      });
      kick_ = false;
    }
    return;
  }
  while (!st.stop_requested()) {
    if (Step()) continue;
    // Nothing ran: sleep until the inbox changes (new work, an abort, a commit, freed blocks).
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, st, [&] {
      return kick_ || !inbox_adds_.empty() || !inbox_aborts_.empty() || !inbox_commits_.empty();
    });
    kick_ = false;
  }
}

double Engine::CurrentStepSeconds() const {
  const int64_t started = step_started_ns_.load(std::memory_order_relaxed);
  if (started == 0) return 0;
  const int64_t now = std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch()).count();
  return static_cast<double>(now - started) * 1e-9;
}

Status Engine::failure() const {
  std::lock_guard<std::mutex> lock(mu_);
  return failure_;
}

bool Engine::Idle() const {
  std::lock_guard<std::mutex> lock(mu_);
  return !has_work_ && inbox_adds_.empty() && inbox_commits_.empty() && inbox_aborts_.empty() && live_.empty();
}

int64_t Engine::ClearPrefixCache() { return pool_->EvictIdle(); }

std::vector<int32_t> Engine::MatchCachedBlocks(std::span<const int32_t> tokens, int64_t max_blocks) {
  const PrefixCachePolicy& policy = scheduler_.prefix_policy();
  if (!policy.enabled) return {};
  const int64_t B = pool_->layout().tokens_per_block;
  max_blocks = std::min<int64_t>(max_blocks, static_cast<int64_t>(tokens.size()) / B);
  if (max_blocks <= 0) return {};
  std::vector<uint64_t> hashes;
  ExtendChain(policy.ns, tokens, B, max_blocks, &hashes);
  std::vector<CachedBlockId> hit;
  pool_->MatchPrefix(PrefixCache::Root(policy.ns), hashes, tokens, max_blocks, &hit);
  std::vector<int32_t> ids;
  ids.reserve(hit.size());
  for (const CachedBlockId& h : hit) ids.push_back(h.block);
  return ids;
}

std::vector<int32_t> Engine::PinCachedPrefix(std::span<const int32_t> tokens, int64_t max_blocks) {
  std::vector<int32_t> ids = MatchCachedBlocks(tokens, max_blocks);
  std::lock_guard<std::mutex> lock(mu_);
  stats_.prefix_pushed_tokens += static_cast<int64_t>(ids.size()) * pool_->layout().tokens_per_block;
  return ids;
}

void Engine::UnpinBlocks(std::span<const int32_t> ids) { pool_->Free(ids); }

int64_t Engine::CachedPrefixBlocks(std::span<const int32_t> tokens, int64_t max_blocks) {
  const std::vector<int32_t> ids = MatchCachedBlocks(tokens, max_blocks);
  pool_->Free(ids);
  return static_cast<int64_t>(ids.size());
}

Result<std::vector<int32_t>> Engine::AllocatePullBlocks(int64_t count) {
  if (!accepts_pulls()) return Status::FailedPrecondition("the prefix cache is off: no pulled blocks");
  std::vector<int32_t> ids;
  PDSERVE_RETURN_IF_ERROR(pool_->Allocate(count, &ids));
  return ids;
}

int64_t Engine::AdoptPulledBlocks(std::span<const int32_t> tokens, int64_t first_block,
                                  std::span<const int32_t> blocks) {
  const PrefixCachePolicy& policy = scheduler_.prefix_policy();
  const int64_t B = pool_->layout().tokens_per_block;
  const int64_t end_block = first_block + static_cast<int64_t>(blocks.size());
  int64_t adopted = 0;
  if (options_.group && options_.group->unit_size() > 1) {
    // Queued before any of them joins the cache: a step that maps one (scheduled after this)
    // finds it queued when RunForward sends the queue to the followers, ahead of the forward.
    std::lock_guard<std::mutex> lock(mu_);
    pulled_for_followers_.insert(pulled_for_followers_.end(), blocks.begin(), blocks.end());
  }
  if (policy.enabled && first_block >= 0 && end_block * B <= static_cast<int64_t>(tokens.size())) {
    std::vector<uint64_t> hashes;
    ExtendChain(policy.ns, tokens, B, end_block, &hashes);
    // The parent of the first pulled block is this cache's own block first_block - 1: pin the
    // local prefix so it stays the same content while the pulled blocks chain onto it.
    std::vector<CachedBlockId> local;
    if (first_block > 0)
      pool_->MatchPrefix(PrefixCache::Root(policy.ns), hashes, tokens, first_block, &local);
    if (static_cast<int64_t>(local.size()) == first_block) {
      CachedBlockId parent = first_block == 0 ? PrefixCache::Root(policy.ns) : local.back();
      for (int64_t j = first_block; j < end_block; ++j) {
        const std::optional<CachedBlockId> id =
            pool_->Register(blocks[static_cast<size_t>(j - first_block)], hashes[static_cast<size_t>(j)], parent,
                            tokens.subspan(static_cast<size_t>(j * B), static_cast<size_t>(B)));
        if (!id) break;  // the name belongs to other content: nothing after it can chain
        parent = *id;
        adopted += B;
      }
    }
    std::vector<int32_t> local_ids;
    for (const CachedBlockId& h : local) local_ids.push_back(h.block);
    pool_->Free(local_ids);
  }
  // Registered blocks become idle cached blocks; the others (and blocks whose content another
  // request registered first) go back to the free list.
  pool_->Free(blocks);
  std::lock_guard<std::mutex> lock(mu_);
  stats_.prefix_pulled_tokens += adopted;
  return adopted;
}

EngineStats Engine::Stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  EngineStats s = stats_;
  s.blocks_total = pool_->n_blocks();
  s.blocks_free = pool_->n_free();
  s.prefix_cached_blocks = pool_->n_cached();
  s.prefix_idle_blocks = pool_->n_cached_idle();
  s.prefix_evictions = pool_->evictions();
  const DiskTierStats tier = pool_->disk_tier_stats();
  s.prefix_tier_blocks = tier.blocks;
  s.prefix_tier_bytes = tier.bytes;
  s.prefix_tier_stored_blocks = tier.stored_blocks;
  s.prefix_tier_stored_bytes = tier.stored_bytes;
  s.prefix_tier_restored_tokens = tier.restored_blocks * pool_->layout().tokens_per_block;
  s.prefix_tier_evictions = tier.evictions;
  s.prefix_tier_corrupt_files = tier.corrupt;
  s.prefix_tier_write_errors = tier.write_errors;
  s.blocks_used = s.blocks_total - s.blocks_free;
  s.blocks_held = 0;
  for (const auto& [id, ids] : held_) s.blocks_held += static_cast<int64_t>(ids.size());
  for (const auto& r : inbox_adds_) {
    if (r->state != RequestState::kAwaitingKv) ++s.waiting;
    s.queued_tokens += QueuedTokens(*r);
  }
  return s;
}

}  // namespace pdserve::engine
