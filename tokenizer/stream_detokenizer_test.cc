#include "tokenizer/stream_detokenizer.h"

#include <random>

#include <gtest/gtest.h>

#include "tokenizer/testing_util.h"

namespace pdserve::tokenizer {
namespace {

using Ids = std::vector<int32_t>;

TEST(StreamDetokenizer, NeverEmitsPartialCharacters) {
  PDSERVE_DEEPSEEK_OR_FAIL(tok);
  const std::string text = "🫠 emoji 👩‍👩‍👧 and 漢字 and e\u0301";
  const Ids ids = tok->Encode(text).value();
  StreamDetokenizer stream(*tok);
  std::string all;
  for (int32_t id : ids) {
    auto piece = stream.Push(id);
    ASSERT_TRUE(piece.ok());
    ASSERT_TRUE(ValidateUtf8(*piece).ok());
    EXPECT_EQ(piece->find("\xEF\xBF\xBD"), std::string::npos);
    all += *piece;
  }
  EXPECT_FALSE(stream.has_pending());
  all += stream.Finish();
  EXPECT_EQ(all, text);
}

TEST(StreamDetokenizer, HoldsBytesUntilTheCharacterCompletes) {
  PDSERVE_DEEPSEEK_OR_FAIL(tok);
  // 😀 is F0 9F 98 80; feed it as four single-byte tokens.
  const Ids bytes = {tok->TokenToId("ð").value(), tok->TokenToId("Ł").value(),
                     tok->TokenToId("ĺ").value(), tok->TokenToId("Ģ").value()};
  ASSERT_EQ(tok->Decode(bytes).value(), "😀");
  StreamDetokenizer stream(*tok);
  for (size_t i = 0; i + 1 < bytes.size(); ++i) {
    EXPECT_EQ(stream.Push(bytes[i]).value(), "");
    EXPECT_TRUE(stream.has_pending());
  }
  EXPECT_EQ(stream.Push(bytes.back()).value(), "😀");
}

TEST(StreamDetokenizer, RandomIdSequencesMatchOneShotDecode) {
  PDSERVE_DEEPSEEK_OR_FAIL(tok);
  std::mt19937 rng(99);
  for (int round = 0; round < 500; ++round) {
    Ids ids;
    const int n = 1 + rng() % 30;
    for (int i = 0; i < n; ++i) {
      // Mix byte tokens (ids < 256 hit the byte alphabet region), random tokens and specials.
      const int kind = rng() % 4;
      ids.push_back(kind == 0 ? static_cast<int32_t>(rng() % 256)
                    : kind == 1 ? static_cast<int32_t>(128798 + rng() % 17)
                                : static_cast<int32_t>(rng() % 128000));
    }
    for (bool skip : {false, true}) {
      const std::string expected = tok->Decode(ids, {.skip_special_tokens = skip}).value();
      StreamDetokenizer stream(*tok, {.skip_special_tokens = skip});
      std::string all;
      for (int32_t id : ids) all += stream.Push(id).value();
      all += stream.Finish();
      ASSERT_EQ(all, expected);
    }
  }
}

TEST(StreamDetokenizer, RejectsUnknownIdsAndKeepsGoing) {
  PDSERVE_DEEPSEEK_OR_FAIL(tok);
  StreamDetokenizer stream(*tok);
  EXPECT_EQ(stream.Push(19923).value(), "Hello");
  auto bad = stream.Push(129000);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(stream.Push(14).value(), ",");
}

}  // namespace
}  // namespace pdserve::tokenizer
