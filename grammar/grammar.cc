#include "grammar/grammar.h"

#include <algorithm>
#include <cstdio>

#include "grammar/utf8_ranges.h"

namespace pdserve::grammar {

namespace {

constexpr uint32_t kSurrogateLo = 0xD800, kSurrogateHi = 0xDFFF;

// Precedences for printing: an expression needs parentheses inside a tighter context.
constexpr int kPrecAlt = 0, kPrecSeq = 1, kPrecPostfix = 2;

void AppendCodepointEscaped(uint32_t cp, bool in_class, std::string* out) {
  char buf[16];
  switch (cp) {
    case '\n': *out += "\\n"; return;
    case '\r': *out += "\\r"; return;
    case '\t': *out += "\\t"; return;
    case '\\': *out += "\\\\"; return;
    case '"':
      *out += in_class ? "\"" : "\\\"";
      return;
    default: break;
  }
  if (in_class && (cp == ']' || cp == '-' || cp == '^')) {
    *out += '\\';
    *out += static_cast<char>(cp);
    return;
  }
  if (cp < 0x20 || cp == 0x7F) {
    std::snprintf(buf, sizeof(buf), "\\x%02X", cp);
    *out += buf;
  } else if (cp >= 0x80 && cp < 0xA0) {
    std::snprintf(buf, sizeof(buf), "\\u%04X", cp);
    *out += buf;
  } else {
    AppendUtf8(cp, out);
  }
}

}  // namespace

std::vector<CharRange> NormalizeCharRanges(std::vector<CharRange> ranges) {
  std::vector<CharRange> split;
  for (CharRange r : ranges) {
    if (r.lo > r.hi || r.lo > kMaxCodepoint) continue;
    r.hi = std::min(r.hi, kMaxCodepoint);
    // Cut the surrogate block out.
    if (r.lo < kSurrogateLo && r.hi >= kSurrogateLo) {
      split.push_back({r.lo, kSurrogateLo - 1});
      if (r.hi > kSurrogateHi) split.push_back({kSurrogateHi + 1, r.hi});
    } else if (r.lo >= kSurrogateLo && r.lo <= kSurrogateHi) {
      if (r.hi > kSurrogateHi) split.push_back({kSurrogateHi + 1, r.hi});
    } else {
      split.push_back(r);
    }
  }
  std::sort(split.begin(), split.end(), [](CharRange a, CharRange b) { return a.lo < b.lo; });
  std::vector<CharRange> out;
  for (CharRange r : split) {
    if (!out.empty() && r.lo <= out.back().hi + 1) {
      out.back().hi = std::max(out.back().hi, r.hi);
    } else {
      out.push_back(r);
    }
  }
  return out;
}

std::vector<CharRange> ComplementCharRanges(const std::vector<CharRange>& ranges) {
  std::vector<CharRange> out;
  uint32_t next = 0;
  for (CharRange r : ranges) {
    if (r.lo > next) out.push_back({next, r.lo - 1});
    next = r.hi + 1;
  }
  if (next <= kMaxCodepoint) out.push_back({next, kMaxCodepoint});
  return NormalizeCharRanges(std::move(out));
}

ExprId Grammar::Add(Expr e) {
  exprs_.push_back(std::move(e));
  return static_cast<ExprId>(exprs_.size() - 1);
}

ExprId Grammar::Empty() { return Add(Expr{}); }

ExprId Grammar::Bytes(std::string_view bytes) {
  if (bytes.empty()) return Empty();
  Expr e;
  e.kind = ExprKind::kBytes;
  e.bytes = std::string(bytes);
  return Add(std::move(e));
}

ExprId Grammar::ByteSet(std::vector<ByteRange> ranges) {
  std::sort(ranges.begin(), ranges.end(), [](ByteRange a, ByteRange b) { return a.lo < b.lo; });
  std::vector<ByteRange> merged;
  for (ByteRange r : ranges) {
    if (r.lo > r.hi) continue;
    if (!merged.empty() && r.lo <= merged.back().hi + 1) {
      merged.back().hi = std::max(merged.back().hi, r.hi);
    } else {
      merged.push_back(r);
    }
  }
  Expr e;
  e.kind = ExprKind::kByteSet;
  e.byte_ranges = std::move(merged);
  return Add(std::move(e));
}

ExprId Grammar::CharSet(std::vector<CharRange> ranges, bool negated) {
  std::vector<CharRange> norm = NormalizeCharRanges(std::move(ranges));
  Expr e;
  e.kind = ExprKind::kCharSet;
  e.char_ranges = negated ? ComplementCharRanges(norm) : std::move(norm);
  return Add(std::move(e));
}

ExprId Grammar::Seq(std::vector<ExprId> children) {
  if (children.empty()) return Empty();
  if (children.size() == 1) return children[0];
  Expr e;
  e.kind = ExprKind::kSeq;
  e.children = std::move(children);
  return Add(std::move(e));
}

ExprId Grammar::Alt(std::vector<ExprId> children) {
  if (children.size() == 1) return children[0];
  Expr e;
  e.kind = ExprKind::kAlt;  // an empty alternative matches nothing
  e.children = std::move(children);
  return Add(std::move(e));
}

ExprId Grammar::Repeat(ExprId child, int32_t min, int32_t max) {
  Expr e;
  e.kind = ExprKind::kRepeat;
  e.children = {child};
  e.min = min;
  e.max = max;
  return Add(std::move(e));
}

ExprId Grammar::Ref(RuleId rule) {
  Expr e;
  e.kind = ExprKind::kRuleRef;
  e.rule = rule;
  return Add(std::move(e));
}

ExprId Grammar::Until(std::string_view marker) {
  Expr e;
  e.kind = ExprKind::kUntil;
  e.bytes = std::string(marker);
  return Add(std::move(e));
}

RuleId Grammar::DeclareRule(std::string_view name) {
  if (RuleId r = FindRule(name); r >= 0) return r;
  rules_.push_back(Rule{std::string(name), -1});
  return static_cast<RuleId>(rules_.size() - 1);
}

RuleId Grammar::NewRule(std::string_view hint) {
  std::string name(hint);
  for (int k = 2; FindRule(name) >= 0; ++k) name = std::string(hint) + "_" + std::to_string(k);
  rules_.push_back(Rule{name, -1});
  return static_cast<RuleId>(rules_.size() - 1);
}

void Grammar::Define(RuleId rule, ExprId body) { rules_[static_cast<size_t>(rule)].body = body; }

RuleId Grammar::FindRule(std::string_view name) const {
  for (size_t i = 0; i < rules_.size(); ++i)
    if (rules_[i].name == name) return static_cast<RuleId>(i);
  return -1;
}

Status Grammar::Validate() const {
  if (root_ < 0 || root_ >= n_rules()) return Status::InvalidArgument("grammar has no root rule");
  for (const Rule& r : rules_)
    if (r.body < 0 || r.body >= n_exprs())
      return Status::InvalidArgument("grammar rule '" + r.name + "' is used but never defined");
  for (const Expr& e : exprs_) {
    for (ExprId c : e.children)
      if (c < 0 || c >= n_exprs()) return Status::InvalidArgument("grammar expression refers to a missing expression");
    if (e.kind == ExprKind::kRuleRef && (e.rule < 0 || e.rule >= n_rules()))
      return Status::InvalidArgument("grammar expression refers to a missing rule");
    if (e.kind == ExprKind::kUntil && e.bytes.empty())
      return Status::InvalidArgument("grammar %until needs a non-empty marker");
    if (e.kind == ExprKind::kRepeat &&
        (e.children.size() != 1 || e.min < 0 || (e.max != kUnbounded && e.max < e.min)))
      return Status::InvalidArgument("grammar repetition has bounds {" + std::to_string(e.min) + "," +
                                     std::to_string(e.max) + "}");
  }
  return Status::Ok();
}

std::string Grammar::ExprToEbnf(ExprId id, int parent_precedence) const {
  const Expr& e = expr(id);
  std::string out;
  switch (e.kind) {
    case ExprKind::kEmpty:
      return "\"\"";
    case ExprKind::kBytes: {
      // Valid UTF-8 runs as string literals, other bytes as %xHH.
      std::vector<std::string> parts;
      std::string run;
      size_t i = 0;
      while (i < e.bytes.size()) {
        uint32_t cp = 0;
        const int n = DecodeUtf8(std::string_view(e.bytes).substr(i), &cp);
        if (n > 0) {
          AppendCodepointEscaped(cp, false, &run);
          i += static_cast<size_t>(n);
        } else {
          if (!run.empty()) parts.push_back("\"" + run + "\""), run.clear();
          char buf[8];
          std::snprintf(buf, sizeof(buf), "%%x%02X", static_cast<uint8_t>(e.bytes[i]));
          parts.push_back(buf);
          ++i;
        }
      }
      if (!run.empty()) parts.push_back("\"" + run + "\"");
      for (size_t k = 0; k < parts.size(); ++k) out += (k ? " " : "") + parts[k];
      if (parts.size() > 1 && parent_precedence > kPrecSeq) out = "(" + out + ")";
      return out;
    }
    case ExprKind::kByteSet: {
      if (e.byte_ranges.empty()) return "[]";
      std::vector<std::string> parts;
      for (ByteRange r : e.byte_ranges) {
        char buf[16];
        if (r.lo == r.hi) std::snprintf(buf, sizeof(buf), "%%x%02X", r.lo);
        else std::snprintf(buf, sizeof(buf), "%%x%02X-%02X", r.lo, r.hi);
        parts.push_back(buf);
      }
      for (size_t k = 0; k < parts.size(); ++k) out += (k ? " | " : "") + parts[k];
      if (parts.size() > 1 && parent_precedence > kPrecAlt) out = "(" + out + ")";
      return out;
    }
    case ExprKind::kCharSet: {
      out = "[";
      for (CharRange r : e.char_ranges) {
        AppendCodepointEscaped(r.lo, true, &out);
        if (r.hi != r.lo) {
          out += '-';
          AppendCodepointEscaped(r.hi, true, &out);
        }
      }
      return out + "]";
    }
    case ExprKind::kSeq: {
      for (size_t k = 0; k < e.children.size(); ++k)
        out += (k ? " " : "") + ExprToEbnf(e.children[k], kPrecSeq + 1);
      return parent_precedence > kPrecSeq ? "(" + out + ")" : out;
    }
    case ExprKind::kAlt: {
      if (e.children.empty()) return "[]";
      for (size_t k = 0; k < e.children.size(); ++k)
        out += (k ? " | " : "") + ExprToEbnf(e.children[k], kPrecAlt + 1);
      return parent_precedence > kPrecAlt ? "(" + out + ")" : out;
    }
    case ExprKind::kRepeat: {
      out = ExprToEbnf(e.children[0], kPrecPostfix + 1);
      if (e.min == 0 && e.max == kUnbounded) out += "*";
      else if (e.min == 1 && e.max == kUnbounded) out += "+";
      else if (e.min == 0 && e.max == 1) out += "?";
      else if (e.max == kUnbounded) out += "{" + std::to_string(e.min) + ",}";
      else if (e.min == e.max) out += "{" + std::to_string(e.min) + "}";
      else out += "{" + std::to_string(e.min) + "," + std::to_string(e.max) + "}";
      return out;
    }
    case ExprKind::kRuleRef:
      return rule(e.rule).name;
    case ExprKind::kUntil: {
      Grammar tmp;
      return "%until " + tmp.ExprToEbnf(tmp.Bytes(e.bytes), kPrecPostfix + 1);
    }
  }
  return out;
}

std::string Grammar::ToEbnf() const {
  std::string out;
  auto print = [&](RuleId r) {
    out += rule(r).name + " ::= ";
    out += rule(r).body >= 0 ? ExprToEbnf(rule(r).body, kPrecAlt) : "[]";
    out += "\n";
  };
  if (root_ >= 0) print(root_);
  for (RuleId r = 0; r < n_rules(); ++r)
    if (r != root_) print(r);
  return out;
}

}  // namespace pdserve::grammar
