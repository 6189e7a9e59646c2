// /v1/tokenize and /v1/detokenize (tokenize_api.h) with the real tokenizer and chat template:
// the prompt a generation request would get, the vLLM reply shapes, and 400s naming the field.
#include "services/router/tokenize_api.h"

#include <gtest/gtest.h>

#include "services/router/request_prep.h"
#include "tokenizer/tokenizer_paths.h"

namespace pdserve::router {
namespace {

using nlohmann::json;

class TokenizeApiTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    tok_ = tokenizer::Tokenizer::Load(tokenizer::DefaultTokenizerDir()).value().release();
    tmpl_ = new tokenizer::ChatTemplate(tokenizer::ChatTemplate::FromConfig(tok_->config()).value());
  }
  RouterConfig Config() const {
    RouterConfig c;
    c.model_name = "m";
    return c;
  }
  json Tok(const std::string& body, std::optional<uint32_t> max_len = 4096) {
    json out;
    auto e = Tokenize(Config(), *tok_, *tmpl_, body, max_len, &out);
    EXPECT_FALSE(e) << body << " -> " << (e ? e->message : "");
    return out;
  }
  std::optional<ApiError> TokError(const std::string& body) {
    json out;
    return Tokenize(Config(), *tok_, *tmpl_, body, std::nullopt, &out);
  }
  // The prompt a chat completion with these fields is sent with.
  std::vector<int32_t> GenerationPrompt(const std::string& body) {
    ParsedRequest pr;
    EXPECT_FALSE(ParseRequest(ApiEndpoint::kChat, body, &pr));
    PreparedRequest p;
    EXPECT_FALSE(PrepareRequest(Config(), *tok_, *tmpl_, pr, "t", std::chrono::steady_clock::now(), &p));
    return p.spec.prompt;
  }

  static tokenizer::Tokenizer* tok_;
  static tokenizer::ChatTemplate* tmpl_;
};
tokenizer::Tokenizer* TokenizeApiTest::tok_ = nullptr;
tokenizer::ChatTemplate* TokenizeApiTest::tmpl_ = nullptr;

TEST_F(TokenizeApiTest, TextPromptsWithAndWithoutBos) {
  const std::vector<int32_t> hello = tok_->Encode("Hello world", {false, true}).value();
  json r = Tok(R"({"model":"m","prompt":"Hello world"})");
  std::vector<int32_t> with_bos = {*tok_->bos_id()};
  with_bos.insert(with_bos.end(), hello.begin(), hello.end());
  EXPECT_EQ(r["tokens"].get<std::vector<int32_t>>(), with_bos);
  EXPECT_EQ(r["count"], with_bos.size());
  EXPECT_EQ(r["max_model_len"], 4096);
  EXPECT_FALSE(r.contains("token_strs"));
  json raw = Tok(R"({"prompt":"Hello world","add_special_tokens":false,"return_token_strs":true})", std::nullopt);
  EXPECT_EQ(raw["tokens"].get<std::vector<int32_t>>(), hello);
  EXPECT_TRUE(raw["max_model_len"].is_null());
  std::string joined;
  for (const auto& s : raw["token_strs"]) joined += s.get<std::string>();
  EXPECT_EQ(joined, "Hello world");
}

TEST_F(TokenizeApiTest, ChatPromptsAreTheGenerationPrompt) {
  const std::string tools =
      R"("tools":[{"type":"function","function":{"name":"f","parameters":{"type":"object"}}}])";
  const std::string messages = R"("messages":[{"role":"user","content":"Hi"}])";
  for (const std::string& extra : {std::string(), tools, std::string(R"("chat_template_kwargs":{"thinking":true})")}) {
    SCOPED_TRACE(extra);
    const std::string fields = messages + (extra.empty() ? "" : "," + extra);
    json r = Tok("{" + fields + "}");
    EXPECT_EQ(r["tokens"].get<std::vector<int32_t>>(), GenerationPrompt(R"({"model":"m",)" + fields + "}"));
  }
  json no_prompt = Tok("{" + messages + R"(,"add_generation_prompt":false})");
  const std::string text = tok_->Decode(no_prompt["tokens"].get<std::vector<int32_t>>(), {false}).value();
  EXPECT_EQ(text.find("<｜Assistant｜>"), std::string::npos) << text;
}

TEST_F(TokenizeApiTest, BadInputIs400NamingTheField) {
  struct Case {
    const char* body;
    int status;
    const char* param;
  };
  const Case cases[] = {
      {"not json", 400, ""},
      {"[1]", 400, ""},
      {"{}", 400, "prompt"},
      {R"({"prompt":5})", 400, "prompt"},
      {R"({"prompt":"x","model":"other"})", 404, ""},
      {R"({"prompt":"x","model":7})", 400, "model"},
      {R"({"prompt":"x","add_special_tokens":"yes"})", 400, "add_special_tokens"},
      {R"({"messages":[]})", 400, "messages"},
      {R"({"messages":[{"role":"user","content":"x"}],"tools":[{"type":"function"}]})", 400, "tools"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.body);
    auto e = TokError(c.body);
    ASSERT_TRUE(e);
    EXPECT_EQ(e->http_status, c.status);
    EXPECT_EQ(e->param, c.param);
  }
}

TEST_F(TokenizeApiTest, DetokenizeRoundTripsAndRefusesUnknownIds) {
  json t = Tok(R"({"prompt":"Bonjour, 世界!"})");
  json out;
  ASSERT_FALSE(Detokenize(Config(), *tok_, json{{"tokens", t["tokens"]}}.dump(), &out));
  EXPECT_EQ(out["prompt"], "<｜begin▁of▁sentence｜>Bonjour, 世界!");
  for (const char* bad : {R"({"tokens":[1,999999999]})", R"({"tokens":[-1]})", R"({"tokens":"abc"})", "{}",
                          R"({"tokens":[1.5]})"}) {
    SCOPED_TRACE(bad);
    auto e = Detokenize(Config(), *tok_, bad, &out);
    ASSERT_TRUE(e);
    EXPECT_EQ(e->http_status, 400);
    EXPECT_EQ(e->param, "tokens");
  }
}

}  // namespace
}  // namespace pdserve::router
