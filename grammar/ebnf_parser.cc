#include "grammar/ebnf_parser.h"

#include <optional>
#include <set>

#include "grammar/regex_parser.h"
#include "grammar/utf8_ranges.h"

namespace pdserve::grammar {

namespace {

constexpr int32_t kMaxRepeat = 10000;

bool IsNameStart(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }
bool IsNameChar(char c) { return IsNameStart(c) || (c >= '0' && c <= '9') || c == '-'; }
int HexValue(char c) {
  return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
}

class EbnfParser {
 public:
  EbnfParser(std::string_view text, const EbnfOptions& o) : s_(text), o_(o) {}

  Result<Grammar> Parse() {
    std::set<std::string> defined;
    RuleId first = -1;
    SkipSpace();
    while (!AtEnd()) {
      const size_t at = pos_;
      const std::string name = Name();
      if (name.empty()) return Fail("expected a rule name"), error_;
      SkipSpace();
      if (!Eat("::=")) return Fail("expected '::=' after rule name '" + name + "'"), error_;
      if (!defined.insert(name).second) {
        pos_ = at;
        return Fail("rule '" + name + "' is defined twice"), error_;
      }
      const RuleId rule = g_.DeclareRule(name);
      if (first < 0) first = rule;
      const ExprId body = Alternation();
      if (!error_.ok()) return error_;
      g_.Define(rule, body);
      SkipSpace();
    }
    if (first < 0) return Status::InvalidArgument("ebnf: the grammar has no rules");
    const RuleId root = g_.FindRule("root");
    g_.SetRoot(root >= 0 ? root : first);
    for (RuleId r = 0; r < g_.n_rules(); ++r)
      if (g_.rule(r).body < 0) return Status::InvalidArgument("ebnf: rule '" + g_.rule(r).name + "' is used but never defined");
    PDSERVE_RETURN_IF_ERROR(g_.Validate());
    return std::move(g_);
  }

 private:
  bool AtEnd() const { return pos_ >= s_.size(); }
  char Peek() const { return AtEnd() ? '\0' : s_[pos_]; }
  bool Eat(std::string_view t) {
    if (s_.substr(pos_, t.size()) == t) {
      pos_ += t.size();
      return true;
    }
    return false;
  }
  std::string LineColumn(size_t at) const {
    int line = 1, col = 1;
    for (size_t i = 0; i < at && i < s_.size(); ++i) {
      if (s_[i] == '\n') ++line, col = 1;
      else ++col;
    }
    return "line " + std::to_string(line) + ":" + std::to_string(col);
  }
  void Fail(const std::string& what) {
    if (error_.ok()) error_ = Status::InvalidArgument("ebnf: " + what + " at " + LineColumn(pos_));
  }
  void SkipSpace() {
    while (!AtEnd()) {
      const char c = Peek();
      if (c == ' ' || c == '\t' || c == '\n' || c == '\r') {
        ++pos_;
      } else if (c == '#') {
        while (!AtEnd() && Peek() != '\n') ++pos_;
      } else {
        break;
      }
    }
  }
  std::string Name() {
    if (!IsNameStart(Peek())) return "";
    const size_t start = pos_;
    while (!AtEnd() && IsNameChar(Peek())) ++pos_;
    return std::string(s_.substr(start, pos_ - start));
  }
  // Whether a new rule starts here (name ::=): the current rule ends before it.
  bool AtRuleStart() {
    const size_t save = pos_;
    const std::string name = Name();
    SkipSpace();
    const bool yes = !name.empty() && s_.substr(pos_, 3) == "::=";
    pos_ = save;
    return yes;
  }

  ExprId Alternation() {
    std::vector<ExprId> alts;
    do {
      alts.push_back(Sequence());
      if (!error_.ok()) return 0;
      SkipSpace();
    } while (Eat("|"));
    return g_.Alt(std::move(alts));
  }

  ExprId Sequence() {
    std::vector<ExprId> items;
    while (true) {
      SkipSpace();
      if (AtEnd() || Peek() == '|' || Peek() == ')' || AtRuleStart()) break;
      items.push_back(Postfix());
      if (!error_.ok()) return 0;
    }
    return g_.Seq(std::move(items));
  }

  std::optional<int32_t> Number() {
    const size_t start = pos_;
    int64_t v = 0;
    while (!AtEnd() && Peek() >= '0' && Peek() <= '9') v = std::min<int64_t>(v * 10 + (s_[pos_++] - '0'), 1'000'000'000);
    if (pos_ == start) return std::nullopt;
    return static_cast<int32_t>(v);
  }

  ExprId Postfix() {
    ExprId e = Primary();
    while (error_.ok()) {
      if (Eat("*")) e = g_.Star(e);
      else if (Eat("+")) e = g_.Plus(e);
      else if (Eat("?")) e = g_.Optional(e);
      else if (Peek() == '{') {
        ++pos_;
        SkipSpace();
        auto lo = Number();
        if (!lo) return Fail("expected a number in {n,m}"), 0;
        int32_t hi = *lo;
        SkipSpace();
        if (Eat(",")) {
          SkipSpace();
          auto h = Number();
          hi = h ? *h : kUnbounded;
          SkipSpace();
        }
        if (!Eat("}")) return Fail("expected '}'"), 0;
        if (*lo > kMaxRepeat || hi > kMaxRepeat) return Fail("repetition count above " + std::to_string(kMaxRepeat)), 0;
        if (hi != kUnbounded && hi < *lo) return Fail("repetition {n,m} with m < n"), 0;
        e = g_.Repeat(e, *lo, hi);
      } else {
        break;
      }
    }
    return e;
  }

  // One (possibly escaped) character of a literal or class; nullopt on error.
  std::optional<uint32_t> Char() {
    if (AtEnd()) return Fail("unexpected end of text"), std::nullopt;
    if (Peek() != '\\') {
      uint32_t cp = 0;
      const int n = DecodeUtf8(s_.substr(pos_), &cp);
      if (n == 0) return Fail("text is not valid UTF-8"), std::nullopt;
      pos_ += static_cast<size_t>(n);
      return cp;
    }
    ++pos_;
    if (AtEnd()) return Fail("unexpected end after '\\'"), std::nullopt;
    const char c = s_[pos_++];
    auto hex = [&](int digits) -> std::optional<uint32_t> {
      uint32_t v = 0;
      for (int i = 0; i < digits; ++i) {
        const int h = HexValue(Peek());
        if (h < 0) return Fail("bad hex escape"), std::nullopt;
        v = v * 16 + static_cast<uint32_t>(h);
        ++pos_;
      }
      if (v > kMaxCodepoint || (v >= 0xD800 && v <= 0xDFFF)) return Fail("escape is not a Unicode scalar value"), std::nullopt;
      return v;
    };
    switch (c) {
      case 'n': return '\n';
      case 'r': return '\r';
      case 't': return '\t';
      case 'x': return hex(2);
      case 'u': return hex(4);
      case 'U': return hex(8);
      default: return static_cast<uint8_t>(c);  // \\ \" \' \] \- \^ and any other
    }
  }

  ExprId Primary() {
    const char c = Peek();
    if (c == '"' || c == '\'') {
      ++pos_;
      std::string bytes;
      while (!AtEnd() && Peek() != c) {
        auto cp = Char();
        if (!cp) return 0;
        AppendUtf8(*cp, &bytes);
      }
      if (!Eat(std::string(1, c))) return Fail("unterminated string literal"), 0;
      return g_.Bytes(bytes);
    }
    if (c == '[') {
      ++pos_;
      const bool negated = Eat("^");
      std::vector<CharRange> ranges;
      while (!AtEnd() && Peek() != ']') {
        auto lo = Char();
        if (!lo) return 0;
        uint32_t hi = *lo;
        if (Peek() == '-' && pos_ + 1 < s_.size() && s_[pos_ + 1] != ']') {
          ++pos_;
          auto h = Char();
          if (!h) return 0;
          hi = *h;
          if (hi < *lo) return Fail("character range out of order"), 0;
        }
        ranges.push_back({*lo, hi});
      }
      if (!Eat("]")) return Fail("unterminated character class"), 0;
      return g_.CharSet(std::move(ranges), negated);
    }
    if (c == '(') {
      ++pos_;
      const ExprId inner = Alternation();
      if (!error_.ok()) return 0;
      SkipSpace();
      if (!Eat(")")) return Fail("expected ')'"), 0;
      return inner;
    }
    if (c == '.') {
      ++pos_;
      return g_.CharSet({{0, kMaxCodepoint}});
    }
    if (Eat("%x")) {
      auto byte = [&]() -> int {
        const int a = HexValue(Peek()), b = a < 0 ? -1 : HexValue(pos_ + 1 < s_.size() ? s_[pos_ + 1] : '\0');
        if (a < 0 || b < 0) return -1;
        pos_ += 2;
        return a * 16 + b;
      };
      const int lo = byte();
      if (lo < 0) return Fail("%x needs two hex digits"), 0;
      int hi = lo;
      if (Eat("-")) {
        hi = byte();
        if (hi < lo) return Fail("bad %x byte range"), 0;
      }
      return g_.ByteSet({{static_cast<uint8_t>(lo), static_cast<uint8_t>(hi)}});
    }
    if (Eat("%json")) return JsonDirective();
    if (Eat("%until")) {
      SkipSpace();
      if (Peek() != '"' && Peek() != '\'') return Fail("%until needs a string literal"), 0;
      const ExprId lit = Primary();
      if (!error_.ok()) return 0;
      const Expr& e = g_.expr(lit);
      if (e.kind != ExprKind::kBytes) return Fail("%until needs a non-empty marker"), 0;
      return g_.Until(std::string(e.bytes));
    }
    if (Eat("%regex")) {
      SkipSpace();
      if (Peek() != '"' && Peek() != '\'') return Fail("%regex needs a string literal"), 0;
      const char q = s_[pos_++];
      std::string pattern;
      while (!AtEnd() && Peek() != q) {
        auto cp = Char();
        if (!cp) return 0;
        AppendUtf8(*cp, &pattern);
      }
      if (!Eat(std::string(1, q))) return Fail("unterminated string literal"), 0;
      auto r = AddRegex(&g_, pattern);
      if (!r.ok()) return Fail(r.status().message()), 0;
      return *r;
    }
    if (IsNameStart(c)) return g_.Ref(g_.DeclareRule(Name()));
    return Fail(std::string("unexpected '") + c + "'"), 0;
  }

  // %json followed by a JSON value (object, array, true or false): scanned by brackets.
  ExprId JsonDirective() {
    SkipSpace();
    const size_t start = pos_;
    if (Eat("true") || Eat("false")) {
    } else if (Peek() == '{' || Peek() == '[') {
      int depth = 0;
      bool in_string = false;
      while (!AtEnd()) {
        const char c = s_[pos_++];
        if (in_string) {
          if (c == '\\') ++pos_;
          else if (c == '"') in_string = false;
        } else if (c == '"') {
          in_string = true;
        } else if (c == '{' || c == '[') {
          ++depth;
        } else if (c == '}' || c == ']') {
          if (--depth == 0) break;
        }
      }
      if (depth != 0) return Fail("unterminated %json schema"), 0;
    } else {
      return Fail("%json needs a schema ({...}, true or false)"), 0;
    }
    return EmbedSchemaText(s_.substr(start, pos_ - start), "at " + LineColumn(start));
  }

  ExprId EmbedSchemaText(std::string_view schema, const std::string& where);

  std::string_view s_;
  EbnfOptions o_;
  size_t pos_ = 0;
  Status error_;
  Grammar g_;
  int n_json_ = 0;
};

ExprId EbnfParser::EmbedSchemaText(std::string_view schema, const std::string& where) {
  auto r = AddJsonSchema(&g_, schema, o_.json, "ebnf %json " + where, "json" + std::to_string(n_json_++) + "_");
  if (!r.ok()) {
    error_ = r.status();
    return 0;
  }
  return *r;
}

}  // namespace

Result<Grammar> GrammarFromEbnf(std::string_view text, const EbnfOptions& options) {
  return EbnfParser(text, options).Parse();
}

}  // namespace pdserve::grammar
