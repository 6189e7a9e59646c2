// ApplyTokenBitmask (AVX2) against the scalar reference, over odd vocabulary sizes, dense,
// sparse and random masks, and the rows variant leaving unlisted rows untouched.
// To add a case: a size to kSizes or a mask pattern to the Patterns list.
#include "grammar/bitmask.h"

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include <gtest/gtest.h>

namespace pdserve::grammar {
namespace {

constexpr int64_t kSizes[] = {1, 7, 31, 32, 33, 63, 64, 65, 4097, 129280};

std::vector<uint32_t> Pattern(int kind, int64_t vocab, std::mt19937& rng) {
  std::vector<uint32_t> m(static_cast<size_t>(MaskWords(vocab)), 0);
  for (int64_t i = 0; i < vocab; ++i) {
    bool on = false;
    switch (kind) {
      case 0: on = false; break;
      case 1: on = true; break;
      case 2: on = rng() % 2; break;
      case 3: on = rng() % 97 == 0; break;
      case 4: on = rng() % 97 != 0; break;
      default: on = (i / 40) % 2; break;  // whole words on and off
    }
    if (on) MaskSet(m.data(), static_cast<int32_t>(i));
  }
  return m;
}

TEST(Bitmask, MatchesScalarReference) {
  std::mt19937 rng(11);
  for (int64_t vocab : kSizes) {
    for (int kind = 0; kind < 6; ++kind) {
      const auto mask = Pattern(kind, vocab, rng);
      std::vector<float> a(static_cast<size_t>(vocab) + 8), b;
      for (float& x : a) x = std::normal_distribution<float>()(rng);
      a[static_cast<size_t>(vocab)] = 123.0f;  // past the end: never written
      b = a;
      ApplyTokenBitmask(a.data(), vocab, mask.data());
      ApplyTokenBitmaskScalar(b.data(), vocab, mask.data());
      ASSERT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0) << vocab << " kind " << kind;
      int64_t finite = 0;
      for (int64_t i = 0; i < vocab; ++i) finite += std::isfinite(a[static_cast<size_t>(i)]);
      EXPECT_EQ(finite, CountAllowed(mask.data(), vocab));
      EXPECT_EQ(a[static_cast<size_t>(vocab)], 123.0f);
    }
  }
}

TEST(Bitmask, RowsLeavesOtherRowsAlone) {
  const int64_t vocab = 1000, stride = 1003, rows = 6;
  std::mt19937 rng(3);
  std::vector<float> logits(static_cast<size_t>(rows * stride));
  for (float& x : logits) x = std::normal_distribution<float>()(rng);
  const std::vector<float> before = logits;
  const std::vector<int32_t> constrained = {4, 1};
  std::vector<uint32_t> masks;
  for (size_t k = 0; k < constrained.size(); ++k) {
    auto m = Pattern(2, vocab, rng);
    m.resize(40, 0xDEADBEEF);  // stride 40 words, garbage past the vocabulary's 32
    masks.insert(masks.end(), m.begin(), m.end());
  }
  ApplyTokenBitmaskRows(logits.data(), stride, vocab, masks.data(), 40, constrained);
  for (int64_t r = 0; r < rows; ++r) {
    const int k = r == 4 ? 0 : r == 1 ? 1 : -1;
    for (int64_t i = 0; i < stride; ++i) {
      const float got = logits[static_cast<size_t>(r * stride + i)], was = before[static_cast<size_t>(r * stride + i)];
      if (k < 0 || i >= vocab) {
        ASSERT_EQ(got, was) << r << " " << i;
      } else {
        ASSERT_EQ(got, MaskAllows(masks.data() + k * 40, static_cast<int32_t>(i)) ? was : -INFINITY);
      }
    }
  }
}

}  // namespace
}  // namespace pdserve::grammar
