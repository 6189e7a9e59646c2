// TokenByteTable over the DeepSeek-V3 tokenizer: bytes equal Decode of each id, specials are
// not text, added non-special tokens are, the stop id is EOS.
#include "tokenizer/token_table.h"

#include <gtest/gtest.h>

#include "tokenizer/testing_util.h"

namespace pdserve::tokenizer {
namespace {

TEST(TokenByteTable, DeepSeek) {
  PDSERVE_DEEPSEEK_OR_FAIL(tok);
  auto t = BuildTokenByteTable(*tok, 129280);
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  EXPECT_EQ(t->vocab_size, 129280);
  ASSERT_EQ(t->bytes.size(), static_cast<size_t>(tok->id_limit()));
  EXPECT_EQ(t->stop_ids, std::vector<int32_t>{1});
  EXPECT_FALSE(t->is_text[0]);  // BOS
  EXPECT_FALSE(t->is_text[1]);  // EOS
  const int32_t sep = tok->TokenToId("<｜tool▁sep｜>").value();
  EXPECT_TRUE(t->is_text[static_cast<size_t>(sep)]);
  EXPECT_EQ(t->bytes[static_cast<size_t>(sep)], "<｜tool▁sep｜>");
  int64_t text = 0;
  for (int32_t id = 0; id < tok->id_limit(); id += 1 + id % 7) {
    if (!t->is_text[static_cast<size_t>(id)]) continue;
    ++text;
    // Whole-character tokens decode to their bytes exactly.
    auto d = tok->Decode(std::vector<int32_t>{id});
    ASSERT_TRUE(d.ok());
    if (d->find("\xEF\xBF\xBD") == std::string::npos) {
      EXPECT_EQ(*d, t->bytes[static_cast<size_t>(id)]) << id;
    }
  }
  EXPECT_GT(text, 30000);
  EXPECT_FALSE(BuildTokenByteTable(*tok, 1000).ok());
}

}  // namespace
}  // namespace pdserve::tokenizer
