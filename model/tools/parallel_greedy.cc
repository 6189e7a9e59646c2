#include "model/tools/parallel_greedy.h"

#include <chrono>
#include <memory>

#include "model/parallel.h"
#include "model/profile_ops.h"
#include "model/tools/greedy_run.h"

namespace pdserve::model {

namespace {

double Since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

}  // namespace

Result<GreedyRun> RunGreedyCp(const Model& model, const std::vector<int32_t>& prompt, int64_t max_new) {
  const ModelConfig& cfg = model.config();
  GreedyRun run;
  run.prompt = prompt;
  SequenceKvCache cache(cfg);
  std::vector<float> logits(static_cast<size_t>(cfg.vocab_size));
  const auto t0 = std::chrono::steady_clock::now();
  PDSERVE_RETURN_IF_ERROR(model.ForwardCp(prompt.data(), static_cast<int64_t>(prompt.size()), &cache, logits.data()));
  run.prefill_seconds = Since(t0);
  run.prefill_logits = logits;
  const auto t1 = std::chrono::steady_clock::now();
  for (int64_t step = 0; step < max_new; ++step) {
    run.step_logits.insert(run.step_logits.end(), logits.begin(), logits.end());
    const int32_t next = GreedyToken(logits);
    run.output.push_back(next);
    if (step + 1 == max_new) break;
    PDSERVE_RETURN_IF_ERROR(model.Forward(&next, 1, &cache, logits.data()));
  }
  run.decode_seconds = Since(t1);
  return run;
}

Result<std::vector<GreedyRun>> RunGreedyDp(const Model& model, comm::DpCoordinator* coordinator,
                                           const std::vector<std::vector<int32_t>>& prompts,
                                           const std::vector<int64_t>& max_new, DpRunStats* stats,
                                           const DpRunOptions& options) {
  if (prompts.size() != max_new.size()) return Status::InvalidArgument("RunGreedyDp: one max_new per prompt");
  const ModelConfig& cfg = model.config();
  const bool cp_prefill = model.parallel() && model.parallel()->plan().cp > 1;
  const size_t n = prompts.size();
  std::vector<GreedyRun> runs(n);
  std::vector<std::unique_ptr<SequenceKvCache>> caches(n);
  std::vector<std::vector<float>> logits(n, std::vector<float>(static_cast<size_t>(cfg.vocab_size)));
  std::vector<bool> prefilled(n, false);
  // Traces (options.trace): the prefill's into runs[i].prefill, each decode step's into
  // step_traces[i], whose selections are appended to runs[i].topk_decode.
  std::vector<ForwardTrace> step_traces(options.trace ? n : 0);
  std::vector<ForwardOptions> prefill_opts(options.trace ? n : 0), step_opts(options.trace ? n : 0);
  for (size_t i = 0; i < prefill_opts.size(); ++i) {
    prefill_opts[i].trace = &runs[i].prefill;
    step_opts[i].trace = &step_traces[i];
  }
  // Requests are checked before the first step: a forward that fails on one rank would leave
  // its EP peers waiting inside an exchange, whereas a failed vote stops every rank.
  Status bad;
  for (size_t i = 0; i < n && bad.ok(); ++i) {
    if (prompts[i].empty()) bad = Status::InvalidArgument("RunGreedyDp: empty prompt " + std::to_string(i));
    for (int32_t t : prompts[i])
      if (bad.ok() && (t < 0 || t >= cfg.vocab_size))
        bad = Status::InvalidArgument("prompt " + std::to_string(i) + ": token id " + std::to_string(t) +
                                      " outside the vocabulary [0, " + std::to_string(cfg.vocab_size) + ")");
    if (bad.ok() && static_cast<int64_t>(prompts[i].size()) + max_new[i] > cfg.max_position_embeddings)
      bad = Status::InvalidArgument("prompt " + std::to_string(i) + ": " + std::to_string(prompts[i].size()) + " + " +
                                    std::to_string(max_new[i]) + " tokens exceed max_position_embeddings " +
                                    std::to_string(cfg.max_position_embeddings));
    runs[i].prompt = prompts[i];
    caches[i] = std::make_unique<SequenceKvCache>(cfg, 64, options.kv.latent, options.kv.index);
  }
  if (!bad.ok()) {
    (void)coordinator->Sync({.stop = true, .failed = true});
    return bad;
  }
  auto done = [&](size_t i) { return static_cast<int64_t>(runs[i].output.size()) >= max_new[i]; };
  DpRunStats local;
  const auto t0 = std::chrono::steady_clock::now();
  std::chrono::steady_clock::time_point decode_start{};
  bool decoding = false;

  // This step's rows: every prefill at once (one prompt per step with CP), else a decode row
  // per live sequence.
  std::vector<size_t> members;
  std::vector<int32_t> next_tokens(n);
  auto plan_step = [&]() {
    members.clear();
    int64_t rows = 0;
    for (size_t i = 0; i < n; ++i) {
      if (done(i) || prefilled[i]) continue;
      members.push_back(i);
      rows += static_cast<int64_t>(prompts[i].size());
      if (cp_prefill) return rows;
    }
    if (!members.empty()) return rows;
    for (size_t i = 0; i < n; ++i)
      if (!done(i)) members.push_back(i);
    return static_cast<int64_t>(members.size());
  };
  auto sample = [&](size_t i) {
    runs[i].step_logits.insert(runs[i].step_logits.end(), logits[i].begin(), logits[i].end());
    if (!prefilled[i]) runs[i].prefill_logits = logits[i];
    prefilled[i] = true;
    next_tokens[i] = GreedyToken(logits[i]);
    runs[i].output.push_back(next_tokens[i]);
  };
  OpProfileStep* profile_step = nullptr;  // the open step's, while profiling
  auto forward = [&](const comm::DpDecision&) -> Status {
    OpScope op_scope(kOpOther);
    const bool prefill = !prefilled[members[0]];
    if (profile_step) profile_step->set_phase(prefill ? kPhasePrefill : kPhaseDecode);
    if (!prefill && !decoding) {
      decoding = true;
      decode_start = std::chrono::steady_clock::now();
    }
    if (prefill && cp_prefill) {
      const size_t i = members[0];
      PDSERVE_RETURN_IF_ERROR(model.ForwardCp(prompts[i].data(), static_cast<int64_t>(prompts[i].size()),
                                              caches[i].get(), logits[i].data(),
                                              options.trace ? &runs[i].prefill : nullptr));
    } else {
      std::vector<BatchSequence> seqs(members.size());
      for (size_t k = 0; k < members.size(); ++k) {
        const size_t i = members[k];
        BatchSequence& q = seqs[k];
        SequenceKvCache& cache = *caches[i];
        q.start = cache.n_tokens();
        if (prefill) {
          q.tokens = prompts[i].data();
          q.n_tokens = static_cast<int64_t>(prompts[i].size());
          q.grouping = RowGrouping::kChunk;
        } else {
          q.tokens = &next_tokens[i];
          q.n_tokens = 1;
          q.grouping = RowGrouping::kPerRow;
        }
        q.logits = logits[i].data();
        if (options.trace) q.options = prefill ? &prefill_opts[i] : &step_opts[i];
        cache.Resize(q.start + q.n_tokens);
        q.kv = cache.Ref();
      }
      PDSERVE_RETURN_IF_ERROR(model.ForwardBatch(seqs));
      if (options.trace && !prefill)
        for (size_t i : members)
          runs[i].topk_decode.insert(runs[i].topk_decode.end(), step_traces[i].topk.begin(), step_traces[i].topk.end());
    }
    op_scope.Switch(kOpSampling);
    for (size_t i : members) sample(i);
    ++local.forward_steps;
    return Status::Ok();
  };
  auto dummy = [&](const comm::DpDecision&) -> Status {
    OpScope op_scope(kOpOther);
    ++local.dummy_steps;
    return model.ForwardBatch({});
  };
  for (;;) {
    const int64_t rows = plan_step();
    bool all_done = true;
    for (size_t i = 0; i < n; ++i) all_done = all_done && done(i);
    OpProfileStep step_profile(options.profile, kPhaseDecode);
    profile_step = options.profile ? &step_profile : nullptr;
    OpScope vote_scope(kOpMpi);  // the coordinator's vote; the forward has its own scopes
    auto decision = coordinator->Step({.tokens = rows, .stop = all_done}, forward, dummy);
    profile_step = nullptr;
    if (!decision.ok()) {
      // Our own forward failed (not a peer's: kAborted): tell the others at one more Sync so
      // they leave too instead of waiting for our next vote.
      if (decision.status().code() != StatusCode::kAborted) (void)coordinator->Sync({.stop = true, .failed = true});
      return decision.status();
    }
    const comm::DpDecision& d = *decision;
    ++local.steps;
    if (decoding) ++local.decode_steps;
    if (d.stop) break;
  }
  local.seconds = Since(t0);
  if (decoding) local.decode_seconds = Since(decode_start);
  if (stats) *stats = local;
  return runs;
}

}  // namespace pdserve::model
