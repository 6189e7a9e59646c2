// UTF-8 helpers: every code point's encoding must be matched by exactly the sequences of the
// range that holds it. To add a case: a range to the list in Utf8Sequences.MatchExactly.
#include "grammar/utf8_ranges.h"

#include <gtest/gtest.h>

namespace pdserve::grammar {
namespace {

bool SequencesMatch(const std::vector<Utf8Sequence>& seqs, const std::string& bytes) {
  int matches = 0;
  for (const Utf8Sequence& s : seqs) {
    if (s.size() != bytes.size()) continue;
    bool ok = true;
    for (size_t i = 0; i < s.size(); ++i) {
      const uint8_t b = static_cast<uint8_t>(bytes[i]);
      ok &= b >= s[i].lo && b <= s[i].hi;
    }
    matches += ok;
  }
  EXPECT_LE(matches, 1) << "overlapping sequences";
  return matches == 1;
}

TEST(Utf8, EncodeDecodeEveryScalar) {
  for (uint32_t cp = 0; cp <= kMaxCodepoint; ++cp) {
    if (cp >= 0xD800 && cp <= 0xDFFF) continue;
    std::string s;
    AppendUtf8(cp, &s);
    uint32_t back = 0;
    ASSERT_EQ(DecodeUtf8(s, &back), static_cast<int>(s.size())) << cp;
    ASSERT_EQ(back, cp);
  }
  uint32_t cp;
  EXPECT_EQ(DecodeUtf8("\xC0\x80", &cp), 0);      // overlong
  EXPECT_EQ(DecodeUtf8("\xED\xA0\x80", &cp), 0);  // surrogate
  EXPECT_EQ(DecodeUtf8("\xF4\x90\x80\x80", &cp), 0);  // > U+10FFFF
  EXPECT_EQ(DecodeUtf8("\xE6\x97", &cp), 0);      // truncated
  EXPECT_EQ(DecodeUtf8("", &cp), 0);
}

TEST(Utf8Sequences, MatchExactly) {
  const std::vector<CharRange> ranges = {{0, 0x10FFFF}, {0x41, 0x5A}, {0x7F, 0x80}, {0x7FF, 0x800},
                                         {0xFFFF, 0x10000}, {0x3FF, 0x1234}, {0xE000, 0xE0FF},
                                         {0x10FF00, 0x10FFFF}, {0x20, 0xD7FF}, {0x1F600, 0x1F64F}};
  for (CharRange raw : ranges) {
    for (CharRange r : NormalizeCharRanges({raw})) {
      const auto seqs = Utf8Sequences(r);
      // Every scalar value near the boundaries and a stride through the range.
      std::vector<uint32_t> probes;
      for (uint32_t cp : {r.lo, r.hi, r.lo ? r.lo - 1 : 0, r.hi + 1, 0x7Fu, 0x80u, 0x7FFu, 0x800u, 0xFFFFu, 0x10000u})
        probes.push_back(cp);
      for (uint32_t cp = 0; cp <= kMaxCodepoint; cp += 977) probes.push_back(cp);
      for (uint32_t cp : probes) {
        if (cp > kMaxCodepoint || (cp >= 0xD800 && cp <= 0xDFFF)) continue;
        std::string s;
        AppendUtf8(cp, &s);
        EXPECT_EQ(SequencesMatch(seqs, s), cp >= r.lo && cp <= r.hi) << std::hex << cp << " in " << r.lo << "-" << r.hi;
      }
    }
  }
}

TEST(CharRanges, NormalizeAndComplement) {
  auto n = NormalizeCharRanges({{0x61, 0x7A}, {0x41, 0x5A}, {0x5B, 0x60}, {0xD000, 0xE000}});
  ASSERT_EQ(n.size(), 3u);  // the surrogates are cut out
  EXPECT_EQ(n[0], (CharRange{0x41, 0x7A}));
  EXPECT_EQ(n[1], (CharRange{0xD000, 0xD7FF}));
  EXPECT_EQ(n[2], (CharRange{0xE000, 0xE000}));
  auto c = ComplementCharRanges(NormalizeCharRanges({{0, 0x40}, {0x42, kMaxCodepoint}}));
  ASSERT_EQ(c.size(), 1u);
  EXPECT_EQ(c[0], (CharRange{0x41, 0x41}));
  EXPECT_TRUE(ComplementCharRanges(NormalizeCharRanges({{0, kMaxCodepoint}})).empty());
}

}  // namespace
}  // namespace pdserve::grammar
