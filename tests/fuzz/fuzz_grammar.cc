// libFuzzer target: the structured-output front ends (grammar/: JSON Schema, regex, EBNF; the
// texts a request may carry) and, for inputs that build, compilation over a small byte-level
// vocabulary, a matcher walk steered by the input bytes and a state round trip. The first byte
// picks the constraint kind, the rest is its text. Every failure must be a Status.
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "grammar/bitmask.h"
#include "grammar/constraint.h"
#include "grammar/matcher.h"

namespace {

std::shared_ptr<const pdserve::grammar::Vocabulary> Vocab() {
  static const auto vocab = [] {
    std::vector<std::string> bytes;
    std::vector<uint8_t> text;
    for (int b = 0; b < 256; ++b) bytes.push_back(std::string(1, static_cast<char>(b))), text.push_back(1);
    for (const char* t : {"{\"", "\":", "\",", "\"}", "true", "null", "  ", "\n", "12", "ab", "\\u00", "é", "\xE6\x97",
                          "</think>", "<｜tool▁sep｜>"})
      bytes.push_back(t), text.push_back(1);
    const int32_t stop = static_cast<int32_t>(bytes.size());
    bytes.push_back("</s>"), text.push_back(0);
    return pdserve::grammar::Vocabulary::Create(bytes, text, {stop}, static_cast<int64_t>(bytes.size()) + 5).value();
  }();
  return vocab;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace pdserve::grammar;
  if (size < 1 || size > 4096) return 0;
  Constraint c;
  switch (data[0] % 5) {
    case 0: c.kind = ConstraintKind::kJsonSchema; break;
    case 1: c.kind = ConstraintKind::kRegex; break;
    case 2: c.kind = ConstraintKind::kEbnf; break;
    case 3: c.kind = ConstraintKind::kJsonObject, c.free_text_until = "</think>"; break;
    default: c.kind = ConstraintKind::kJsonSchema, c.json.compact = true; break;
  }
  c.text.assign(reinterpret_cast<const char*>(data + 1), size - 1);
  auto g = BuildGrammar(c);
  if (!g.ok()) return 0;
  (void)g->ToEbnf();
  CompileOptions options;
  options.max_nfa_states = 20000;
  options.max_dfa_nodes = 4000;
  options.max_stack_depth = 16;
  auto compiled = CompiledGrammar::Compile(*g, Vocab(), options);
  if (!compiled.ok()) return 0;
  GrammarMatcher m(*compiled);
  std::vector<uint32_t> mask(static_cast<size_t>(Vocab()->mask_words()));
  for (size_t step = 0; step < 48 && !m.IsTerminated(); ++step) {
    if (!m.FillNextTokenBitmask(mask.data())) break;
    std::vector<int32_t> allowed;
    for (int32_t id = 0; id < Vocab()->size(); ++id)
      if (MaskAllows(mask.data(), id)) allowed.push_back(id);
    if (allowed.empty()) break;
    const int32_t id = allowed[data[step % size] % allowed.size()];
    if (!m.AcceptToken(id).ok()) __builtin_trap();  // the mask allowed it
  }
  auto back = GrammarMatcher::Deserialize(*compiled, m.Serialize());
  if (!back.ok()) __builtin_trap();
  return 0;
}
