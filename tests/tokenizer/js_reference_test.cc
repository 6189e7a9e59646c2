// Compares the C++ tokenizer with the JS reference data written by tools/js/make_reference.js
// (CTest fixture tokenizer_js_reference_data): ids on the >= 2,000-string corpus, round trips,
// streaming detokenization, decode of arbitrary id sequences and the chat template.
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "tokenizer/chat_request.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/stream_detokenizer.h"
#include "tokenizer/testing_util.h"
#include "tokenizer/utf8.h"

#ifndef PDSERVE_TOKENIZER_REF_DIR
#error "PDSERVE_TOKENIZER_REF_DIR must name the directory make_reference.js writes"
#endif

namespace pdserve::tokenizer {
namespace {

using nlohmann::json;
using Ids = std::vector<int32_t>;

std::vector<json> ReadJsonLines(const std::string& name) {
  const std::string path = std::string(PDSERVE_TOKENIZER_REF_DIR) + "/" + name;
  std::ifstream in(path);
  EXPECT_TRUE(in.good()) << "missing " << path << " (run the tokenizer_js_reference_data test first)";
  std::vector<json> out;
  std::string line;
  while (std::getline(in, line)) {
    if (!line.empty()) out.push_back(json::parse(line));
  }
  return out;
}

std::vector<std::string> Corpus() {
  std::vector<std::string> out;
  for (const json& j : ReadJsonLines("corpus.jsonl")) out.push_back(j.get<std::string>());
  return out;
}

std::string Show(const std::string& s) { return json(s).dump().substr(0, 300); }

TEST(JsReference, EncodeMatchesJsOnTheWholeCorpus) {
  PDSERVE_DEEPSEEK_OR_FAIL(tok);
  const auto corpus = Corpus();
  const auto ref = ReadJsonLines("ref_ids.jsonl");
  ASSERT_GE(corpus.size(), 2000u);
  ASSERT_EQ(corpus.size(), ref.size());
  int mismatches = 0;
  for (size_t i = 0; i < corpus.size(); ++i) {
    auto ids = tok->Encode(corpus[i]);
    ASSERT_TRUE(ids.ok()) << ids.status().ToString() << " for " << Show(corpus[i]);
    const Ids expected = ref[i].get<Ids>();
    if (*ids != expected && ++mismatches <= 5) {
      ADD_FAILURE() << "line " << i + 1 << " " << Show(corpus[i]) << "\n  js  " << json(expected).dump()
                    << "\n  c++ " << json(*ids).dump();
    }
  }
  EXPECT_EQ(mismatches, 0);
}

TEST(JsReference, DecodeOfEncodeIsIdentity) {
  PDSERVE_DEEPSEEK_OR_FAIL(tok);
  for (const std::string& s : Corpus()) {
    const Ids ids = tok->Encode(s).value();
    auto text = tok->Decode(ids);
    ASSERT_TRUE(text.ok()) << text.status().ToString();
    ASSERT_EQ(*text, s);
  }
}

TEST(JsReference, StreamingEqualsOneShotDecodeTokenByToken) {
  PDSERVE_DEEPSEEK_OR_FAIL(tok);
  for (const std::string& s : Corpus()) {
    const Ids ids = tok->Encode(s).value();
    const bool has_fffd = s.find("\xEF\xBF\xBD") != std::string::npos;
    StreamDetokenizer stream(*tok);
    std::string streamed;
    for (int32_t id : ids) {
      auto piece = stream.Push(id);
      ASSERT_TRUE(piece.ok()) << piece.status().ToString();
      // Every emitted chunk is whole characters; a U+FFFD can only come from the text itself.
      ASSERT_TRUE(ValidateUtf8(*piece).ok());
      if (!has_fffd) {
        ASSERT_EQ(piece->find("\xEF\xBF\xBD"), std::string::npos) << Show(s);
      }
      streamed += *piece;
    }
    streamed += stream.Finish();
    ASSERT_EQ(streamed, s);
  }
}

TEST(JsReference, DecodeOfArbitraryIdsMatchesJs) {
  PDSERVE_DEEPSEEK_OR_FAIL(tok);
  const auto cases = ReadJsonLines("decode_cases.jsonl");
  const auto ref = ReadJsonLines("ref_decode.jsonl");
  ASSERT_EQ(cases.size(), ref.size());
  ASSERT_GT(cases.size(), 0u);
  for (size_t i = 0; i < cases.size(); ++i) {
    const Ids ids = cases[i]["ids"].get<Ids>();
    const DecodeOptions options{.skip_special_tokens = cases[i]["skip_special_tokens"].get<bool>()};
    const std::string expected = ref[i].get<std::string>();
    auto text = tok->Decode(ids, options);
    ASSERT_TRUE(text.ok()) << text.status().ToString();
    ASSERT_EQ(*text, expected) << "case " << i << " " << cases[i].dump();
    StreamDetokenizer stream(*tok, options);
    std::string streamed;
    for (int32_t id : ids) streamed += stream.Push(id).value();
    streamed += stream.Finish();
    ASSERT_EQ(streamed, expected) << "case " << i << " " << cases[i].dump();
  }
}

TEST(JsReference, ChatTemplateMatchesJinja) {
  PDSERVE_DEEPSEEK_OR_FAIL(tok);
  auto chat_template = ChatTemplate::FromConfig(tok->config());
  ASSERT_TRUE(chat_template.ok()) << chat_template.status().ToString();
  const auto requests = ReadJsonLines("chat.jsonl");
  const auto ref = ReadJsonLines("ref_chat.jsonl");
  ASSERT_GE(requests.size(), 50u);
  ASSERT_EQ(requests.size(), ref.size());
  for (size_t i = 0; i < requests.size(); ++i) {
    auto request = ParseChatRequestJson(requests[i]);
    ASSERT_TRUE(request.ok()) << request.status().ToString();
    auto prompt = chat_template->Render(request->messages, request->options);
    ASSERT_TRUE(prompt.ok()) << prompt.status().ToString();
    ASSERT_EQ(*prompt, ref[i].get<std::string>()) << "conversation " << i << ": " << requests[i].dump();
  }
}

}  // namespace
}  // namespace pdserve::tokenizer
