// Constraint: what a request asks its output to follow, in the form that travels with the
// request (router -> prefill -> decode, and on migration); GrammarCache: compiled grammars by
// constraint, shared by the requests of one worker.
//
// Router: BuildGrammar(constraint) validates a request up front: InvalidArgument is the
// user's error (HTTP 400; the message names the schema keyword and its JSON pointer).
// Worker: cache.Get(constraint) compiles (or finds) the grammar; a GrammarMatcher per request
// then replays the output tokens the request already has (the first token sampled by
// prefill; a migrated request's earlier output) and gives a mask per step.
//
// Thread-safety: Constraint is a value; BuildGrammar is pure; GrammarCache is thread-safe
// (compiles run on the calling thread, outside its lock).
#pragma once

#include <cstdint>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>

#include "common/status.h"
#include "grammar/compiled_grammar.h"
#include "grammar/grammar.h"
#include "grammar/json_schema.h"

namespace pdserve::grammar {

enum class ConstraintKind : uint8_t {
  kNone,        // unconstrained
  kJsonObject,  // any JSON object (response_format json_object); text unused
  kJsonSchema,  // text: a JSON Schema (response_format json_schema's "schema")
  kRegex,       // text: a regex the whole output matches (pdserve extension)
  kEbnf,        // text: a grammar in pdserve's EBNF (extension; the tool-call grammars too)
};
const char* ConstraintKindName(ConstraintKind k);

struct Constraint {
  ConstraintKind kind = ConstraintKind::kNone;
  std::string text{};
  // Non-empty: the output first holds free text up to and including this marker, and the
  // constraint applies after it (thinking mode: "</think>" ends the reasoning).
  std::string free_text_until{};
  JsonSchemaOptions json{};  // json_object / json_schema output shape

  bool active() const { return kind != ConstraintKind::kNone; }
  // A byte string identifying the constraint (cache key; equal keys compile equally).
  std::string Key() const;
  bool operator==(const Constraint&) const = default;
};

// Errors: InvalidArgument from the front end (json_schema.h, regex_parser.h, ebnf_parser.h),
// or for kNone.
Result<Grammar> BuildGrammar(const Constraint& constraint);

class GrammarCache {
 public:
  // `capacity` compiled grammars are kept (least recently used dropped; a request keeps its
  // own reference). Each holds its automaton plus the token sets of the nodes used so far.
  GrammarCache(std::shared_ptr<const Vocabulary> vocabulary, size_t capacity = 64, CompileOptions options = {});

  // Errors: those of BuildGrammar and CompiledGrammar::Compile.
  Result<std::shared_ptr<const CompiledGrammar>> Get(const Constraint& constraint);

  const Vocabulary& vocabulary() const { return *vocab_; }
  int64_t hits() const;
  int64_t misses() const;

 private:
  // Immutable after construction.
  const std::shared_ptr<const Vocabulary> vocab_;
  const size_t capacity_;
  const CompileOptions options_;

  mutable std::mutex mu_;
  std::list<std::string> lru_;  // guarded by mu_
  std::unordered_map<std::string, std::pair<std::shared_ptr<const CompiledGrammar>, std::list<std::string>::iterator>>
      entries_;                 // guarded by mu_
  int64_t hits_ = 0, misses_ = 0;  // guarded by mu_
};

}  // namespace pdserve::grammar
