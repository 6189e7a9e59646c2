#include "grammar/regex_parser.h"

#include <cstdio>
#include <optional>

#include "grammar/utf8_ranges.h"

namespace pdserve::grammar {

namespace {

constexpr int32_t kMaxRepeat = 10000;

const std::vector<CharRange>& Digits() {
  static const std::vector<CharRange> r = {{'0', '9'}};
  return r;
}
const std::vector<CharRange>& WordChars() {
  static const std::vector<CharRange> r = {{'0', '9'}, {'A', 'Z'}, {'_', '_'}, {'a', 'z'}};
  return r;
}
// ECMAScript WhiteSpace and LineTerminator.
const std::vector<CharRange>& SpaceChars() {
  static const std::vector<CharRange> r = NormalizeCharRanges(
      {{0x09, 0x0D}, {0x20, 0x20}, {0xA0, 0xA0}, {0x1680, 0x1680}, {0x2000, 0x200A}, {0x2028, 0x2029},
       {0x202F, 0x202F}, {0x205F, 0x205F}, {0x3000, 0x3000}, {0xFEFF, 0xFEFF}});
  return r;
}

class RegexParser {
 public:
  RegexParser(Grammar* g, const RegexOptions& o) : g_(g), o_(o) {}

  Result<ExprId> Parse(std::string_view pattern) {
    for (size_t i = 0; i < pattern.size();) {
      uint32_t cp = 0;
      const int n = DecodeUtf8(pattern.substr(i), &cp);
      if (n == 0) return Status::InvalidArgument("regex: not valid UTF-8 (byte offset " + std::to_string(i) + ")");
      cps_.push_back(cp);
      i += static_cast<size_t>(n);
    }
    std::vector<ExprId> alternatives;
    while (true) {
      const bool anchored_start = Eat('^');
      std::vector<ExprId> items;
      bool anchored_end = false;
      while (!AtEnd() && Peek() != '|') {
        if (Peek() == '$' && (pos_ + 1 == cps_.size() || cps_[pos_ + 1] == '|')) {
          ++pos_;
          anchored_end = true;
          break;
        }
        if (Peek() == ')') return Fail("unmatched ')'"), error_;
        const ExprId item = ParseQuantified();
        if (!error_.ok()) return error_;
        items.push_back(item);
      }
      if (o_.search && !anchored_start) items.insert(items.begin(), AnyStar());
      if (o_.search && !anchored_end) items.push_back(AnyStar());
      alternatives.push_back(g_->Seq(std::move(items)));
      if (!Eat('|')) break;
    }
    if (!AtEnd()) return Fail("unexpected character"), error_;
    return g_->Alt(std::move(alternatives));
  }

 private:
  bool AtEnd() const { return pos_ >= cps_.size(); }
  uint32_t Peek() const { return cps_[pos_]; }
  bool Eat(uint32_t c) {
    if (!AtEnd() && Peek() == c) {
      ++pos_;
      return true;
    }
    return false;
  }
  void Fail(const std::string& what) {
    if (error_.ok()) error_ = Status::InvalidArgument("regex: " + what + " at offset " + std::to_string(pos_));
  }

  ExprId Chars(const std::vector<CharRange>& ranges) {
    return o_.json_string ? JsonStringChars(g_, ranges) : g_->CharSet(ranges);
  }
  ExprId AnyStar() { return g_->Star(Chars({{0, kMaxCodepoint}})); }

  ExprId ParseAlternation() {
    std::vector<ExprId> alternatives;
    do {
      std::vector<ExprId> items;
      while (!AtEnd() && Peek() != '|' && Peek() != ')') {
        items.push_back(ParseQuantified());
        if (!error_.ok()) return 0;
      }
      alternatives.push_back(g_->Seq(std::move(items)));
    } while (Eat('|'));
    return g_->Alt(std::move(alternatives));
  }

  std::optional<int32_t> ParseNumber() {
    int64_t v = 0;
    size_t start = pos_;
    while (!AtEnd() && Peek() >= '0' && Peek() <= '9') {
      v = v * 10 + (Peek() - '0');
      if (v > 1'000'000'000) v = 1'000'000'000;
      ++pos_;
    }
    if (pos_ == start) return std::nullopt;
    return static_cast<int32_t>(v);
  }

  // {n}, {n,}, {n,m} at pos_ (which is at '{'); nullopt (pos_ unchanged) when it is not one.
  std::optional<std::pair<int32_t, int32_t>> TryBraces() {
    const size_t save = pos_;
    ++pos_;
    auto lo = ParseNumber();
    if (!lo) return pos_ = save, std::nullopt;
    int32_t hi = *lo;
    if (Eat(',')) {
      auto h = ParseNumber();
      hi = h ? *h : kUnbounded;
    }
    if (!Eat('}')) return pos_ = save, std::nullopt;
    return std::make_pair(*lo, hi);
  }

  ExprId ParseQuantified() {
    const ExprId atom = ParseAtom();
    if (!error_.ok() || AtEnd()) return atom;
    int32_t lo = -1, hi = -1;
    const uint32_t c = Peek();
    if (c == '*') lo = 0, hi = kUnbounded, ++pos_;
    else if (c == '+') lo = 1, hi = kUnbounded, ++pos_;
    else if (c == '?') lo = 0, hi = 1, ++pos_;
    else if (c == '{') {
      if (auto b = TryBraces()) lo = b->first, hi = b->second;
    }
    if (lo < 0) return atom;
    if (hi != kUnbounded && hi < lo) return Fail("repetition {" + std::to_string(lo) + "," + std::to_string(hi) + "} has max < min"), 0;
    if (lo > kMaxRepeat || hi > kMaxRepeat) return Fail("repetition count above " + std::to_string(kMaxRepeat)), 0;
    Eat('?');  // lazy: same language
    if (!AtEnd() && (Peek() == '*' || Peek() == '+' || Peek() == '?')) return Fail("nothing to repeat"), 0;
    return g_->Repeat(atom, lo, hi);
  }

  ExprId ParseAtom() {
    const uint32_t c = Peek();
    switch (c) {
      case '(': {
        ++pos_;
        if (Eat('?')) {
          if (Eat(':')) {
          } else if (!AtEnd() && Peek() == '<' && pos_ + 1 < cps_.size() && cps_[pos_ + 1] != '=' &&
                     cps_[pos_ + 1] != '!') {
            while (!AtEnd() && Peek() != '>') ++pos_;  // named group: the name does not matter
            if (!Eat('>')) return Fail("unterminated group name"), 0;
          } else {
            return Fail("lookaround assertions are not supported"), 0;
          }
        }
        const ExprId inner = ParseAlternation();
        if (!error_.ok()) return 0;
        if (!Eat(')')) return Fail("missing ')'"), 0;
        return inner;
      }
      case '[': return ParseClass();
      case '.':
        ++pos_;
        return Chars(ComplementCharRanges(NormalizeCharRanges({{'\n', '\n'}, {'\r', '\r'}, {0x2028, 0x2029}})));
      case '\\': {
        ++pos_;
        std::vector<CharRange> set;
        if (!ParseEscape(/*in_class=*/false, &set)) return 0;
        return Chars(set);
      }
      case '^':
      case '$': return Fail("anchors are supported only at the start or end of the pattern"), 0;
      case '*':
      case '+':
      case '?': return Fail("nothing to repeat"), 0;
      case '{':
        if (TryBraces()) return Fail("nothing to repeat"), 0;
        ++pos_;
        return Chars({{c, c}});
      default:
        ++pos_;
        return Chars({{c, c}});
    }
  }

  // After a backslash. Fills *set; false on error.
  bool ParseEscape(bool in_class, std::vector<CharRange>* set) {
    if (AtEnd()) return Fail("pattern ends with a backslash"), false;
    const uint32_t c = Peek();
    ++pos_;
    auto one = [&](uint32_t cp) { *set = {{cp, cp}}; return true; };
    auto hex = [&](int digits, uint32_t* out) {
      uint32_t v = 0;
      for (int i = 0; i < digits; ++i) {
        if (AtEnd()) return false;
        const uint32_t h = Peek();
        int d = h >= '0' && h <= '9' ? static_cast<int>(h - '0')
                : h >= 'a' && h <= 'f' ? static_cast<int>(h - 'a' + 10)
                : h >= 'A' && h <= 'F' ? static_cast<int>(h - 'A' + 10) : -1;
        if (d < 0) return false;
        v = v * 16 + static_cast<uint32_t>(d);
        ++pos_;
      }
      *out = v;
      return true;
    };
    switch (c) {
      case 'd': *set = Digits(); return true;
      case 'D': *set = ComplementCharRanges(NormalizeCharRanges(Digits())); return true;
      case 'w': *set = WordChars(); return true;
      case 'W': *set = ComplementCharRanges(NormalizeCharRanges(WordChars())); return true;
      case 's': *set = SpaceChars(); return true;
      case 'S': *set = ComplementCharRanges(SpaceChars()); return true;
      case 'n': return one('\n');
      case 'r': return one('\r');
      case 't': return one('\t');
      case 'f': return one('\f');
      case 'v': return one('\v');
      case '0': return one(0);
      case 'b':
        if (in_class) return one(0x08);
        return Fail("word boundaries (\\b) are not supported"), false;
      case 'B': return Fail("word boundaries (\\B) are not supported"), false;
      case 'p':
      case 'P': return Fail("Unicode property escapes (\\p{...}) are not supported"), false;
      case 'k': return Fail("backreferences are not supported"), false;
      case 'c': {
        if (AtEnd() || !((Peek() >= 'a' && Peek() <= 'z') || (Peek() >= 'A' && Peek() <= 'Z')))
          return Fail("\\c needs a letter"), false;
        const uint32_t l = Peek();
        ++pos_;
        return one(l % 32);
      }
      case 'x': {
        uint32_t v;
        if (!hex(2, &v)) return Fail("\\x needs two hex digits"), false;
        return one(v);
      }
      case 'u': {
        uint32_t v;
        if (Eat('{')) {
          v = 0;
          size_t digits = 0;
          while (!AtEnd() && Peek() != '}') {
            uint32_t d;
            if (!hex(1, &d) || ++digits > 6) return Fail("bad \\u{...} escape"), false;
            v = v * 16 + d;
          }
          if (!Eat('}') || digits == 0 || v > kMaxCodepoint) return Fail("bad \\u{...} escape"), false;
        } else if (!hex(4, &v)) {
          return Fail("\\u needs four hex digits"), false;
        }
        if (v >= 0xD800 && v <= 0xDFFF) return Fail("surrogate code points cannot be matched"), false;
        return one(v);
      }
      default:
        if (c >= '1' && c <= '9') return Fail("backreferences are not supported"), false;
        return one(c);  // escaped punctuation (and, leniently, any other character)
    }
  }

  ExprId ParseClass() {
    ++pos_;  // '['
    const bool negated = Eat('^');
    std::vector<CharRange> ranges;
    while (true) {
      if (AtEnd()) return Fail("unterminated character class"), 0;
      if (Eat(']')) break;
      std::vector<CharRange> a;
      if (!ClassAtom(&a)) return 0;
      if (!AtEnd() && Peek() == '-' && pos_ + 1 < cps_.size() && cps_[pos_ + 1] != ']') {
        ++pos_;
        std::vector<CharRange> b;
        if (!ClassAtom(&b)) return 0;
        if (a.size() != 1 || b.size() != 1 || a[0].lo != a[0].hi || b[0].lo != b[0].hi)
          return Fail("a class escape cannot bound a range"), 0;
        if (a[0].lo > b[0].lo) return Fail("range out of order in character class"), 0;
        ranges.push_back({a[0].lo, b[0].lo});
      } else {
        ranges.insert(ranges.end(), a.begin(), a.end());
      }
    }
    std::vector<CharRange> norm = NormalizeCharRanges(std::move(ranges));
    return Chars(negated ? ComplementCharRanges(norm) : norm);
  }

  bool ClassAtom(std::vector<CharRange>* out) {
    const uint32_t c = Peek();
    ++pos_;
    if (c == '\\') return ParseEscape(/*in_class=*/true, out);
    *out = {{c, c}};
    return true;
  }

  Grammar* g_;
  RegexOptions o_;
  std::vector<uint32_t> cps_;
  size_t pos_ = 0;
  Status error_;
};

}  // namespace

ExprId JsonStringChars(Grammar* g, const std::vector<CharRange>& ranges) {
  // '"', '\' and U+0000..U+001F must be escaped inside a JSON string.
  const std::vector<CharRange> must_escape = {{0, 0x1F}, {'"', '"'}, {'\\', '\\'}};
  std::vector<CharRange> raw;
  std::vector<ExprId> alts;
  for (CharRange r : NormalizeCharRanges(ranges)) {
    uint32_t lo = r.lo;
    for (CharRange e : must_escape) {
      if (e.hi < lo || e.lo > r.hi) continue;
      if (e.lo > lo) raw.push_back({lo, e.lo - 1});
      for (uint32_t cp = std::max(lo, e.lo); cp <= std::min(r.hi, e.hi); ++cp) {
        std::string esc;
        switch (cp) {
          case '"': esc = "\\\""; break;
          case '\\': esc = "\\\\"; break;
          case '\b': esc = "\\b"; break;
          case '\f': esc = "\\f"; break;
          case '\n': esc = "\\n"; break;
          case '\r': esc = "\\r"; break;
          case '\t': esc = "\\t"; break;
          default: {
            char buf[8];
            std::snprintf(buf, sizeof(buf), "\\u%04x", cp);
            esc = buf;
          }
        }
        alts.push_back(g->Bytes(esc));
      }
      lo = e.hi + 1;
      if (lo > r.hi) break;
    }
    if (lo <= r.hi) raw.push_back({lo, r.hi});
  }
  if (!raw.empty() || alts.empty()) alts.insert(alts.begin(), g->CharSet(raw));
  return g->Alt(std::move(alts));
}

Result<ExprId> AddRegex(Grammar* g, std::string_view pattern, const RegexOptions& options) {
  return RegexParser(g, options).Parse(pattern);
}

Result<Grammar> GrammarFromRegex(std::string_view pattern) {
  Grammar g;
  const RuleId root = g.DeclareRule("root");
  PDSERVE_ASSIGN_OR_RETURN(const ExprId body, AddRegex(&g, pattern));
  g.Define(root, body);
  g.SetRoot(root);
  return g;
}

}  // namespace pdserve::grammar
