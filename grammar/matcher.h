// GrammarMatcher: one request's position in a compiled grammar. It advances token by token and
// gives the bitmask of the tokens allowed next (one bit per id of the model's vocabulary; a
// stop token's bit is set exactly when the text so far is complete).
//
//   auto m = GrammarMatcher(compiled);
//   while (!m.IsTerminated()) {
//     m.FillNextTokenBitmask(mask);              // Vocabulary::mask_words() words
//     ApplyTokenBitmask(logits, vocab, mask);    // bitmask.h
//     int32_t id = sample(logits);
//     PDSERVE_RETURN_IF_ERROR(m.AcceptToken(id));  // a stop id ends it (IsTerminated())
//   }
//
// Moving a request (prefill -> decode in P/D mode, migration to another worker): either
//   - replay: compile the same constraint on the receiving side and AcceptTokens(the output
//     token ids so far) - always valid, costs one token step per id (microseconds each); this is
//     the route the services use, since the output ids travel with the request anyway; or
//   - Serialize() / Deserialize(): the stack set as bytes (a few dozen for JSON), checked
//     against the compiled grammar's fingerprint (same constraint, same vocabulary, same
//     pdserve build).
// A generation stopped by max_tokens mid-text leaves IsTerminated() false: the caller reports
// finish_reason "length" (the text is a valid prefix, not a valid document).
//
// Thread-safety: not thread-safe; one matcher per request, used by one thread at a time (the
// engine loop). Matchers of one CompiledGrammar may run on different threads.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>

#include "common/status.h"
#include "common/thread_pool.h"
#include "grammar/compiled_grammar.h"
#include "grammar/stack_set.h"

namespace pdserve::grammar {

class GrammarMatcher {
 public:
  explicit GrammarMatcher(std::shared_ptr<const CompiledGrammar> grammar);
  GrammarMatcher(const GrammarMatcher& other);
  GrammarMatcher& operator=(const GrammarMatcher& other);
  GrammarMatcher(GrammarMatcher&&) noexcept = default;
  GrammarMatcher& operator=(GrammarMatcher&&) noexcept = default;

  // Advances by one token. A stop token is accepted only where the text may end, and then
  // terminates the matcher. Errors (the state is unchanged): InvalidArgument when the token is
  // not allowed here (the message names it); FailedPrecondition after termination.
  Status AcceptToken(int32_t id);
  // Replays tokens in order; stops at the first error (earlier tokens stay accepted).
  Status AcceptTokens(std::span<const int32_t> ids);
  // Advances by raw text (e.g. an assistant prefix the caller forces). Same errors.
  Status AcceptBytes(std::string_view bytes);

  // Writes the allowed-token bitmask: grammar().vocabulary().mask_words() words, bit i of
  // word i / 32 set when id i may come next; AcceptToken(i) succeeds exactly for those ids.
  // Returns false when nothing is allowed: after termination, or when the text would have to
  // nest deeper than CompileOptions::max_stack_depth to go on (the caller ends the request
  // with an error; a compiled grammar has no other dead ends).
  bool FillNextTokenBitmask(uint32_t* mask);
  // Whether one token may come next (no mask needed).
  bool IsTokenAllowed(int32_t id);

  bool CanEnd() const { return can_end_; }
  bool IsTerminated() const { return terminated_; }
  int64_t n_tokens() const { return n_tokens_; }
  const CompiledGrammar& grammar() const { return *grammar_; }
  const std::shared_ptr<const CompiledGrammar>& grammar_ptr() const { return grammar_; }

  // Layout (little-endian): "PDGM", u8 version (1), u8 flags (1 can end, 2 terminated), u64
  // grammar fingerprint, i64 tokens accepted, u32 word count, u32 words (StackSet, stack_set.h).
  std::string Serialize() const;
  // Errors: FailedPrecondition when the bytes come from a different compiled grammar
  // (fingerprint); DataLoss when they are malformed.
  static Result<GrammarMatcher> Deserialize(std::shared_ptr<const CompiledGrammar> grammar, std::string_view bytes);

 private:
  Status Advance(std::string_view bytes);
  void WriteNodeMask(const NodeTokens& t, uint32_t* mask) const;

  std::shared_ptr<const CompiledGrammar> grammar_;
  std::unique_ptr<StackOps> ops_;  // scratch
  StackSet state_;                 // closed
  bool can_end_ = false;
  bool terminated_ = false;
  int64_t n_tokens_ = 0;
  StackSet raw_, next_;            // scratch
};

// Fills row k of `masks` (at masks + k * stride_words) for matchers[k], on `pool`'s threads
// when given (matchers must be distinct). REQUIRES: stride_words >= each vocabulary's
// mask_words(). Returns how many rows allow nothing (terminated matchers).
int64_t FillNextTokenBitmasks(std::span<GrammarMatcher* const> matchers, uint32_t* masks, int64_t stride_words,
                              ThreadPool* pool = nullptr);

}  // namespace pdserve::grammar
