#include "grammar/constraint.h"

#include "grammar/ebnf_parser.h"
#include "grammar/regex_parser.h"

namespace pdserve::grammar {

const char* ConstraintKindName(ConstraintKind k) {
  switch (k) {
    case ConstraintKind::kNone: return "none";
    case ConstraintKind::kJsonObject: return "json_object";
    case ConstraintKind::kJsonSchema: return "json_schema";
    case ConstraintKind::kRegex: return "regex";
    case ConstraintKind::kEbnf: return "ebnf";
  }
  return "unknown";
}

std::string Constraint::Key() const {
  std::string key = ConstraintKindName(kind);
  key += '\0';
  key += std::to_string(json.compact) + "," + std::to_string(json.max_whitespace) + "," + std::to_string(json.strict);
  key += '\0';
  key += free_text_until;
  key += '\0';
  key += text;
  return key;
}

Result<Grammar> BuildGrammar(const Constraint& c) {
  Grammar g;
  switch (c.kind) {
    case ConstraintKind::kNone: return Status::InvalidArgument("no constraint to build a grammar from");
    case ConstraintKind::kJsonObject: g = GrammarForJsonObject(c.json); break;
    case ConstraintKind::kJsonSchema: {
      PDSERVE_ASSIGN_OR_RETURN(g, GrammarFromJsonSchema(c.text, c.json));
      break;
    }
    case ConstraintKind::kRegex: {
      PDSERVE_ASSIGN_OR_RETURN(g, GrammarFromRegex(c.text));
      break;
    }
    case ConstraintKind::kEbnf: {
      PDSERVE_ASSIGN_OR_RETURN(g, GrammarFromEbnf(c.text, EbnfOptions{.json = c.json}));
      break;
    }
  }
  if (!c.free_text_until.empty()) {
    const RuleId body = g.root();
    const RuleId root = g.NewRule("constrained_after_free_text");
    g.Define(root, g.Seq({g.Until(c.free_text_until), g.Ref(body)}));
    g.SetRoot(root);
  }
  return g;
}

GrammarCache::GrammarCache(std::shared_ptr<const Vocabulary> vocabulary, size_t capacity, CompileOptions options)
    : vocab_(std::move(vocabulary)), capacity_(capacity), options_(options) {}

Result<std::shared_ptr<const CompiledGrammar>> GrammarCache::Get(const Constraint& constraint) {
  const std::string key = constraint.Key();
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = entries_.find(key);
    if (it != entries_.end()) {
      lru_.splice(lru_.begin(), lru_, it->second.second);
      ++hits_;
      return it->second.first;
    }
    ++misses_;
  }
  PDSERVE_ASSIGN_OR_RETURN(const Grammar g, BuildGrammar(constraint));
  PDSERVE_ASSIGN_OR_RETURN(std::shared_ptr<const CompiledGrammar> compiled, CompiledGrammar::Compile(g, vocab_, options_));
  std::lock_guard<std::mutex> lock(mu_);
  auto it = entries_.find(key);
  if (it != entries_.end()) return it->second.first;  // compiled meanwhile by another thread
  if (capacity_ == 0) return compiled;
  lru_.push_front(key);
  entries_.emplace(key, std::make_pair(compiled, lru_.begin()));
  while (entries_.size() > capacity_) {
    entries_.erase(lru_.back());
    lru_.pop_back();
  }
  return compiled;
}

int64_t GrammarCache::hits() const {
  std::lock_guard<std::mutex> lock(mu_);
  return hits_;
}

int64_t GrammarCache::misses() const {
  std::lock_guard<std::mutex> lock(mu_);
  return misses_;
}

}  // namespace pdserve::grammar
