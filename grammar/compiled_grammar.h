// CompiledGrammar: a Grammar turned into a byte-level pushdown automaton over one Vocabulary,
// with the per-state token sets that make a mask step cheap.
//
// Compilation:
//   1. Rules that are not on a recursion cycle are inlined where they are used; on each cycle
//      a few rules are kept (greedily, the most referenced) so that inlining the rest ends.
//      The root and the kept rules become automata; a reference to a kept rule is a call edge.
//   2. Each automaton: Thompson NFA -> DFA (subset construction over bytes and call edges) ->
//      states that cannot reach the rule's end removed -> minimized (Moore refinement).
//   3. Bytes are grouped into classes that no automaton tells apart; each DFA node gets a
//      dense next-node table over the classes.
//   4. Left recursion (a rule reachable from its own start without consuming a byte) is an
//      error: the stack would grow without input.
//
// Matching (matcher.h) keeps a set of stacks of DFA nodes (the top is the current node, the
// ones below are where each call returns). Token sets are computed lazily per DFA node n by one
// walk of the vocabulary trie from n alone (the "context" below n unknown):
//   accepted  - the token's bytes can be consumed inside n's rule (and the rules it calls):
//               allowed whatever is below n on the stack;
//   uncertain - n's rule can end (return) before the token's last byte: whether the rest
//               fits depends on the stack; checked per state at mask time;
//   rejected  - everything else.
// Grammars without kept rules (every JSON Schema without recursion, regexes) never have
// uncertain tokens: a mask is the node's accepted set, copied. States with several stacks or
// uncertain tokens have their full mask cached by state (LRU, CompileOptions).
//
// Thread-safety: immutable after Compile apart from the lazy token sets and the state-mask
// cache, which are internally synchronized: share one CompiledGrammar between any number of
// matchers on any threads.
#pragma once

#include <atomic>
#include <cstdint>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/status.h"
#include "grammar/grammar.h"
#include "grammar/vocabulary.h"

namespace pdserve::grammar {

struct CompileOptions {
  // Bounds on the automata: a schema or grammar beyond them is refused (InvalidArgument) rather
  // than compiled slowly. Inlining copies a rule per use, so deep reuse multiplies sizes.
  int64_t max_nfa_states = 1'000'000;
  int64_t max_dfa_nodes = 200'000;
  // Deeper stacks (nesting of kept rules, e.g. JSON arrays in arrays) are not matched: an
  // output cannot nest deeper than this. Bounds the work per byte.
  int32_t max_stack_depth = 128;
  // Full masks of states that need more than one node's token set (16 KiB each for a
  // 129,280-token vocabulary): more entries, fewer recomputations on recursive grammars.
  size_t state_mask_cache_entries = 512;
};

// One DFA node's token classes (see the file comment). Token ids.
struct NodeTokens {
  int64_t n_accepted = 0;
  std::vector<int32_t> accepted_ids;     // when the set is small; else
  std::vector<uint32_t> accepted_mask;   // a full bitmask (Vocabulary::mask_words words)
  std::vector<int32_t> uncertain;        // sorted
};

class CompiledGrammar {
 public:
  static constexpr uint32_t kDead = 0xFFFFFFFFu;
  struct Call {
    uint32_t start;  // the called automaton's start node
    uint32_t ret;    // node to continue at after it ends
  };

  // Errors: InvalidArgument (the grammar's own Validate errors, left recursion naming the
  // rule, a grammar matching nothing, or automata beyond the options' bounds).
  static Result<std::shared_ptr<const CompiledGrammar>> Compile(const Grammar& grammar,
                                                                std::shared_ptr<const Vocabulary> vocabulary,
                                                                const CompileOptions& options = {});

  const Vocabulary& vocabulary() const { return *vocab_; }
  const CompileOptions& options() const { return options_; }
  // Identifies the automaton and its vocabulary: serialized matcher states carry it.
  uint64_t fingerprint() const { return fingerprint_; }
  int32_t n_nodes() const { return static_cast<int32_t>(flags_.size()); }
  int32_t n_automata() const { return static_cast<int32_t>(rule_start_.size()); }
  int32_t n_byte_classes() const { return n_classes_; }
  uint32_t root_start() const { return root_start_; }

  // ---- the automaton (used by the matcher) ----
  uint32_t Next(uint32_t node, uint8_t byte) const {
    return next_[static_cast<size_t>(node) * static_cast<size_t>(n_classes_) + byte_class_[byte]];
  }
  bool IsFinal(uint32_t node) const { return flags_[node] & kFinal; }
  bool HasBytes(uint32_t node) const { return flags_[node] & kHasBytes; }
  bool HasCalls(uint32_t node) const { return flags_[node] & kHasCalls; }
  // Not final and no calls: its closure is itself.
  bool IsPlain(uint32_t node) const { return !(flags_[node] & (kFinal | kHasCalls)); }
  // A return from `node`'s automaton at the bottom of a local stack needs the caller.
  bool RuleIsCalled(uint32_t node) const { return flags_[node] & kRuleCalled; }
  const Call* CallsBegin(uint32_t node) const { return calls_.data() + call_begin_[node]; }
  const Call* CallsEnd(uint32_t node) const { return calls_.data() + call_begin_[node + 1]; }
  uint32_t RuleStart(uint32_t automaton) const { return rule_start_[automaton]; }

  // The token sets of `node` (computed on first use: one trie walk). Any thread.
  const NodeTokens& TokensAt(uint32_t node) const;
  // Full masks cached by state key (matcher.cc). Any thread. Null when absent.
  std::shared_ptr<const std::vector<uint32_t>> FindStateMask(const std::string& key) const;
  void StoreStateMask(const std::string& key, std::shared_ptr<const std::vector<uint32_t>> mask) const;

  // Bytes held: the automaton's tables plus the token sets computed so far (not the
  // state-mask cache, bounded by CompileOptions::state_mask_cache_entries).
  int64_t MemoryBytes() const;

  // Work counters, for tests and benchmarks.
  int64_t nodes_classified() const { return nodes_classified_.load(std::memory_order_relaxed); }
  int64_t state_mask_misses() const { return state_mask_misses_.load(std::memory_order_relaxed); }

 private:
  friend class AutomatonBuilder;
  static constexpr uint8_t kFinal = 1, kHasBytes = 2, kHasCalls = 4, kRuleCalled = 8;

  CompiledGrammar() = default;
  std::unique_ptr<NodeTokens> Classify(uint32_t node) const;

  // Immutable after construction.
  std::shared_ptr<const Vocabulary> vocab_;
  CompileOptions options_;
  uint64_t fingerprint_ = 0;
  int32_t n_classes_ = 1;
  uint8_t byte_class_[256] = {};
  std::vector<uint32_t> next_;        // [node * n_classes + class]
  std::vector<uint8_t> flags_;        // per node
  std::vector<uint32_t> call_begin_;  // per node + 1, into calls_
  std::vector<Call> calls_;
  std::vector<uint32_t> rule_start_;  // per automaton
  uint32_t root_start_ = 0;

  // Lazily filled token sets: a slot is published once (release) and never changes.
  mutable std::unique_ptr<std::atomic<const NodeTokens*>[]> tokens_;
  mutable std::mutex classify_mu_;
  mutable std::vector<std::unique_ptr<NodeTokens>> owned_tokens_;  // guarded by classify_mu_
  mutable std::atomic<int64_t> nodes_classified_{0};

  // State-mask LRU; guarded by cache_mu_.
  mutable std::mutex cache_mu_;
  mutable std::list<std::string> lru_;
  mutable std::unordered_map<std::string, std::pair<std::shared_ptr<const std::vector<uint32_t>>,
                                                    std::list<std::string>::iterator>>
      state_masks_;
  mutable std::atomic<int64_t> state_mask_misses_{0};
};

}  // namespace pdserve::grammar
