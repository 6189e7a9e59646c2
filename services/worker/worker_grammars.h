// WorkerGrammars: a worker's structured-output compiler (docs/structured-output.md). It turns
// the constraint a job carries (grammar::Constraint, checked by the router already) into a
// grammar compiled over this model's vocabulary, which the engine then applies per step.
//
// The vocabulary (every token id's bytes, from the tokenizer the router also uses) is built on
// the first constrained job, not at start-up: it costs about a second of CPU, which workers
// that never see a constrained request (and the many short-lived test clusters) never pay. The
// agent calls Compile first from its preparer thread (WorkerHandler::PrepareJob), never from
// the thread that sends its heartbeats.
// Compiled grammars are cached by constraint (grammar::GrammarCache), so a schema repeated by
// many requests compiles once.
//
// Thread-safety: thread-safe; the first call builds the vocabulary under a lock (other callers
// wait); compiles run on the calling thread.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>

#include "common/status.h"
#include "grammar/constraint.h"

namespace pdserve::services::worker {

class WorkerGrammars {
 public:
  // `tokenizer_dir`: tokenizer.json + tokenizer_config.json (empty: the bundled DeepSeek-V3
  // tokenizer, as the router's default); `model_vocab_size`: the model's logit rows.
  WorkerGrammars(std::string tokenizer_dir, int64_t model_vocab_size);

  // The grammar for `constraint` (active). Errors: InvalidArgument when it does not compile
  // (the client's error); FailedPrecondition when this worker cannot build a vocabulary (the
  // tokenizer is missing or has more ids than the model): structured output is unavailable
  // here, said with the reason on every such job.
  Result<std::shared_ptr<const grammar::CompiledGrammar>> Compile(const grammar::Constraint& constraint);

  // Cache counters (0 before the first constrained job).
  int64_t hits() const;
  int64_t misses() const;

 private:
  Status EnsureCacheLocked();

  const std::string tokenizer_dir_;
  const int64_t model_vocab_size_;

  mutable std::mutex mu_;
  bool tried_ = false;                          // guarded by mu_
  Status unavailable_;                          // guarded by mu_: why there is no cache
  std::unique_ptr<grammar::GrammarCache> cache_;  // set once under mu_, then thread-safe itself
};

}  // namespace pdserve::services::worker
