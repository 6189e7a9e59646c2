// Grammar: the intermediate form every constraint is written in before it is compiled
// (compiled_grammar.h). A grammar is a set of named rules; each rule's body is an expression
// over bytes: literal byte strings, byte sets, Unicode character sets (matched as UTF-8),
// sequences, alternatives, bounded or unbounded repetition and references to rules. Rules may
// refer to each other recursively (JSON nesting, recursive $ref); left recursion is refused at
// compile time.
//
// The front ends build one: JSON Schema (json_schema.h), regex (regex_parser.h), EBNF
// (ebnf_parser.h); tests and tools may also build one by hand with the methods below.
//
// Expressions live in the grammar's arena and are named by ExprId; an ExprId is only meaningful
// for the grammar that made it. Building never fails; Validate() reports what is wrong (an
// undefined rule, no root) so a front end can report it as the user's error.
//
// Thread-safety: a value type; building is single-threaded, a finished grammar is read-only.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace pdserve::grammar {

using ExprId = int32_t;
using RuleId = int32_t;

// Inclusive ranges.
struct ByteRange {
  uint8_t lo = 0, hi = 0;
  bool operator==(const ByteRange&) const = default;
};
struct CharRange {
  uint32_t lo = 0, hi = 0;  // Unicode scalar values (surrogates are never matched)
  bool operator==(const CharRange&) const = default;
};

constexpr uint32_t kMaxCodepoint = 0x10FFFF;
constexpr int32_t kUnbounded = -1;

enum class ExprKind : uint8_t {
  kEmpty,    // matches ""
  kBytes,    // the literal byte string `bytes`
  kByteSet,  // one byte in `byte_ranges`
  kCharSet,  // one UTF-8 encoded character in `char_ranges` (sorted, disjoint, non-adjacent)
  kSeq,      // children in order
  kAlt,      // any one child
  kRepeat,   // child repeated min..max times (max == kUnbounded: no bound)
  kRuleRef,  // the body of rule `rule`
  kUntil,    // any bytes that end with `bytes` and hold it nowhere earlier (free text up to a
             // marker, e.g. reasoning up to "</think>")
};

struct Expr {
  ExprKind kind = ExprKind::kEmpty;
  std::string bytes;
  std::vector<ByteRange> byte_ranges;
  std::vector<CharRange> char_ranges;
  std::vector<ExprId> children;
  int32_t min = 0, max = 0;
  RuleId rule = -1;
};

struct Rule {
  std::string name;
  ExprId body = -1;  // -1: declared, not (yet) defined
};

// Sorts and merges ranges; drops surrogates and values beyond kMaxCodepoint.
std::vector<CharRange> NormalizeCharRanges(std::vector<CharRange> ranges);
// The complement within [0, kMaxCodepoint] minus surrogates. REQUIRES: normalized input.
std::vector<CharRange> ComplementCharRanges(const std::vector<CharRange>& ranges);

class Grammar {
 public:
  // ---- expressions ----
  ExprId Empty();
  ExprId Bytes(std::string_view bytes);  // "" gives Empty()
  ExprId ByteSet(std::vector<ByteRange> ranges);
  ExprId CharSet(std::vector<CharRange> ranges, bool negated = false);
  ExprId Char(uint32_t codepoint) { return CharSet({{codepoint, codepoint}}); }
  ExprId Seq(std::vector<ExprId> children);
  ExprId Alt(std::vector<ExprId> children);
  ExprId Repeat(ExprId child, int32_t min, int32_t max);
  ExprId Star(ExprId child) { return Repeat(child, 0, kUnbounded); }
  ExprId Plus(ExprId child) { return Repeat(child, 1, kUnbounded); }
  ExprId Optional(ExprId child) { return Repeat(child, 0, 1); }
  ExprId Ref(RuleId rule);
  ExprId Until(std::string_view marker);  // REQUIRES: marker non-empty

  // ---- rules ----
  // Declares a rule (or returns the existing one of that name) without a body yet.
  RuleId DeclareRule(std::string_view name);
  // A rule named `hint`, or hint_2, hint_3, ... when taken: for generated grammars.
  RuleId NewRule(std::string_view hint);
  void Define(RuleId rule, ExprId body);
  RuleId FindRule(std::string_view name) const;  // -1 when absent
  void SetRoot(RuleId rule) { root_ = rule; }

  RuleId root() const { return root_; }
  const Expr& expr(ExprId id) const { return exprs_[static_cast<size_t>(id)]; }
  const Rule& rule(RuleId id) const { return rules_[static_cast<size_t>(id)]; }
  int32_t n_exprs() const { return static_cast<int32_t>(exprs_.size()); }
  int32_t n_rules() const { return static_cast<int32_t>(rules_.size()); }

  // Errors: InvalidArgument when there is no root, a rule has no body (naming it) or an
  // expression refers to something that does not exist.
  Status Validate() const;

  // The grammar in pdserve's EBNF (ebnf_parser.h): a stable text form, used for logs and as
  // the cache key of compiled grammars. Parsing it back gives an equivalent grammar.
  std::string ToEbnf() const;

 private:
  ExprId Add(Expr e);
  std::string ExprToEbnf(ExprId id, int parent_precedence) const;

  std::vector<Expr> exprs_;
  std::vector<Rule> rules_;
  RuleId root_ = -1;
};

}  // namespace pdserve::grammar
