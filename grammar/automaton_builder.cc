// Grammar -> CompiledGrammar's automaton (compiled_grammar.h, steps 1-4).
#include <algorithm>
#include <deque>
#include <functional>
#include <map>
#include <unordered_map>

#include "grammar/compiled_grammar.h"
#include "grammar/utf8_ranges.h"

namespace pdserve::grammar {

namespace {

struct VecHash {
  size_t operator()(const std::vector<int32_t>& v) const {
    uint64_t h = 0xcbf29ce484222325ULL;
    for (int32_t x : v) {
      h ^= static_cast<uint32_t>(x);
      h *= 0x100000001b3ULL;
    }
    return static_cast<size_t>(h);
  }
};

// Minimization's budget in signature entries (rounds * nodes * byte classes): ~0.1 s.
constexpr size_t kMinimizeWorkBudget = 30'000'000;

uint64_t Fnv(uint64_t h, const void* data, size_t n) {
  const auto* p = static_cast<const uint8_t*>(data);
  for (size_t i = 0; i < n; ++i) {
    h ^= p[i];
    h *= 0x100000001b3ULL;
  }
  return h;
}

// Rules referenced by an expression tree.
void CollectRefs(const Grammar& g, ExprId id, std::vector<RuleId>* out) {
  std::vector<ExprId> stack = {id};
  while (!stack.empty()) {
    const Expr& e = g.expr(stack.back());
    stack.pop_back();
    if (e.kind == ExprKind::kRuleRef) out->push_back(e.rule);
    for (ExprId c : e.children) stack.push_back(c);
  }
}

// Tarjan's strongly connected components of the subgraph induced by `members`.
std::vector<std::vector<RuleId>> Components(const std::vector<std::vector<RuleId>>& edges,
                                            const std::vector<RuleId>& members) {
  const size_t n = edges.size();
  std::vector<uint8_t> in(n, 0);
  for (RuleId r : members) in[static_cast<size_t>(r)] = 1;
  std::vector<int32_t> index(n, -1), low(n, 0);
  std::vector<uint8_t> on_stack(n, 0);
  std::vector<RuleId> stack;
  std::vector<std::vector<RuleId>> out;
  int32_t counter = 0;
  std::function<void(RuleId)> visit = [&](RuleId v) {
    index[static_cast<size_t>(v)] = low[static_cast<size_t>(v)] = counter++;
    stack.push_back(v);
    on_stack[static_cast<size_t>(v)] = 1;
    for (RuleId w : edges[static_cast<size_t>(v)]) {
      if (!in[static_cast<size_t>(w)]) continue;
      if (index[static_cast<size_t>(w)] < 0) {
        visit(w);
        low[static_cast<size_t>(v)] = std::min(low[static_cast<size_t>(v)], low[static_cast<size_t>(w)]);
      } else if (on_stack[static_cast<size_t>(w)]) {
        low[static_cast<size_t>(v)] = std::min(low[static_cast<size_t>(v)], index[static_cast<size_t>(w)]);
      }
    }
    if (low[static_cast<size_t>(v)] == index[static_cast<size_t>(v)]) {
      std::vector<RuleId> comp;
      RuleId w;
      do {
        w = stack.back();
        stack.pop_back();
        on_stack[static_cast<size_t>(w)] = 0;
        comp.push_back(w);
      } while (w != v);
      std::sort(comp.begin(), comp.end());
      out.push_back(std::move(comp));
    }
  };
  for (RuleId r : members)
    if (index[static_cast<size_t>(r)] < 0) visit(r);
  return out;
}

}  // namespace

class AutomatonBuilder {
 public:
  AutomatonBuilder(const Grammar& g, const CompileOptions& o) : g_(g), options_(o) {}

  Status Build(CompiledGrammar* out);

 private:
  // ---- step 1: which rules stay automata ----
  void ChooseKeptRules();
  void BreakCycles(const std::vector<RuleId>& members);

  // ---- step 2a: Thompson NFA of one automaton ----
  enum EdgeKind : uint8_t { kByte, kEps, kCall };
  struct NfaEdge {
    int32_t from, to;
    int32_t automaton;  // kCall
    uint8_t lo, hi;     // kByte
    EdgeKind kind;
  };
  int32_t NewState();
  void AddByte(int32_t from, int32_t to, uint8_t lo, uint8_t hi) { nfa_.push_back({from, to, -1, lo, hi, kByte}); }
  void AddEps(int32_t from, int32_t to) { nfa_.push_back({from, to, -1, 0, 0, kEps}); }
  int32_t BuildExpr(ExprId id, int32_t next, int depth);
  std::unordered_map<uint64_t, int32_t> memo_;  // (expression, continuation) -> entry

  // ---- step 2b: subset construction ----
  struct DNode {
    std::vector<std::pair<ByteRange, int32_t>> edges;
    std::vector<std::pair<int32_t, int32_t>> calls;  // (automaton, continue-at)
    bool final = false;
    int32_t automaton = 0;
  };
  Status Determinize(int32_t automaton, int32_t nfa_start, int32_t nfa_end);
  std::vector<int32_t> Closure(std::vector<int32_t> set) const;

  // ---- steps 2c-4 ----
  Status PruneAndCheck();
  void Minimize();
  Status CheckLeftRecursion();
  void Emit(CompiledGrammar* out);

  const Grammar& g_;
  const CompileOptions& options_;
  Status error_;

  std::vector<int32_t> automaton_of_rule_;  // -1: inlined
  std::vector<RuleId> rule_of_automaton_;   // automaton 0 is the root

  std::vector<NfaEdge> nfa_;
  int32_t nfa_states_ = 0;
  int64_t nfa_total_ = 0;
  std::vector<int32_t> nfa_offsets_;  // edges of state s: nfa_[nfa_offsets_[s] .. nfa_offsets_[s + 1])

  std::vector<DNode> dfa_;
  std::vector<int32_t> automaton_start_;  // DFA node
  // After Emit-ready tables.
  int32_t n_classes_ = 0;
  uint8_t byte_class_[256] = {};
};

void AutomatonBuilder::BreakCycles(const std::vector<RuleId>& members) {
  std::vector<std::vector<RuleId>> edges(static_cast<size_t>(g_.n_rules()));
  for (RuleId r : members) {
    std::vector<RuleId> refs;
    CollectRefs(g_, g_.rule(r).body, &refs);
    for (RuleId t : refs)
      if (automaton_of_rule_[static_cast<size_t>(t)] < 0) edges[static_cast<size_t>(r)].push_back(t);
  }
  for (const std::vector<RuleId>& comp : Components(edges, members)) {
    bool cyclic = comp.size() > 1;
    if (!cyclic) {
      for (RuleId t : edges[static_cast<size_t>(comp[0])]) cyclic |= t == comp[0];
    }
    if (!cyclic) continue;
    // Keep the rule the rest of the component refers to most; the remainder may still cycle.
    std::vector<int32_t> in_degree(static_cast<size_t>(g_.n_rules()), 0);
    for (RuleId r : comp)
      for (RuleId t : edges[static_cast<size_t>(r)])
        if (std::binary_search(comp.begin(), comp.end(), t)) ++in_degree[static_cast<size_t>(t)];
    RuleId best = comp[0];
    for (RuleId r : comp)
      if (in_degree[static_cast<size_t>(r)] > in_degree[static_cast<size_t>(best)]) best = r;
    automaton_of_rule_[static_cast<size_t>(best)] = static_cast<int32_t>(rule_of_automaton_.size());
    rule_of_automaton_.push_back(best);
    std::vector<RuleId> rest;
    for (RuleId r : comp)
      if (r != best) rest.push_back(r);
    if (!rest.empty()) BreakCycles(rest);
  }
}

void AutomatonBuilder::ChooseKeptRules() {
  automaton_of_rule_.assign(static_cast<size_t>(g_.n_rules()), -1);
  automaton_of_rule_[static_cast<size_t>(g_.root())] = 0;
  rule_of_automaton_ = {g_.root()};
  // Rules reachable from the root.
  std::vector<uint8_t> reached(static_cast<size_t>(g_.n_rules()), 0);
  std::vector<RuleId> members, stack = {g_.root()};
  reached[static_cast<size_t>(g_.root())] = 1;
  while (!stack.empty()) {
    const RuleId r = stack.back();
    stack.pop_back();
    members.push_back(r);
    std::vector<RuleId> refs;
    CollectRefs(g_, g_.rule(r).body, &refs);
    for (RuleId t : refs)
      if (!reached[static_cast<size_t>(t)]) reached[static_cast<size_t>(t)] = 1, stack.push_back(t);
  }
  std::sort(members.begin(), members.end());
  BreakCycles(members);
}

int32_t AutomatonBuilder::NewState() {
  if (++nfa_total_ > options_.max_nfa_states && error_.ok())
    error_ = Status::InvalidArgument("grammar too large: more than " + std::to_string(options_.max_nfa_states) +
                                     " automaton states (deeply reused definitions or large repetition bounds)");
  return nfa_states_++;
}

// Continuation-passing Thompson construction: returns a state from which the paths matching
// `id` lead to `next`. Invariant: a construct adds edges out of the states it creates only, never
// out of `next` or out of a child's entry; so the fragment for (expression, continuation) can be
// shared by every use with the same continuation (memo_), which keeps shared tails linear (the
// optional-property chains of JSON objects, enum alternatives, rules inlined in tail position).
int32_t AutomatonBuilder::BuildExpr(ExprId id, int32_t next, int depth) {
  if (!error_.ok()) return next;
  if (depth > 2000) {
    error_ = Status::InvalidArgument("grammar nests too deeply (inlined definitions more than 2000 levels deep)");
    return next;
  }
  const uint64_t key = (static_cast<uint64_t>(static_cast<uint32_t>(id)) << 32) | static_cast<uint32_t>(next);
  if (auto it = memo_.find(key); it != memo_.end()) return it->second;
  const Expr& e = g_.expr(id);
  int32_t entry = next;
  switch (e.kind) {
    case ExprKind::kEmpty:
      break;
    case ExprKind::kBytes: {
      int32_t s = next;
      for (size_t i = e.bytes.size(); i-- > 0;) {
        const int32_t t = NewState();
        AddByte(t, s, static_cast<uint8_t>(e.bytes[i]), static_cast<uint8_t>(e.bytes[i]));
        s = t;
      }
      entry = s;
      break;
    }
    case ExprKind::kByteSet: {
      entry = NewState();
      for (ByteRange r : e.byte_ranges) AddByte(entry, next, r.lo, r.hi);
      break;
    }
    case ExprKind::kCharSet: {
      entry = NewState();
      for (CharRange r : e.char_ranges) {
        for (const Utf8Sequence& seq : Utf8Sequences(r)) {
          int32_t s = entry;
          for (size_t i = 0; i + 1 < seq.size(); ++i) {
            const int32_t u = NewState();
            AddByte(s, u, seq[i].lo, seq[i].hi);
            s = u;
          }
          AddByte(s, next, seq.back().lo, seq.back().hi);
        }
      }
      break;
    }
    case ExprKind::kSeq: {
      int32_t s = next;
      for (size_t i = e.children.size(); i-- > 0;) s = BuildExpr(e.children[i], s, depth + 1);
      entry = s;
      break;
    }
    case ExprKind::kAlt: {
      entry = NewState();
      for (ExprId c : e.children) AddEps(entry, BuildExpr(c, next, depth + 1));
      break;
    }
    case ExprKind::kRepeat: {
      const ExprId child = e.children[0];
      int32_t s = next;
      if (e.max == kUnbounded) {
        const int32_t loop = NewState();
        AddEps(loop, next);
        AddEps(loop, BuildExpr(child, loop, depth + 1));
        s = loop;
      } else {
        // Up to max - min optional copies, each may stop at `next`.
        for (int32_t i = e.min; i < e.max && error_.ok(); ++i) {
          const int32_t opt = NewState();
          AddEps(opt, next);
          AddEps(opt, BuildExpr(child, s, depth + 1));
          s = opt;
        }
      }
      for (int32_t i = 0; i < e.min && error_.ok(); ++i) s = BuildExpr(child, s, depth + 1);
      entry = s;
      break;
    }
    case ExprKind::kUntil: {
      // The KMP automaton of the marker: state i = the longest marker prefix the text ends with.
      const std::string& m = e.bytes;
      const size_t len = m.size();
      std::vector<size_t> border(len + 1, 0);  // border[i]: longest proper border of m[0, i)
      for (size_t i = 2, b = 0; i <= len; ++i) {
        while (b > 0 && m[i - 1] != m[b]) b = border[b];
        if (m[i - 1] == m[b]) ++b;
        border[i] = b;
      }
      std::vector<int32_t> state(len);
      for (size_t i = 0; i < len; ++i) state[i] = NewState();
      for (size_t i = 0; i < len; ++i) {
        auto target = [&](uint8_t c) {
          size_t j = i;
          while (j > 0 && static_cast<uint8_t>(m[j]) != c) j = border[j];
          if (static_cast<uint8_t>(m[j]) == c) ++j;
          return j;
        };
        int run_start = 0;
        size_t run_target = target(0);
        for (int c = 1; c <= 256; ++c) {
          const size_t t = c < 256 ? target(static_cast<uint8_t>(c)) : len + 1;
          if (t == run_target) continue;
          AddByte(state[i], run_target == len ? next : state[run_target], static_cast<uint8_t>(run_start),
                  static_cast<uint8_t>(c - 1));
          run_start = c;
          run_target = t;
        }
      }
      entry = state[0];
      break;
    }
    case ExprKind::kRuleRef: {
      const int32_t a = automaton_of_rule_[static_cast<size_t>(e.rule)];
      if (a < 0) {
        entry = BuildExpr(g_.rule(e.rule).body, next, depth + 1);
      } else {
        entry = NewState();
        nfa_.push_back({entry, next, a, 0, 0, kCall});
      }
      break;
    }
  }
  memo_.emplace(key, entry);
  return entry;
}

std::vector<int32_t> AutomatonBuilder::Closure(std::vector<int32_t> set) const {
  std::vector<int32_t> stack = set;
  std::vector<int32_t>& out = set;
  std::sort(out.begin(), out.end());
  while (!stack.empty()) {
    const int32_t s = stack.back();
    stack.pop_back();
    for (int32_t k = nfa_offsets_[static_cast<size_t>(s)]; k < nfa_offsets_[static_cast<size_t>(s) + 1]; ++k) {
      const NfaEdge& edge = nfa_[static_cast<size_t>(k)];
      if (edge.kind != kEps) continue;
      auto it = std::lower_bound(out.begin(), out.end(), edge.to);
      if (it != out.end() && *it == edge.to) continue;
      out.insert(it, edge.to);
      stack.push_back(edge.to);
    }
  }
  return out;
}

Status AutomatonBuilder::Determinize(int32_t automaton, int32_t nfa_start, int32_t nfa_end) {
  // Edges grouped by source state.
  std::stable_sort(nfa_.begin(), nfa_.end(), [](const NfaEdge& a, const NfaEdge& b) { return a.from < b.from; });
  nfa_offsets_.assign(static_cast<size_t>(nfa_states_) + 1, 0);
  for (const NfaEdge& e : nfa_) ++nfa_offsets_[static_cast<size_t>(e.from) + 1];
  for (size_t s = 0; s < static_cast<size_t>(nfa_states_); ++s) nfa_offsets_[s + 1] += nfa_offsets_[s];

  std::unordered_map<std::vector<int32_t>, int32_t, VecHash> ids;
  std::deque<std::pair<std::vector<int32_t>, int32_t>> queue;
  auto intern = [&](std::vector<int32_t> set) -> int32_t {
    auto it = ids.find(set);
    if (it != ids.end()) return it->second;
    const int32_t id = static_cast<int32_t>(dfa_.size());
    dfa_.push_back(DNode{});
    dfa_.back().automaton = automaton;
    ids.emplace(set, id);
    queue.emplace_back(std::move(set), id);
    return id;
  };
  automaton_start_[static_cast<size_t>(automaton)] = intern(Closure({nfa_start}));
  std::vector<std::vector<int32_t>> bucket(256);
  while (!queue.empty()) {
    if (static_cast<int64_t>(dfa_.size()) > options_.max_dfa_nodes)
      return Status::InvalidArgument("grammar too large: more than " + std::to_string(options_.max_dfa_nodes) +
                                     " automaton nodes");
    auto [set, id] = std::move(queue.front());
    queue.pop_front();
    for (auto& b : bucket) b.clear();
    std::map<int32_t, std::vector<int32_t>> calls;
    bool final = false;
    for (int32_t s : set) {
      final |= s == nfa_end;
      for (int32_t k = nfa_offsets_[static_cast<size_t>(s)]; k < nfa_offsets_[static_cast<size_t>(s) + 1]; ++k) {
        const NfaEdge& edge = nfa_[static_cast<size_t>(k)];
        if (edge.kind == kByte) {
          for (int b = edge.lo; b <= edge.hi; ++b) bucket[static_cast<size_t>(b)].push_back(edge.to);
        } else if (edge.kind == kCall) {
          calls[edge.automaton].push_back(edge.to);
        }
      }
    }
    std::vector<std::pair<ByteRange, int32_t>> edges;
    std::vector<int32_t> prev;
    int run_start = -1;
    auto flush = [&](int end_byte) {
      if (run_start >= 0 && !prev.empty()) {
        const int32_t target = intern(Closure(prev));
        edges.push_back({{static_cast<uint8_t>(run_start), static_cast<uint8_t>(end_byte)}, target});
      }
    };
    for (int b = 0; b < 256; ++b) {
      std::vector<int32_t>& cur = bucket[static_cast<size_t>(b)];
      std::sort(cur.begin(), cur.end());
      cur.erase(std::unique(cur.begin(), cur.end()), cur.end());
      if (run_start >= 0 && cur == prev) continue;
      flush(b - 1);
      prev = cur;
      run_start = b;
    }
    flush(255);
    std::vector<std::pair<int32_t, int32_t>> dcalls;
    for (auto& [a, targets] : calls) {
      std::sort(targets.begin(), targets.end());
      targets.erase(std::unique(targets.begin(), targets.end()), targets.end());
      dcalls.push_back({a, intern(Closure(targets))});
    }
    DNode& node = dfa_[static_cast<size_t>(id)];
    node.final = final;
    node.edges = std::move(edges);
    node.calls = std::move(dcalls);
  }
  return Status::Ok();
}

Status AutomatonBuilder::PruneAndCheck() {
  const size_t n = dfa_.size();
  // Productive: the automaton can still reach its end from here.
  std::vector<uint8_t> productive(n, 0);
  for (size_t i = 0; i < n; ++i) productive[i] = dfa_[i].final;
  for (bool changed = true; changed;) {
    changed = false;
    for (size_t i = n; i-- > 0;) {
      if (productive[i]) continue;
      bool p = false;
      for (const auto& [range, t] : dfa_[i].edges) p |= productive[static_cast<size_t>(t)] != 0;
      for (const auto& [a, t] : dfa_[i].calls)
        p |= productive[static_cast<size_t>(automaton_start_[static_cast<size_t>(a)])] && productive[static_cast<size_t>(t)];
      if (p) productive[i] = 1, changed = true;
    }
  }
  if (!productive[static_cast<size_t>(automaton_start_[0])])
    return Status::InvalidArgument("grammar matches no text at all (an empty set or an impossible rule)");
  for (DNode& d : dfa_) {
    std::erase_if(d.edges, [&](const auto& e) { return !productive[static_cast<size_t>(e.second)]; });
    std::erase_if(d.calls, [&](const auto& c) {
      return !productive[static_cast<size_t>(automaton_start_[static_cast<size_t>(c.first)])] ||
             !productive[static_cast<size_t>(c.second)];
    });
  }
  // Keep what the root can reach; renumber.
  std::vector<int32_t> remap(n, -1);
  std::vector<int32_t> order, stack = {automaton_start_[0]};
  remap[static_cast<size_t>(automaton_start_[0])] = 0;
  order.push_back(automaton_start_[0]);
  for (size_t k = 0; k < order.size(); ++k) {
    const DNode& d = dfa_[static_cast<size_t>(order[k])];
    auto visit = [&](int32_t t) {
      if (remap[static_cast<size_t>(t)] < 0) {
        remap[static_cast<size_t>(t)] = static_cast<int32_t>(order.size());
        order.push_back(t);
      }
    };
    for (const auto& [range, t] : d.edges) visit(t);
    for (const auto& [a, t] : d.calls) {
      visit(automaton_start_[static_cast<size_t>(a)]);
      visit(t);
    }
  }
  std::vector<DNode> kept;
  kept.reserve(order.size());
  for (int32_t old : order) {
    DNode d = std::move(dfa_[static_cast<size_t>(old)]);
    for (auto& [range, t] : d.edges) t = remap[static_cast<size_t>(t)];
    for (auto& [a, t] : d.calls) t = remap[static_cast<size_t>(t)];
    kept.push_back(std::move(d));
  }
  for (int32_t& s : automaton_start_) s = s >= 0 ? remap[static_cast<size_t>(s)] : -1;
  dfa_ = std::move(kept);
  return Status::Ok();
}

void AutomatonBuilder::Minimize() {
  // Byte classes: cut at every edge boundary of every node.
  bool cut[257] = {};
  cut[0] = true;
  for (const DNode& d : dfa_)
    for (const auto& [r, t] : d.edges) cut[r.lo] = true, cut[r.hi + 1] = true;
  n_classes_ = 0;
  for (int b = 0; b < 256; ++b) {
    if (cut[b]) ++n_classes_;
    byte_class_[b] = static_cast<uint8_t>(n_classes_ - 1);
  }
  const size_t n = dfa_.size(), k = static_cast<size_t>(n_classes_);
  std::vector<int32_t> next(n * k, -1);
  for (size_t i = 0; i < n; ++i)
    for (const auto& [r, t] : dfa_[i].edges)
      for (int c = byte_class_[r.lo]; c <= byte_class_[r.hi]; ++c) next[i * k + static_cast<size_t>(c)] = t;

  // Moore refinement: a node's class is refined by its successors' classes until stable. A
  // signature is (class, successor class per byte class, (callee, return class) per call);
  // nodes are bucketed by a 64-bit hash of it and compared exactly within a bucket.
  std::vector<int32_t> cls(n);
  {
    std::map<std::pair<int32_t, bool>, int32_t> initial;
    for (size_t i = 0; i < n; ++i)
      cls[i] = initial.emplace(std::make_pair(dfa_[i].automaton, dfa_[i].final), static_cast<int32_t>(initial.size()))
                   .first->second;
  }
  auto target_cls = [&](const std::vector<int32_t>& c, size_t i, size_t b) {
    const int32_t t = next[i * k + b];
    return t < 0 ? -1 : c[static_cast<size_t>(t)];
  };
  auto same = [&](const std::vector<int32_t>& c, size_t i, size_t j) {
    if (c[i] != c[j] || dfa_[i].calls.size() != dfa_[j].calls.size()) return false;
    for (size_t b = 0; b < k; ++b)
      if (target_cls(c, i, b) != target_cls(c, j, b)) return false;
    for (size_t q = 0; q < dfa_[i].calls.size(); ++q) {
      const auto& [ai, ti] = dfa_[i].calls[q];
      const auto& [aj, tj] = dfa_[j].calls[q];
      if (ai != aj || c[static_cast<size_t>(ti)] != c[static_cast<size_t>(tj)]) return false;
    }
    return true;
  };
  // Each round costs n * k; a chain of L nodes (a bounded repetition) needs L rounds to settle.
  // Refinement that has not settled within the budget is dropped: the automaton stays as
  // built (correct, just not smallest).
  const size_t max_rounds = std::clamp<size_t>(kMinimizeWorkBudget / std::max<size_t>(1, n * k), 8, 4096);
  size_t n_cls = 0, rounds = 0;
  std::vector<int32_t> next_cls(n), rep, chain;
  std::unordered_map<uint64_t, int32_t> first_of_hash;
  first_of_hash.reserve(n * 2);
  while (true) {
    first_of_hash.clear();
    rep.clear();
    chain.clear();
    for (size_t i = 0; i < n; ++i) {
      uint64_t h = 0x9E3779B97F4A7C15ULL ^ static_cast<uint64_t>(cls[i]);
      auto mix = [&h](int64_t v) {
        h ^= static_cast<uint64_t>(v) + 0x9E3779B97F4A7C15ULL + (h << 6) + (h >> 2);
      };
      for (size_t b = 0; b < k; ++b) mix(target_cls(cls, i, b));
      for (const auto& [a, t] : dfa_[i].calls) mix(a), mix(cls[static_cast<size_t>(t)]);
      auto [it, inserted] = first_of_hash.emplace(h, -1);
      int32_t id = -1;
      for (int32_t c = it->second; c >= 0; c = chain[static_cast<size_t>(c)]) {
        if (same(cls, i, static_cast<size_t>(rep[static_cast<size_t>(c)]))) {
          id = c;
          break;
        }
      }
      if (id < 0) {
        id = static_cast<int32_t>(rep.size());
        rep.push_back(static_cast<int32_t>(i));
        chain.push_back(it->second);
        it->second = id;
      }
      next_cls[i] = id;
    }
    const size_t count = rep.size();
    cls.swap(next_cls);
    if (count == n_cls) break;
    n_cls = count;
    if (++rounds > max_rounds) return;
  }
  // Renumber classes in order of first appearance (node 0, the root's start, stays 0).
  std::vector<int32_t> id_of_cls(n_cls, -1);
  int32_t next_id = 0;
  for (size_t i = 0; i < n; ++i)
    if (id_of_cls[static_cast<size_t>(cls[i])] < 0) id_of_cls[static_cast<size_t>(cls[i])] = next_id++;
  std::vector<DNode> merged(n_cls);
  std::vector<uint8_t> done(n_cls, 0);
  for (size_t i = 0; i < n; ++i) {
    const size_t m = static_cast<size_t>(id_of_cls[static_cast<size_t>(cls[i])]);
    if (done[m]) continue;
    done[m] = 1;
    DNode d = std::move(dfa_[i]);
    for (auto& [r, t] : d.edges) t = id_of_cls[static_cast<size_t>(cls[static_cast<size_t>(t)])];
    for (auto& [a, t] : d.calls) t = id_of_cls[static_cast<size_t>(cls[static_cast<size_t>(t)])];
    merged[m] = std::move(d);
  }
  for (int32_t& s : automaton_start_)
    if (s >= 0) s = id_of_cls[static_cast<size_t>(cls[static_cast<size_t>(s)])];
  dfa_ = std::move(merged);
}

Status AutomatonBuilder::CheckLeftRecursion() {
  const size_t n_auto = automaton_start_.size();
  // Nodes reachable from `from` without consuming a byte, through calls of nullable automata.
  std::vector<uint8_t> nullable(n_auto, 0);
  auto eps_reach = [&](int32_t from, std::vector<int32_t>* out) {
    out->assign(1, from);
    for (size_t i = 0; i < out->size(); ++i) {
      for (const auto& [a, t] : dfa_[static_cast<size_t>((*out)[i])].calls) {
        if (nullable[static_cast<size_t>(a)] && std::find(out->begin(), out->end(), t) == out->end()) out->push_back(t);
      }
    }
  };
  std::vector<int32_t> reach;
  for (bool changed = true; changed;) {
    changed = false;
    for (size_t a = 0; a < n_auto; ++a) {
      if (nullable[a] || automaton_start_[a] < 0) continue;
      eps_reach(automaton_start_[a], &reach);
      for (int32_t x : reach)
        if (dfa_[static_cast<size_t>(x)].final) nullable[a] = 1, changed = true;
    }
  }
  // Left-call graph: a -> b when a can call b before consuming a byte.
  std::vector<std::vector<int32_t>> left(n_auto);
  for (size_t a = 0; a < n_auto; ++a) {
    if (automaton_start_[a] < 0) continue;
    eps_reach(automaton_start_[a], &reach);
    for (int32_t x : reach)
      for (const auto& [b, t] : dfa_[static_cast<size_t>(x)].calls) left[a].push_back(b);
  }
  std::vector<uint8_t> color(n_auto, 0);  // 0 new, 1 on path, 2 done
  int32_t cyclic = -1;
  std::function<void(int32_t)> dfs = [&](int32_t a) {
    color[static_cast<size_t>(a)] = 1;
    for (int32_t b : left[static_cast<size_t>(a)]) {
      if (cyclic >= 0) return;
      if (color[static_cast<size_t>(b)] == 1) cyclic = b;
      else if (color[static_cast<size_t>(b)] == 0) dfs(b);
    }
    color[static_cast<size_t>(a)] = 2;
  };
  for (size_t a = 0; a < n_auto && cyclic < 0; ++a)
    if (color[a] == 0) dfs(static_cast<int32_t>(a));
  if (cyclic >= 0)
    return Status::InvalidArgument("grammar rule '" + g_.rule(rule_of_automaton_[static_cast<size_t>(cyclic)]).name +
                                   "' is left-recursive (it can reach itself without consuming input)");
  return Status::Ok();
}

void AutomatonBuilder::Emit(CompiledGrammar* out) {
  const size_t n = dfa_.size(), k = static_cast<size_t>(n_classes_);
  out->n_classes_ = n_classes_;
  std::copy(byte_class_, byte_class_ + 256, out->byte_class_);
  out->next_.assign(n * k, CompiledGrammar::kDead);
  out->flags_.assign(n, 0);
  out->call_begin_.assign(n + 1, 0);
  std::vector<uint8_t> called(automaton_start_.size(), 0);
  for (const DNode& d : dfa_)
    for (const auto& [a, t] : d.calls) called[static_cast<size_t>(a)] = 1;
  for (size_t i = 0; i < n; ++i) {
    const DNode& d = dfa_[i];
    uint8_t f = 0;
    if (d.final) f |= CompiledGrammar::kFinal;
    if (!d.edges.empty()) f |= CompiledGrammar::kHasBytes;
    if (!d.calls.empty()) f |= CompiledGrammar::kHasCalls;
    if (called[static_cast<size_t>(d.automaton)]) f |= CompiledGrammar::kRuleCalled;
    out->flags_[i] = f;
    for (const auto& [r, t] : d.edges)
      for (int c = byte_class_[r.lo]; c <= byte_class_[r.hi]; ++c)
        out->next_[i * k + static_cast<size_t>(c)] = static_cast<uint32_t>(t);
    for (const auto& [a, t] : d.calls)
      out->calls_.push_back({static_cast<uint32_t>(automaton_start_[static_cast<size_t>(a)]), static_cast<uint32_t>(t)});
    out->call_begin_[i + 1] = static_cast<uint32_t>(out->calls_.size());
  }
  for (int32_t s : automaton_start_)
    if (s >= 0) out->rule_start_.push_back(static_cast<uint32_t>(s));
  out->root_start_ = static_cast<uint32_t>(automaton_start_[0]);
  uint64_t h = out->vocab_->fingerprint();
  h = Fnv(h, &out->n_classes_, sizeof(out->n_classes_));
  h = Fnv(h, out->byte_class_, 256);
  h = Fnv(h, out->next_.data(), out->next_.size() * sizeof(uint32_t));
  h = Fnv(h, out->flags_.data(), out->flags_.size());
  h = Fnv(h, out->calls_.data(), out->calls_.size() * sizeof(CompiledGrammar::Call));
  h = Fnv(h, out->call_begin_.data(), out->call_begin_.size() * sizeof(uint32_t));
  h = Fnv(h, &out->root_start_, sizeof(out->root_start_));
  out->fingerprint_ = h;
}

Status AutomatonBuilder::Build(CompiledGrammar* out) {
  PDSERVE_RETURN_IF_ERROR(g_.Validate());
  ChooseKeptRules();
  automaton_start_.assign(rule_of_automaton_.size(), -1);
  for (size_t a = 0; a < rule_of_automaton_.size(); ++a) {
    nfa_.clear();
    memo_.clear();
    nfa_states_ = 0;
    const int32_t end = NewState();
    const int32_t start = BuildExpr(g_.rule(rule_of_automaton_[a]).body, end, 0);
    PDSERVE_RETURN_IF_ERROR(error_);
    PDSERVE_RETURN_IF_ERROR(Determinize(static_cast<int32_t>(a), start, end));
  }
  nfa_.clear();
  nfa_.shrink_to_fit();
  PDSERVE_RETURN_IF_ERROR(PruneAndCheck());
  Minimize();
  PDSERVE_RETURN_IF_ERROR(CheckLeftRecursion());
  Emit(out);
  return Status::Ok();
}

Result<std::shared_ptr<const CompiledGrammar>> CompiledGrammar::Compile(const Grammar& grammar,
                                                                        std::shared_ptr<const Vocabulary> vocabulary,
                                                                        const CompileOptions& options) {
  if (!vocabulary) return Status::InvalidArgument("CompiledGrammar::Compile needs a vocabulary");
  if (options.max_stack_depth < 1) return Status::InvalidArgument("max_stack_depth must be >= 1");
  std::shared_ptr<CompiledGrammar> g(new CompiledGrammar());
  g->vocab_ = std::move(vocabulary);
  g->options_ = options;
  AutomatonBuilder builder(grammar, g->options_);
  PDSERVE_RETURN_IF_ERROR(builder.Build(g.get()));
  g->tokens_ = std::make_unique<std::atomic<const NodeTokens*>[]>(static_cast<size_t>(g->n_nodes()));
  for (int32_t i = 0; i < g->n_nodes(); ++i) g->tokens_[static_cast<size_t>(i)].store(nullptr, std::memory_order_relaxed);
  return std::shared_ptr<const CompiledGrammar>(std::move(g));
}

}  // namespace pdserve::grammar
