#include "grammar/stack_set.h"

#include <algorithm>

namespace pdserve::grammar {

bool ContainsRecord(std::span<const uint32_t> set, const uint32_t* rec) {
  const uint32_t len = rec[0];
  for (size_t i = 0; i < set.size(); i += set[i] + 1) {
    if (set[i] == len && std::equal(rec + 1, rec + 1 + len, set.data() + i + 1)) return true;
  }
  return false;
}

void StackOps::Step(const StackSet& in, uint8_t byte, StackSet* out) const {
  out->clear();
  for (size_t i = 0; i < in.size(); i += in[i] + 1) {
    const uint32_t len = in[i];
    const uint32_t next = g_.Next(in[i + len], byte);
    if (next == CompiledGrammar::kDead) continue;
    const size_t at = out->size();
    out->insert(out->end(), in.begin() + static_cast<ptrdiff_t>(i), in.begin() + static_cast<ptrdiff_t>(i + len + 1));
    out->back() = next;
    // Two stacks may meet in one node: keep one.
    if (at > 0 && ContainsRecord({out->data(), at}, out->data() + at)) out->resize(at);
  }
}

CloseResult StackOps::Close(const StackSet& raw, StackSet* out) {
  CloseResult result;
  out->clear();
  // Fast path: one plain stack is its own closure.
  if (!raw.empty() && raw[0] + 1 == raw.size() && g_.IsPlain(raw.back())) {
    *out = raw;
    return result;
  }
  const uint32_t max_depth = static_cast<uint32_t>(g_.options().max_stack_depth);
  seen_.clear();
  work_.clear();
  // Work items are stored [n_0 .. n_{len-1}, len] so the last one can be popped.
  for (size_t i = 0; i < raw.size(); i += raw[i] + 1) {
    work_.insert(work_.end(), raw.begin() + static_cast<ptrdiff_t>(i + 1),
                 raw.begin() + static_cast<ptrdiff_t>(i + 1 + raw[i]));
    work_.push_back(raw[i]);
  }
  std::vector<uint32_t>& rec = a_;
  while (!work_.empty()) {
    const uint32_t len = work_.back();
    rec.resize(len + 1);
    rec[0] = len;
    std::copy(work_.end() - 1 - len, work_.end() - 1, rec.begin() + 1);
    work_.resize(work_.size() - len - 1);
    if (ContainsRecord(seen_, rec.data())) continue;
    seen_.insert(seen_.end(), rec.begin(), rec.end());
    const uint32_t top = rec[len];
    if (g_.HasBytes(top)) out->insert(out->end(), rec.begin(), rec.end());
    if (g_.IsFinal(top)) {
      if (len == 1) {
        result.base_return = true;
        if (g_.RuleIsCalled(top)) result.base_return_called = true;
      } else {
        // Return: the node below (where the call continues) becomes the top.
        work_.insert(work_.end(), rec.begin() + 1, rec.begin() + len);
        work_.push_back(len - 1);
      }
    }
    if (g_.HasCalls(top) && len < max_depth) {
      for (const CompiledGrammar::Call* c = g_.CallsBegin(top); c != g_.CallsEnd(top); ++c) {
        work_.insert(work_.end(), rec.begin() + 1, rec.begin() + len);  // below the top
        work_.push_back(c->ret);
        work_.push_back(c->start);
        work_.push_back(len + 1);
      }
    }
  }
  return result;
}

bool StackOps::Matches(const StackSet& from, std::span<const uint8_t> bytes) {
  if (bytes.empty()) return true;
  StackSet& cur = match_cur_;
  StackSet& raw = match_raw_;
  cur = from;
  for (size_t i = 0; i < bytes.size(); ++i) {
    Step(cur, bytes[i], &raw);
    if (raw.empty()) return false;
    if (i + 1 == bytes.size()) return true;
    Close(raw, &cur);
    if (cur.empty()) return false;
  }
  return true;
}

}  // namespace pdserve::grammar
