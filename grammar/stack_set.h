// StackSet operations shared by the matcher and the token classifier (internal to grammar/).
//
// A set of stacks is stored flat in a std::vector<uint32_t>: records [len, n_0 .. n_{len-1}],
// n_{len-1} the top (the current DFA node), the others the nodes each call returns to. Sets are
// tiny (one record for most JSON states), so membership is a linear scan.
//
// A "closed" set holds only stacks whose top consumes bytes; Close() expands a raw set by
// calls (push the called automaton's start) and returns (pop when the top is final).
//
// Thread-safety: a StackOps holds scratch buffers: one per thread.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "grammar/compiled_grammar.h"

namespace pdserve::grammar {

using StackSet = std::vector<uint32_t>;

struct CloseResult {
  bool base_return = false;         // a stack of depth 1 reached a final node (end of its automaton)
  bool base_return_called = false;  // ... in an automaton that some rule calls
};

class StackOps {
 public:
  explicit StackOps(const CompiledGrammar& g) : g_(g) {}

  // Every stack advanced by `byte` (dead ones dropped). *out is overwritten.
  void Step(const StackSet& in, uint8_t byte, StackSet* out) const;
  // The closure of `raw` into *out (overwritten). Stacks deeper than
  // CompileOptions::max_stack_depth are dropped.
  CloseResult Close(const StackSet& raw, StackSet* out);

  // Whether `bytes` can be consumed from the closed set `from` (returns at depth 1 end the
  // text: no byte may follow them). REQUIRES: `from` is not one of this object's buffers.
  bool Matches(const StackSet& from, std::span<const uint8_t> bytes);

 private:
  const CompiledGrammar& g_;
  std::vector<uint32_t> work_, seen_, a_, match_cur_, match_raw_;
};

// Whether the record at rec (length-prefixed) occurs in the flat set `set`.
bool ContainsRecord(std::span<const uint32_t> set, const uint32_t* rec);

}  // namespace pdserve::grammar
