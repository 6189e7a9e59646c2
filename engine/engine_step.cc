// Engine::Step and what it needs: applying the inbox, building the batch, sampling, stop
// checks, finishing requests and delivering events.
#include <algorithm>
#include <chrono>
#include <cstring>
#include <utility>

#include "common/logging.h"
#include "engine/engine.h"
#include "grammar/bitmask.h"
#include "model/profile_ops.h"

namespace pdserve::engine {

namespace {
using Clock = std::chrono::steady_clock;
double Seconds(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double>(b - a).count(); }
}  // namespace

void Engine::ApplyInbox(std::vector<TokenEvent>* events) {
  std::vector<std::unique_ptr<Request>> adds;
  std::vector<RequestId> aborts;
  std::vector<InboxCommit> commits;
  {
    std::lock_guard<std::mutex> lock(mu_);
    adds.swap(inbox_adds_);
    aborts.swap(inbox_aborts_);
    commits.swap(inbox_commits_);
  }
  for (auto& r : adds) {
    const RequestId id = r->id;
    callbacks_[id] = std::move(r->on_event);
    r->arrival = next_arrival_++;
    if (r->state != RequestState::kAwaitingKv) scheduler_.AddWaiting(r.get());
    requests_[id] = std::move(r);
  }
  for (InboxCommit& commit : commits) {
    const RequestId id = commit.id;
    const int32_t token = commit.token;
    auto it = requests_.find(id);
    if (it == requests_.end() || it->second->state != RequestState::kAwaitingKv) {
      GetLogger("engine")->warn("commit of request {} ignored: not awaiting KV", id);
      continue;
    }
    Request* r = it->second.get();
    r->num_computed = r->n_tokens();  // the imported KV (a resumed request's earlier output too)
    scheduler_.RegisterComputed(r);   // (only KV of a known, equal origin: Request::cache_kv)
    // The unit's followers need the imported KV too: it goes out with this step.
    if (options_.group && options_.group->unit_size() > 1)
      imported_.insert(imported_.end(), r->blocks.ids().begin(), r->blocks.ids().end());
    r->queued_at = Clock::now();  // its decode queues from here
    scheduler_.AddRunning(r);
    SampleResult s;
    s.token = token;
    bool advance = true;
    if (r->matcher && !commit.constraint_state.empty()) {
      // The prefill side's state after the first token replaces this side's (which is at the
      // end of the resumed output): it must follow exactly one more token.
      Result<grammar::GrammarMatcher> m =
          grammar::GrammarMatcher::Deserialize(r->matcher->grammar_ptr(), commit.constraint_state);
      Status st = m.ok() ? Status::Ok() : m.status();
      if (st.ok() && m.value().n_tokens() != r->matcher->n_tokens() + 1)
        st = Status::InvalidArgument("it follows " + std::to_string(m.value().n_tokens()) +
                                     " output tokens; the request has " + std::to_string(r->matcher->n_tokens() + 1));
      if (!st.ok()) {
        TokenEvent ev;
        ev.id = id;
        ev.error = Status(st.code(), "constraint state of the imported request: " + st.message());
        Finish(r, FinishReason::kError, &ev);
        events->push_back(std::move(ev));
        continue;
      }
      *r->matcher = std::move(m).value();
      advance = false;
    }
    events->push_back(Emit(r, s, advance));
  }
  for (RequestId id : aborts) {
    auto it = requests_.find(id);
    if (it == requests_.end()) continue;  // finished meanwhile: its last event is already out
    TokenEvent ev;
    ev.id = id;
    Finish(it->second.get(), FinishReason::kAbort, &ev);
    events->push_back(std::move(ev));
  }
}

TokenEvent Engine::Emit(Request* r, const SampleResult& s, bool advance) {
  TokenEvent ev;
  ev.id = r->id;
  if (r->matcher && advance) {
    // Sampled under the mask, a token always fits; an imported first token may not.
    const auto t = Clock::now();
    Status st = r->matcher->AcceptToken(s.token);
    advance_seconds_ += Seconds(t, Clock::now());
    if (!st.ok()) {
      ev.error = Status(st.code(), "constraint: " + st.message());
      Finish(r, FinishReason::kError, &ev);
      return ev;
    }
  }
  ev.token = s.token;
  ev.index = r->n_output();
  ev.logprob = s.logprob;
  ev.top_logprobs = s.top_logprobs;
  TakeQueueTime(r, &ev);
  r->tokens.push_back(s.token);
  r->penalties.AddOutput(s.token);
  const SamplingParams& p = r->params;
  FinishReason reason = FinishReason::kNone;
  if (r->matcher && r->matcher->IsTerminated()) {
    reason = FinishReason::kStop;  // the grammar is complete (its stop token was sampled)
  } else if (std::find(p.stop_token_ids.begin(), p.stop_token_ids.end(), s.token) != p.stop_token_ids.end()) {
    reason = FinishReason::kStop;
  } else if (!p.stop.empty()) {
    // Decode a window of the last tokens (each token is at least one byte of text, so the
    // window covers the longest stop string) and look for a match that uses the new token.
    size_t longest = 0;
    for (const std::string& st : p.stop) longest = std::max(longest, st.size());
    const int64_t w = std::min<int64_t>(r->n_output(), static_cast<int64_t>(longest) + 1);
    std::vector<int32_t> window(r->tokens.end() - w, r->tokens.end());
    const std::string now = options_.detokenize(window);
    window.pop_back();
    const std::string before = window.empty() ? std::string() : options_.detokenize(window);
    for (const std::string& st : p.stop) {
      const size_t from = before.size() >= st.size() ? before.size() - st.size() + 1 : 0;
      if (now.find(st, from) != std::string::npos) {
        reason = FinishReason::kStop;
        ev.stop_string = st;
        break;
      }
    }
  }
  if (reason == FinishReason::kNone && (r->n_output() >= p.max_tokens || r->n_tokens() >= r->max_len))
    reason = FinishReason::kLength;
  if (reason != FinishReason::kNone) Finish(r, reason, &ev);
  return ev;
}

void Engine::TakeQueueTime(Request* r, TokenEvent* ev) {
  if (r->pending_queue_seconds < 0) return;
  ev->queue_seconds = r->pending_queue_seconds;
  r->pending_queue_seconds = -1;
}

void Engine::Finish(Request* r, FinishReason reason, TokenEvent* ev) {
  const RequestId id = r->id;
  ev->finished = true;
  ev->reason = reason;
  ev->prompt_tokens = r->prompt_len;
  ev->output_tokens = r->n_output();
  ev->cached_prompt_tokens = r->cached_prompt_tokens;
  if (r->matcher && r->export_constraint_state) ev->constraint_state = r->matcher->Serialize();
  TakeQueueTime(r, ev);
  // An exported request keeps its blocks however it ends: the exporter may still read them.
  const bool keep =
      r->hold_kv && (reason == FinishReason::kStop || reason == FinishReason::kLength || r->kv_export_begun);
  if (r->state == RequestState::kAwaitingKv) {
    r->blocks.Release(pool_.get());
  } else {
    scheduler_.Remove(r, keep);
  }
  r->state = RequestState::kFinished;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (keep) held_[id] = r->blocks.ids();
    live_.erase(id);
    ++stats_.finished;
    if (reason == FinishReason::kAbort) ++stats_.aborted;
  }
  requests_.erase(id);  // destroys *r
}

void Engine::Deliver(std::vector<TokenEvent>& events) {
  for (const TokenEvent& ev : events) {
    auto it = callbacks_.find(ev.id);
    if (it == callbacks_.end()) continue;
    if (it->second) it->second(ev);
    if (ev.finished) callbacks_.erase(it);
  }
}

int64_t Engine::MaskConstrainedRows(std::vector<Request*>* to_sample, std::vector<TokenEvent>* events) {
  constrained_.clear();
  for (size_t k = 0; k < to_sample->size(); ++k)
    if ((*to_sample)[k]->matcher) constrained_.push_back(static_cast<int32_t>(k));
  if (constrained_.empty()) return 0;
  const int64_t V = model_->config().vocab_size;
  const int64_t words = grammar::MaskWords(V);
  masks_.resize(static_cast<size_t>(words) * constrained_.size());
  mask_ok_.assign(constrained_.size(), 1);
  // Each constrained row: its matcher's mask (a copy of a cached token set, or computed once
  // per new grammar state), applied to its logits row. Unconstrained rows are not touched.
  model_->pool()->ParallelFor(static_cast<int64_t>(constrained_.size()), [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      const int32_t k = constrained_[static_cast<size_t>(i)];
      uint32_t* mask = &masks_[static_cast<size_t>(i * words)];
      if (!(*to_sample)[static_cast<size_t>(k)]->matcher->FillNextTokenBitmask(mask)) {
        mask_ok_[static_cast<size_t>(i)] = 0;
        continue;
      }
      grammar::ApplyTokenBitmask(&logits_[static_cast<size_t>(k * V)], V, mask);
    }
  }, 4);
  for (size_t i = 0; i < constrained_.size(); ++i) {
    if (mask_ok_[i]) continue;
    Request*& r = (*to_sample)[static_cast<size_t>(constrained_[i])];
    // A compiled grammar has no dead ends: only a text nested beyond the matcher's depth bound
    // (CompileOptions::max_stack_depth) leaves nothing to sample.
    TokenEvent ev;
    ev.id = r->id;
    ev.error = Status::ResourceExhausted("constraint: the output would nest deeper than the grammar's stack bound");
    Finish(r, FinishReason::kError, &ev);
    events->push_back(std::move(ev));
    r = nullptr;
  }
  return static_cast<int64_t>(constrained_.size());
}

bool Engine::Step() { return StepOnce(false); }

Status Engine::RunForward(const std::vector<ScheduledChunk>& chunks, std::span<const model::BatchSequence> batch,
                          bool stopping, model::BatchStats* stats, const model::LayerKvDone& on_layer) {
  if (!options_.group) return batch.empty() ? Status::Ok() : model_->ForwardBatch(batch, stats, on_layer);
  std::vector<GroupSequence>& seqs = group_seqs_;
  seqs.clear();
  for (size_t i = 0; i < chunks.size(); ++i) {
    const ScheduledChunk& c = chunks[i];
    seqs.push_back({{batch[i].tokens, static_cast<size_t>(c.n)}, c.start, c.grouping,
                    {c.request->blocks.ids().data(), c.request->blocks.ids().size()}, batch[i].logits});
  }
  {
    // Pulled blocks adopted up to now: any this step maps is among them (AdoptPulledBlocks
    // queues a block before it joins the cache), so its bytes reach the followers first.
    std::lock_guard<std::mutex> lock(mu_);
    imported_.insert(imported_.end(), pulled_for_followers_.begin(), pulled_for_followers_.end());
    pulled_for_followers_.clear();
  }
  // The same for blocks the disk tier restored (recorded before they join the cache).
  for (int32_t b : pool_->TakeRestoredBlocks()) imported_.push_back(b);
  Result<GroupStepResult> r = options_.group->LeaderStep(seqs, imported_, *pool_, stopping, stats, on_layer);
  imported_.clear();
  if (!r.ok()) {
    if (options_.group->broken()) {
      GetLogger("engine")->error("the rank group broke: {}", r.status().ToString());
      std::lock_guard<std::mutex> lock(mu_);
      failure_ = r.status();
    }
    return r.status();
  }
  group_stopped_ = group_stopped_ || r.value().stop;
  return Status::Ok();
}

// One step, in named phases: take the inbox and schedule; lay out the batch; start the KV
// exports whose prompts complete in it; run the forward; sample and emit (or fail the step's
// requests); deliver the events; publish the stats.
bool Engine::StepOnce(bool stopping) {
  const auto t0 = Clock::now();
  advance_seconds_ = 0;
  step_started_ns_.store(std::chrono::duration_cast<std::chrono::nanoseconds>(t0.time_since_epoch()).count(),
                         std::memory_order_relaxed);
  OpProfileStep profile_step(options_.profile, model::kPhaseDecode);
  OpScope op_scope(model::kOpEngine);
  std::vector<TokenEvent> events;
  SchedulerOutput out;
  if (!stopping) {
    ApplyInbox(&events);
    out = scheduler_.Schedule();
  }
  NoteScheduled(out, t0);
  const StepBatch batch = LayOutBatch(out.chunks);
  const model::LayerKvDone on_layer = BeginKvExports(out.chunks);
  if (batch.sequences.empty()) profile_step.discard();
  profile_step.set_phase(batch.prompt_rows > 0 ? model::kPhasePrefill : model::kPhaseDecode);
  op_scope.Switch(model::kOpOther);
  const auto t1 = Clock::now();
  model::BatchStats bstats;
  const Status st = RunForward(out.chunks, batch.sequences, stopping, &bstats, on_layer);
  const auto t2 = Clock::now();
  const auto n_exports = static_cast<int64_t>(exporting_.size());
  exporting_.clear();  // (its requests may finish below)
  ConstraintStep constrained;
  if (st.ok()) {
    scheduler_.Commit(out);
    op_scope.Switch(model::kOpSampling);
    constrained = SampleAndEmit(out.chunks, &events);
  } else {
    FailChunks(out.chunks, st, &events);
  }
  op_scope.Switch(model::kOpEngine);
  const auto t3 = Clock::now();
  Deliver(events);
  const auto t4 = Clock::now();
  StepTimes times{Seconds(t0, t1), Seconds(t1, t2), Seconds(t2, t3), Seconds(t3, t4)};
  PublishStepStats(batch, bstats, n_exports, times, constrained);
  step_started_ns_.store(0, std::memory_order_relaxed);
  return !batch.sequences.empty() || !events.empty();
}

void Engine::NoteScheduled(const SchedulerOutput& out, Clock::time_point now) {
  for (const Request* r : out.preempted)
    GetLogger("engine")->debug("preempted request {} ({} tokens, {} preemptions so far): KV freed, will recompute", r->id,
                               r->n_tokens(), r->preemptions);
  for (const ScheduledChunk& c : out.chunks) {
    Request* r = c.request;
    if (r->scheduled_once) continue;
    r->scheduled_once = true;
    r->pending_queue_seconds = std::max(0.0, Seconds(r->queued_at, now));
  }
}

Engine::StepBatch Engine::LayOutBatch(const std::vector<ScheduledChunk>& chunks) {
  const int64_t V = model_->config().vocab_size;
  StepBatch b;
  b.sequences.reserve(chunks.size());
  for (const ScheduledChunk& c : chunks) b.n_sample += c.sample;
  logits_.resize(static_cast<size_t>(b.n_sample * V));
  for (int64_t k = 0; const ScheduledChunk& c : chunks) {
    Request* r = c.request;
    b.sequences.push_back({&r->tokens[static_cast<size_t>(c.start)], c.n, c.start, r->blocks.Ref(*pool_), c.grouping,
                           c.sample ? &logits_[static_cast<size_t>(k++ * V)] : nullptr, nullptr});
    (c.start < r->prompt_len ? b.prompt_rows : b.output_rows) += c.n;
  }
  return b;
}

model::LayerKvDone Engine::BeginKvExports(const std::vector<ScheduledChunk>& chunks) {
  // The requests whose prompt ends in this step (so every layer of their KV is final within
  // this forward) learn their blocks now and each layer as it completes.
  exporting_.clear();
  for (const ScheduledChunk& c : chunks) {
    Request* r = c.request;
    // The chunk that completes every position known at admission: the prompt and, for a
    // resumed (migrated) request, its earlier output, which is recomputed before sampling.
    if (!r->kv_export.enabled() || r->kv_export_begun || c.start + c.n != r->n_tokens()) continue;
    r->kv_export_begun = true;
    exporting_.push_back(r);
  }
  for (Request* r : exporting_)
    if (r->kv_export.begin) r->kv_export.begin(r->blocks.ids());
  if (exporting_.empty()) return {};
  return [this](int64_t layer) {
    for (Request* r : exporting_)
      if (r->kv_export.layer_done) r->kv_export.layer_done(layer);
    return options_.layer_fault_hook ? options_.layer_fault_hook(layer) : Status::Ok();
  };
}

std::vector<std::pair<Request*, int64_t>> Engine::AdoptTwins(const std::vector<ScheduledChunk>& chunks) {
  std::vector<std::pair<Request*, int64_t>> twins;
  const int64_t bb = pool_->block_bytes();
  for (int64_t k = 0; const ScheduledChunk& c : chunks) {
    if (!c.sample) continue;
    const int64_t row = k++;
    const Request* r = c.request;
    if (c.start + c.n != r->prompt_len || r->n_output() != 0) continue;  // not a prompt's last chunk
    for (Request* t : scheduler_.TakeTwins(*r)) {
      if (!t->blocks.EnsureCapacity(pool_.get(), r->prompt_len).ok()) {
        scheduler_.RequeueTwin(t);  // computes its prompt itself, when blocks free up
        continue;
      }
      // Whole blocks, every layer (the last one's slots past the prompt are never read before
      // they are written).
      for (int64_t b = 0; b < t->blocks.n_blocks(); ++b)
        std::memcpy(pool_->base() + t->blocks.ids()[static_cast<size_t>(b)] * bb,
                    pool_->base() + r->blocks.ids()[static_cast<size_t>(b)] * bb, static_cast<size_t>(bb));
      t->num_computed = r->prompt_len;
      scheduler_.AdmitTwin(t);
      if (!t->scheduled_once) {
        t->scheduled_once = true;
        t->pending_queue_seconds = std::max(0.0, Seconds(t->queued_at, Clock::now()));
      }
      twins.emplace_back(t, row);
    }
  }
  return twins;
}

Engine::ConstraintStep Engine::SampleAndEmit(const std::vector<ScheduledChunk>& chunks,
                                             std::vector<TokenEvent>* events) {
  const int64_t V = model_->config().vocab_size;
  // Twins first, while the requests whose KV they copy still hold it (one may finish below);
  // each samples from a copy of its twin's logits row (sampling works in place).
  const std::vector<std::pair<Request*, int64_t>> twins = AdoptTwins(chunks);
  std::vector<float> twin_logits(twins.size() * static_cast<size_t>(V));
  for (size_t i = 0; i < twins.size(); ++i)
    std::copy_n(&logits_[static_cast<size_t>(twins[i].second * V)], V, &twin_logits[i * static_cast<size_t>(V)]);
  // Sampling reads only its own logits row and request: rows run in parallel; appending
  // tokens, stop checks and finishing stay sequential.
  std::vector<Request*> to_sample;
  for (const ScheduledChunk& c : chunks)
    if (c.sample) to_sample.push_back(c.request);
  // Grammar masks on the constrained rows only (a row its grammar ended becomes nullptr).
  ConstraintStep constrained;
  const auto tm = Clock::now();
  constrained.rows = MaskConstrainedRows(&to_sample, events);
  if (constrained.rows > 0) constrained.seconds = Seconds(tm, Clock::now());
  // The twins sample after the rows, each from its copy of its twin's row, as if it had
  // computed the prompt itself (same logits, its own parameters, penalties and seed).
  std::vector<float*> row_logits(to_sample.size());
  for (size_t k = 0; k < to_sample.size(); ++k) row_logits[k] = &logits_[k * static_cast<size_t>(V)];
  for (size_t i = 0; i < twins.size(); ++i) {
    to_sample.push_back(twins[i].first);
    row_logits.push_back(&twin_logits[i * static_cast<size_t>(V)]);
  }
  std::vector<SampleResult> sampled(to_sample.size());
  model_->pool()->ParallelFor(static_cast<int64_t>(to_sample.size()), [&](int64_t b, int64_t e) {
    Sampler sampler;
    for (int64_t k = b; k < e; ++k) {
      const Request* r = to_sample[static_cast<size_t>(k)];
      if (!r) continue;  // ended by its grammar
      sampled[static_cast<size_t>(k)] =
          sampler.Sample(row_logits[static_cast<size_t>(k)], V, r->params, r->penalties, r->seed, r->n_output());
    }
  }, 4);
  for (size_t k = 0; k < to_sample.size(); ++k)
    if (to_sample[k]) events->push_back(Emit(to_sample[k], sampled[k]));
  constrained.twin_tokens = static_cast<int64_t>(twins.size());
  return constrained;
}

void Engine::FailChunks(const std::vector<ScheduledChunk>& chunks, const Status& why, std::vector<TokenEvent>* events) {
  GetLogger("engine")->error("forward failed: {}", why.ToString());
  for (const ScheduledChunk& c : chunks) {
    TokenEvent ev;
    ev.id = c.request->id;
    ev.error = why;
    Finish(c.request, FinishReason::kError, &ev);
    events->push_back(std::move(ev));
  }
}

void Engine::PublishStepStats(const StepBatch& batch, const model::BatchStats& bstats, int64_t n_exports,
                              const StepTimes& times, const ConstraintStep& constrained) {
  int64_t queued_tokens = 0;
  for (const auto& [id, r] : requests_) queued_tokens += QueuedTokens(*r);
  std::lock_guard<std::mutex> lock(mu_);
  stats_.queued_tokens = queued_tokens;
  stats_.kv_exports += n_exports;
  if (!batch.sequences.empty()) ++stats_.steps;
  stats_.preemptions = scheduler_.total_preemptions();
  stats_.running = scheduler_.n_running();
  stats_.waiting = scheduler_.n_waiting();
  stats_.awaiting_kv = static_cast<int64_t>(requests_.size()) - stats_.running - stats_.waiting;
  stats_.prompt_rows += batch.prompt_rows;
  stats_.output_rows += batch.output_rows;
  stats_.generated_tokens += batch.n_sample + constrained.twin_tokens;
  stats_.routed_expert_runs += bstats.routed_expert_runs;
  stats_.kv_bytes_read += bstats.kv_bytes_read;
  stats_.schedule_seconds += times.schedule;
  stats_.forward_seconds += times.forward;
  stats_.sample_seconds += times.sample;
  stats_.event_seconds += times.events;
  stats_.constrained_rows += constrained.rows;
  const PrefixCacheCounters& pc = scheduler_.prefix_counters();
  stats_.prefix_lookup_tokens = pc.lookup_tokens;
  stats_.prefix_hit_tokens = pc.hit_tokens;
  stats_.prefix_computed_tokens = pc.computed_tokens;
  stats_.constraint_seconds += constrained.seconds + advance_seconds_;
  has_work_ = !requests_.empty();
}

}  // namespace pdserve::engine
