#include "tokenizer/bpe_model.h"

#include <random>

#include <nlohmann/json.hpp>
#include <gtest/gtest.h>

#include "tokenizer/byte_level.h"
#include "tokenizer/testing_util.h"
#include "tokenizer/utf8.h"

namespace pdserve::tokenizer {
namespace {

using nlohmann::json;

// A byte-level vocabulary (ids 0..255 in byte order) plus `extra` tokens and `merges`.
json TinyModel(const std::vector<std::string>& extra, const json& merges) {
  json vocab = json::object();
  for (int b = 0; b < 256; ++b) {
    std::string s;
    AppendUtf8(ByteToChar(static_cast<uint8_t>(b)), &s);
    vocab[s] = b;
  }
  int id = 256;
  for (const auto& t : extra) vocab[t] = id++;
  return {{"type", "BPE"}, {"vocab", vocab}, {"merges", merges}};
}

std::vector<int32_t> Encode(const BpeModel& m, std::string_view bytes) {
  std::vector<int32_t> out;
  m.EncodeBytes(bytes, &out);
  return out;
}

TEST(BpeModel, MergesByRankLeftmostFirst) {
  auto m = BpeModel::FromJson(TinyModel({"aa", "ab", "aab"}, {"a a", "a b", "aa b"}), 100);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_EQ(Encode(**m, "aaa"), (std::vector<int32_t>{256, 'a'}));       // leftmost "a a" wins
  EXPECT_EQ(Encode(**m, "aab"), (std::vector<int32_t>{258}));            // aa, then aa+b
  EXPECT_EQ(Encode(**m, "ab"), (std::vector<int32_t>{257}));
  EXPECT_EQ(Encode(**m, "ba"), (std::vector<int32_t>{'b', 'a'}));
  EXPECT_EQ(Encode(**m, "aab"), (std::vector<int32_t>{258}));            // cached path
}

TEST(BpeModel, AcceptsPairMergeFormat) {
  auto m = BpeModel::FromJson(TinyModel({"ab"}, json::array({json::array({"a", "b"})})), 0);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_EQ(Encode(**m, "xab"), (std::vector<int32_t>{'x', 256}));
}

TEST(BpeModel, RejectsBadModels) {
  auto missing = BpeModel::FromJson(TinyModel({}, {"a b"}), 0);  // "ab" not in vocab
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(missing.status().message().find("merge #0"), std::string::npos);

  json no_bytes = {{"type", "BPE"}, {"vocab", {{"a", 0}}}, {"merges", json::array()}};
  EXPECT_EQ(BpeModel::FromJson(no_bytes, 0).status().code(), StatusCode::kInvalidArgument);

  json wordpiece = {{"type", "WordPiece"}, {"vocab", json::object()}};
  EXPECT_EQ(BpeModel::FromJson(wordpiece, 0).status().code(), StatusCode::kUnimplemented);

  json bad_merge = TinyModel({}, {"abc"});
  EXPECT_EQ(BpeModel::FromJson(bad_merge, 0).status().code(), StatusCode::kInvalidArgument);

  json bad_id = TinyModel({}, json::array());
  bad_id["vocab"]["zz"] = "seven";
  EXPECT_EQ(BpeModel::FromJson(bad_id, 0).status().code(), StatusCode::kInvalidArgument);
}

// The linear loop (short pieces) and the heap loop (long pieces) must agree on every input.
TEST(BpeModel, LinearAndHeapMergeLoopsAgree) {
  PDSERVE_DEEPSEEK_OR_FAIL(tok);
  const BpeModel& m = tok->model();
  std::mt19937 rng(123);
  const std::vector<std::string> parts = {"the", " ", "ing", "er", "你", "好", "\n", "  ", "1",
                                          "😀", "a", "e", "tion", "ä", "\xF0", "ab", "::", "}"};
  for (int round = 0; round < 2000; ++round) {
    std::string s;
    const int n = 1 + rng() % 20;
    for (int i = 0; i < n; ++i) s += parts[rng() % parts.size()];
    std::vector<int32_t> linear, heap;
    m.Merge(s, false, &linear);
    m.Merge(s, true, &heap);
    ASSERT_EQ(linear, heap) << s;
  }
}

}  // namespace
}  // namespace pdserve::tokenizer
