#include "services/worker/worker_grammars.h"

#include <chrono>
#include <utility>

#include <spdlog/spdlog.h>

#include "grammar/vocabulary.h"
#include "tokenizer/token_table.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/tokenizer_paths.h"

namespace pdserve::services::worker {

WorkerGrammars::WorkerGrammars(std::string tokenizer_dir, int64_t model_vocab_size)
    : tokenizer_dir_(std::move(tokenizer_dir)), model_vocab_size_(model_vocab_size) {}

Status WorkerGrammars::EnsureCacheLocked() {
  if (tried_) return unavailable_;
  tried_ = true;
  const auto t0 = std::chrono::steady_clock::now();
  const std::string dir = tokenizer_dir_.empty() ? tokenizer::DefaultTokenizerDir() : tokenizer_dir_;
  auto fail = [&](const Status& s) {
    unavailable_ = Status::FailedPrecondition("structured output is unavailable on this worker: " + s.ToString());
    spdlog::error("{}", unavailable_.message());
    return unavailable_;
  };
  auto tok = tokenizer::Tokenizer::Load(dir);
  if (!tok.ok()) return fail(tok.status());
  auto table = tokenizer::BuildTokenByteTable(**tok, model_vocab_size_);
  if (!table.ok()) return fail(table.status());
  auto vocab = grammar::Vocabulary::Create(std::move(table->bytes), std::move(table->is_text), table->stop_ids,
                                           table->vocab_size);
  if (!vocab.ok()) return fail(vocab.status());
  cache_ = std::make_unique<grammar::GrammarCache>(*vocab);
  spdlog::info("structured output: vocabulary of {} ids from {} built in {:.0f} ms", model_vocab_size_, dir,
               std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  return Status::Ok();
}

Result<std::shared_ptr<const grammar::CompiledGrammar>> WorkerGrammars::Compile(const grammar::Constraint& constraint) {
  grammar::GrammarCache* cache = nullptr;
  {
    std::lock_guard<std::mutex> lock(mu_);
    PDSERVE_RETURN_IF_ERROR(EnsureCacheLocked());
    cache = cache_.get();
  }
  return cache->Get(constraint);
}

int64_t WorkerGrammars::hits() const {
  std::lock_guard<std::mutex> lock(mu_);
  return cache_ ? cache_->hits() : 0;
}

int64_t WorkerGrammars::misses() const {
  std::lock_guard<std::mutex> lock(mu_);
  return cache_ ? cache_->misses() : 0;
}

}  // namespace pdserve::services::worker
