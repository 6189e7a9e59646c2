#include "tokenizer/regex.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

namespace pdserve::tokenizer {

namespace {

// ECMAScript \s: WhiteSpace (TAB VT FF SP NBSP ZWNBSP + category Zs) and LineTerminator
// (LF CR LS PS), spelled as PCRE2 class items. (\v means "vertical space" in PCRE2, so VT is
// written as \x0B.)
constexpr std::string_view kEcmaSpaceItems =
    "\\t\\n\\x0B\\f\\r \\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}"
    "\\x{205F}\\x{3000}\\x{FEFF}";

bool IsHex(char c) {
  return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
}

std::string PcreErrorText(int code) {
  PCRE2_UCHAR buf[256];
  if (pcre2_get_error_message(code, buf, sizeof(buf)) < 0) return "PCRE2 error " + std::to_string(code);
  return reinterpret_cast<const char*>(buf);
}

// Per-thread match scratch: match data for group 0 and a JIT stack large enough for long
// whitespace runs (the default 32 KiB machine-stack block is too small for some patterns).
struct MatchScratch {
  pcre2_match_data* data = nullptr;
  pcre2_match_context* context = nullptr;
  pcre2_jit_stack* jit_stack = nullptr;
  MatchScratch() {
    data = pcre2_match_data_create(1, nullptr);
    context = pcre2_match_context_create(nullptr);
    jit_stack = pcre2_jit_stack_create(32 * 1024, 8 * 1024 * 1024, nullptr);
    if (context && jit_stack) pcre2_jit_stack_assign(context, nullptr, jit_stack);
  }
  ~MatchScratch() {
    pcre2_jit_stack_free(jit_stack);
    pcre2_match_context_free(context);
    pcre2_match_data_free(data);
  }
};

MatchScratch& Scratch() {
  thread_local MatchScratch scratch;
  return scratch;
}

}  // namespace

Result<std::string> Regex::Translate(std::string_view pattern, RegexDialect dialect) {
  std::string out;
  out.reserve(pattern.size() + 16);
  bool in_class = false;
  size_t i = 0;
  while (i < pattern.size()) {
    const char c = pattern[i];
    if (c == '\\' && i + 1 < pattern.size()) {
      const char e = pattern[i + 1];
      if (e == 'u') {
        // JS escapes \uXXXX and \u{X...}; PCRE2 spells them \x{...}.
        if (i + 2 < pattern.size() && pattern[i + 2] == '{') {
          const size_t close = pattern.find('}', i + 3);
          if (close == std::string_view::npos)
            return Status::InvalidArgument("unterminated \\u{...} escape in regex");
          out += "\\x{";
          out.append(pattern.substr(i + 3, close - i - 3));
          out += '}';
          i = close + 1;
          continue;
        }
        if (i + 6 <= pattern.size() && IsHex(pattern[i + 2]) && IsHex(pattern[i + 3]) &&
            IsHex(pattern[i + 4]) && IsHex(pattern[i + 5])) {
          out += "\\x{";
          out.append(pattern.substr(i + 2, 4));
          out += '}';
          i += 6;
          continue;
        }
      }
      if (dialect == RegexDialect::kEcmaScript && (e == 's' || e == 'S')) {
        if (in_class) {
          if (e == 'S')
            return Status::Unimplemented("regex: \\S inside a character class is not supported");
          out.append(kEcmaSpaceItems);
        } else {
          out += e == 's' ? "[" : "[^";
          out.append(kEcmaSpaceItems);
          out += ']';
        }
        i += 2;
        continue;
      }
      out += c;
      out += e;
      i += 2;
      continue;
    }
    if (!in_class && c == '[') {
      in_class = true;
      out += c;
      ++i;
      // A ']' right after '[' or '[^' is a literal in PCRE2; copy it so it does not close.
      if (i < pattern.size() && pattern[i] == '^') out += pattern[i++];
      if (i < pattern.size() && pattern[i] == ']') out += pattern[i++];
      continue;
    }
    if (in_class && c == ']') in_class = false;
    out += c;
    ++i;
  }
  return out;
}

Result<std::unique_ptr<Regex>> Regex::Compile(std::string_view pattern, RegexDialect dialect) {
  PDSERVE_ASSIGN_OR_RETURN(std::string translated, Translate(pattern, dialect));
  uint32_t options = PCRE2_UTF;
  if (dialect == RegexDialect::kUnicode) options |= PCRE2_UCP;
  int error_code = 0;
  PCRE2_SIZE error_offset = 0;
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(translated.data()),
                                   translated.size(), options, &error_code, &error_offset, nullptr);
  if (code == nullptr) {
    return Status::InvalidArgument("cannot compile regex '" + std::string(pattern) + "': " +
                                   PcreErrorText(error_code) + " at offset " +
                                   std::to_string(error_offset));
  }
  std::unique_ptr<Regex> regex(new Regex());
  regex->pattern_ = std::string(pattern);
  regex->code_ = code;
  // JIT is an optimisation only: the interpreter gives the same matches.
  regex->jit_ = pcre2_jit_compile(code, PCRE2_JIT_COMPLETE) == 0;
  return regex;
}

Regex::~Regex() { pcre2_code_free(static_cast<pcre2_code*>(code_)); }

bool Regex::Find(std::string_view subject, size_t start, size_t* begin, size_t* end,
                 Status* error) const {
  MatchScratch& scratch = Scratch();
  if (scratch.data == nullptr) {
    *error = Status::ResourceExhausted("regex: cannot allocate PCRE2 match data");
    return false;
  }
  auto* code = static_cast<pcre2_code*>(code_);
  const auto* subject_ptr = reinterpret_cast<PCRE2_SPTR>(subject.data());
  int rc;
  if (jit_) {
    rc = pcre2_jit_match(code, subject_ptr, subject.size(), start, 0, scratch.data, scratch.context);
  } else {
    rc = pcre2_match(code, subject_ptr, subject.size(), start, PCRE2_NO_UTF_CHECK, scratch.data,
                     scratch.context);
  }
  if (rc == PCRE2_ERROR_NOMATCH) return false;
  if (rc < 0) {
    *error = Status::ResourceExhausted("regex '" + pattern_ + "' failed on a " +
                                       std::to_string(subject.size()) +
                                       "-byte piece: " + PcreErrorText(rc));
    return false;
  }
  const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(scratch.data);
  *begin = ovector[0];
  *end = ovector[1];
  return true;
}

}  // namespace pdserve::tokenizer
