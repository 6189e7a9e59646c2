// CompiledGrammar's lazy per-node token sets (one trie walk per node) and the state-mask cache.
#include "grammar/compiled_grammar.h"

#include <algorithm>
#include <bit>

#include "grammar/stack_set.h"

namespace pdserve::grammar {

namespace {

// Walks the vocabulary trie from one DFA node with a local stack (compiled_grammar.h).
class TokenClassifier {
 public:
  TokenClassifier(const CompiledGrammar& g, NodeTokens* out)
      : g_(g), v_(g.vocabulary()), ops_(g), out_(out), mask_(static_cast<size_t>(v_.mask_words()), 0) {
    levels_.resize(static_cast<size_t>(v_.max_token_bytes()) + 2);
  }

  void Run(uint32_t node) {
    const StackSet start = {1, node};
    const CloseResult r = ops_.Close(start, &levels_[0]);
    if (!levels_[0].empty()) Walk(0, 0, r.base_return_called);
    Finish();
  }

 private:
  void Accept(int32_t begin, int32_t end) {
    const std::vector<int32_t>& order = v_.token_order();
    for (int32_t k = begin; k < end; ++k) {
      const uint32_t id = static_cast<uint32_t>(order[static_cast<size_t>(k)]);
      mask_[id >> 5] |= 1u << (id & 31);
    }
    out_->n_accepted += end - begin;
  }
  void Uncertain(int32_t begin, int32_t end) {
    const std::vector<int32_t>& order = v_.token_order();
    for (int32_t k = begin; k < end; ++k) out_->uncertain.push_back(order[static_cast<size_t>(k)]);
  }

  // levels_[depth] is the closed set after the bytes of trie node `tnode`; `ctx` says a return
  // below the local stack was possible somewhere along them.
  void Walk(int32_t tnode, size_t depth, bool ctx) {
    const StackSet& cur = levels_[depth];
    const bool single_plain = cur.size() == 2;  // one stack of depth 1
    const int32_t end = v_.trie_end(tnode);
    for (int32_t c = tnode + 1; c < end; c = v_.trie_end(c)) {
      const uint8_t byte = v_.trie_byte(c);
      if (single_plain) {
        const uint32_t next = g_.Next(cur[1], byte);
        if (next == CompiledGrammar::kDead) {
          if (ctx) Uncertain(v_.trie_tok_begin(c), v_.trie_tok_end(c));
          continue;
        }
        Accept(v_.trie_tok_begin(c), v_.trie_own_end(c));
        if (v_.trie_end(c) == c + 1) continue;  // leaf
        StackSet& nxt = levels_[depth + 1];
        if (g_.IsPlain(next)) {
          nxt.assign({1, next});
          Walk(c, depth + 1, ctx);
          continue;
        }
        raw_.assign({1, next});
        Descend(c, depth, ctx);
        continue;
      }
      ops_.Step(cur, byte, &raw_);
      if (raw_.empty()) {
        if (ctx) Uncertain(v_.trie_tok_begin(c), v_.trie_tok_end(c));
        continue;
      }
      Accept(v_.trie_tok_begin(c), v_.trie_own_end(c));
      if (v_.trie_end(c) == c + 1) continue;
      Descend(c, depth, ctx);
    }
  }

  // Closes raw_ into the next level and walks the children of trie node c.
  void Descend(int32_t c, size_t depth, bool ctx) {
    StackSet& nxt = levels_[depth + 1];
    const CloseResult r = ops_.Close(raw_, &nxt);
    const bool ctx2 = ctx || r.base_return_called;
    if (nxt.empty()) {
      if (ctx2) Uncertain(v_.trie_own_end(c), v_.trie_tok_end(c));
      return;
    }
    Walk(c, depth + 1, ctx2);
  }

  void Finish() {
    // Small sets as id lists, large ones as a bitmask (16 KiB at DeepSeek's vocabulary): the
    // list is the smaller of the two below mask_words() ids.
    if (out_->n_accepted < v_.mask_words()) {
      for (size_t w = 0; w < mask_.size(); ++w) {
        for (uint32_t bits = mask_[w]; bits; bits &= bits - 1)
          out_->accepted_ids.push_back(static_cast<int32_t>(w * 32 + static_cast<size_t>(std::countr_zero(bits))));
      }
    } else {
      out_->accepted_mask = std::move(mask_);
    }
    std::sort(out_->uncertain.begin(), out_->uncertain.end());
    out_->uncertain.erase(std::unique(out_->uncertain.begin(), out_->uncertain.end()), out_->uncertain.end());
  }

  const CompiledGrammar& g_;
  const Vocabulary& v_;
  StackOps ops_;
  NodeTokens* out_;
  std::vector<uint32_t> mask_;
  std::vector<StackSet> levels_;
  StackSet raw_;
};

}  // namespace

std::unique_ptr<NodeTokens> CompiledGrammar::Classify(uint32_t node) const {
  auto out = std::make_unique<NodeTokens>();
  TokenClassifier(*this, out.get()).Run(node);
  return out;
}

const NodeTokens& CompiledGrammar::TokensAt(uint32_t node) const {
  std::atomic<const NodeTokens*>& slot = tokens_[node];
  if (const NodeTokens* t = slot.load(std::memory_order_acquire)) return *t;
  std::lock_guard<std::mutex> lock(classify_mu_);
  if (const NodeTokens* t = slot.load(std::memory_order_acquire)) return *t;
  std::unique_ptr<NodeTokens> computed = Classify(node);
  const NodeTokens* raw = computed.get();
  owned_tokens_.push_back(std::move(computed));
  slot.store(raw, std::memory_order_release);
  nodes_classified_.fetch_add(1, std::memory_order_relaxed);
  return *raw;
}

int64_t CompiledGrammar::MemoryBytes() const {
  int64_t bytes = static_cast<int64_t>(next_.size() * sizeof(uint32_t) + flags_.size() + call_begin_.size() * sizeof(uint32_t) +
                                       calls_.size() * sizeof(Call));
  std::lock_guard<std::mutex> lock(classify_mu_);
  for (const auto& t : owned_tokens_)
    bytes += static_cast<int64_t>(sizeof(NodeTokens) + (t->accepted_ids.size() + t->uncertain.size()) * sizeof(int32_t) +
                                  t->accepted_mask.size() * sizeof(uint32_t));
  return bytes;
}

std::shared_ptr<const std::vector<uint32_t>> CompiledGrammar::FindStateMask(const std::string& key) const {
  std::lock_guard<std::mutex> lock(cache_mu_);
  auto it = state_masks_.find(key);
  if (it == state_masks_.end()) {
    state_mask_misses_.fetch_add(1, std::memory_order_relaxed);
    return nullptr;
  }
  lru_.splice(lru_.begin(), lru_, it->second.second);
  return it->second.first;
}

void CompiledGrammar::StoreStateMask(const std::string& key, std::shared_ptr<const std::vector<uint32_t>> mask) const {
  if (options_.state_mask_cache_entries == 0) return;
  std::lock_guard<std::mutex> lock(cache_mu_);
  if (state_masks_.count(key)) return;
  lru_.push_front(key);
  state_masks_.emplace(key, std::make_pair(std::move(mask), lru_.begin()));
  while (state_masks_.size() > options_.state_mask_cache_entries) {
    state_masks_.erase(lru_.back());
    lru_.pop_back();
  }
}

}  // namespace pdserve::grammar
