// Constrained decoding inside the engine (engine/engine.h, RequestConstraint) with the random
// tiny test model: a byte-level test vocabulary over the model's 1,024 ids (every byte, JSON
// pieces, letter pairs, padding ids), 200 generated JSON Schemas (nested objects, enums, const,
// bounded arrays and tuples, anyOf, $ref to $defs, patterns, formats, integer bounds) plus
// json_object; every greedy and sampled output must end with the grammar's stop token, parse,
// have no repeated keys and validate against its schema (schema_validator.h, written apart
// from the grammar). Also: unconstrained rows batched with constrained ones sample exactly the
// tokens they sample alone; the matcher state handed from a prefill engine to a decode engine
// (CommitImport) and from an interrupted attempt to a resumed one (RequestConstraint::state)
// continues exactly like an uninterrupted run; prefix-cache hits change no constrained output;
// truncation reports length; bad constraints are refused at AddRequest.
// The schemas bound every string, array and object, so each document has a bounded length
// and a random model always finishes it well within max_tokens.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/engine.h"
#include "engine/engine_test_util.h"
#include "grammar/constraint.h"
#include "tests/grammar/bounded_schema_gen.h"
#include "tests/grammar/schema_validator.h"

namespace pdserve::engine {
namespace {

using Json = nlohmann::ordered_json;
using grammar::Constraint;
using grammar::ConstraintKind;
using testing::EventCollector;
using testing::RunUntilIdle;
using testing::TinyModel;
using grammar::testing::BoundedSchemaGen;

constexpr int32_t kEos = 1;
constexpr int kSchemas = 200;
constexpr int32_t kMaxTokens = 1500;

// The test vocabulary over the tiny model's ids: 0 a special (BOS), 1 the stop token, then
// every single byte, JSON pieces, numbers, words, multi-byte characters, letter pairs; the last
// 64 ids have no bytes (padding, never allowed under a constraint).
std::shared_ptr<const grammar::Vocabulary> TestVocabulary() {
  static std::shared_ptr<const grammar::Vocabulary> v = [] {
    const int64_t V = TinyModel().config().vocab_size;
    std::vector<std::string> bytes(static_cast<size_t>(V));
    std::vector<uint8_t> is_text(static_cast<size_t>(V), 0);
    bytes[0] = "<bos>";
    bytes[1] = "<eos>";
    size_t id = 2;
    auto add = [&](const std::string& s) {
      if (static_cast<int64_t>(id) >= V - 64) return;
      bytes[id] = s;
      is_text[id] = 1;
      ++id;
    };
    for (int b = 0; b < 256; ++b) add(std::string(1, static_cast<char>(b)));
    for (const char* s : {"{\"", "\"}", "\":", "\": ", "\", \"", "\",\"", "\"]", "[\"", "},", "}]", "[{", "{}", "[]",
                          "true", "false", "null", "\n", "  ", "\n  ", ", ", "\\n", "\\\"", "\\u00e9", "\\\\", ".5",
                          "e+", "E-", "-1", "0.", ":00", "T1", "Z\"", "@", ".com", "id", "name", "age", "tags", "value",
                          "items", "meta", "kind", "score", "red", "green", "blue", "alpha", "beta", "pending", "paid",
                          "\xe6\x97\xa5\xe6\x9c\xac", "\xc3\xbc", "\xf0\x9f\x98\x80", "\xe6\x97", "\x9c\xac"})
      add(s);
    for (int n = 10; n < 100; ++n) add(std::to_string(n));
    for (char a = 'a'; a <= 'z'; ++a)
      for (char b = 'a'; b <= 'z'; ++b) add(std::string{a, b});
    return grammar::Vocabulary::Create(std::move(bytes), std::move(is_text), {kEos}, V).value();
  }();
  return v;
}

std::vector<int32_t> MakePrompt(int n, int salt) {
  std::vector<int32_t> p;
  for (int i = 0; i < n; ++i) p.push_back(static_cast<int32_t>((i * 37 + salt * 11 + 5) % 1000));
  return p;
}

// The output's text (the stop token adds none).
std::string Text(const std::vector<int32_t>& ids) {
  std::string s;
  for (int32_t id : ids)
    if (TestVocabulary()->is_text(id)) s += TestVocabulary()->bytes(id);
  return s;
}

EngineOptions Options(grammar::GrammarCache* cache) {
  EngineOptions o;
  o.block_tokens = 16;
  o.kv_cache_gib = 0.5;
  o.scheduler.max_step_tokens = 256;
  o.scheduler.prefill_chunk = 32;
  o.scheduler.max_num_seqs = 64;
  o.seed = 99;
  o.grammars = cache;
  return o;
}

RequestOptions Constrained(Constraint c, bool greedy, uint64_t seed, int32_t max_tokens, EventCollector* events) {
  RequestOptions ro;
  ro.sampling.temperature = greedy ? 0.0f : 1.0f;
  ro.sampling.seed = seed;
  ro.sampling.max_tokens = max_tokens;
  ro.on_event = events->Callback();
  ro.constraint.spec = std::move(c);
  return ro;
}

Constraint SchemaConstraint(const Json& schema, int variant) {
  Constraint c{.kind = ConstraintKind::kJsonSchema, .text = schema.dump()};
  c.json.compact = variant % 2 == 0;
  c.json.max_whitespace = 3;
  return c;
}

// A finished constrained output: ends with the stop token, and its text parses.
::testing::AssertionResult FinishedDocument(const std::vector<int32_t>& ids, const TokenEvent* last, Json* out) {
  if (!last || !last->finished) return ::testing::AssertionFailure() << "not finished";
  if (last->reason != FinishReason::kStop)
    return ::testing::AssertionFailure() << "finish reason " << FinishReasonName(last->reason) << " "
                                         << last->error.ToString() << " after " << ids.size() << " tokens: "
                                         << Text(ids);
  if (ids.empty() || ids.back() != kEos) return ::testing::AssertionFailure() << "no stop token at the end";
  const std::string text = Text(ids);
  try {
    *out = Json::parse(text);
  } catch (const std::exception& e) {
    return ::testing::AssertionFailure() << "does not parse: " << e.what() << "\n" << text;
  }
  if (grammar::testing::HasDuplicateKeys(text)) return ::testing::AssertionFailure() << "repeated key: " << text;
  return ::testing::AssertionSuccess();
}

TEST(EngineConstraintTest, JsonSchemasGreedyAndSampledValidate) {
  grammar::GrammarCache cache(TestVocabulary(), 256);
  auto engine = Engine::Create(Options(&cache), &TinyModel());
  ASSERT_TRUE(engine.ok()) << engine.status().ToString();
  BoundedSchemaGen gen(2026);
  constexpr int kWave = 32;  // schemas per wave: 64 rows (greedy + sampled) in the batch
  int64_t tokens = 0;
  for (int first = 0; first < kSchemas; first += kWave) {
    EventCollector events;
    struct Case {
      Json schema;
      RequestId greedy, sampled;
    };
    std::vector<Case> cases;
    for (int i = first; i < std::min(kSchemas, first + kWave); ++i) {
      Case c{gen.Make(), 0, 0};
      auto g = (*engine)->AddRequest(MakePrompt(8 + i % 13, i),
                                     Constrained(SchemaConstraint(c.schema, i), true, 0, kMaxTokens, &events));
      ASSERT_TRUE(g.ok()) << g.status().ToString() << "\n" << c.schema.dump();
      auto s = (*engine)->AddRequest(MakePrompt(8 + i % 13, i),
                                     Constrained(SchemaConstraint(c.schema, i + 1), false, 1000 + i, kMaxTokens, &events));
      ASSERT_TRUE(s.ok()) << s.status().ToString();
      c.greedy = *g;
      c.sampled = *s;
      cases.push_back(std::move(c));
    }
    ASSERT_TRUE(RunUntilIdle(engine->get()));
    for (const Case& c : cases) {
      for (RequestId id : {c.greedy, c.sampled}) {
        const std::vector<int32_t> ids = events.Tokens(id);
        tokens += static_cast<int64_t>(ids.size());
        Json doc;
        ASSERT_TRUE(FinishedDocument(ids, events.Last(id), &doc)) << c.schema.dump();
        const std::string why = grammar::testing::ValidateJson(doc, c.schema);
        EXPECT_EQ(why, "") << doc.dump() << "\nschema " << c.schema.dump();
      }
    }
  }
  const EngineStats st = (*engine)->Stats();
  EXPECT_EQ(st.constrained_rows, tokens);  // every sampled token was masked
  EXPECT_GT(st.constraint_seconds, 0);
  std::printf("%d schemas x (greedy, sampled): %lld tokens; grammar cache %lld misses\n", kSchemas,
              static_cast<long long>(tokens), static_cast<long long>(cache.misses()));
}

// json_object: the recursive grammar of any object. Unbounded, so a random model may run into
// max_tokens: such an output reports length and is a valid prefix (the grammar accepts every
// token, without completing); a finished one parses as an object.
TEST(EngineConstraintTest, JsonObjectFinishesOrReportsLengthWithAValidPrefix) {
  grammar::GrammarCache cache(TestVocabulary());
  auto engine = Engine::Create(Options(&cache), &TinyModel());
  ASSERT_TRUE(engine.ok());
  EventCollector events;
  std::vector<RequestId> ids;
  Constraint c{.kind = ConstraintKind::kJsonObject};
  for (int i = 0; i < 32; ++i)
    ids.push_back((*engine)->AddRequest(MakePrompt(10 + i, 500 + i), Constrained(c, i % 2 == 0, 7 + i, 300, &events)).value());
  ASSERT_TRUE(RunUntilIdle(engine->get()));
  auto compiled = cache.Get(c).value();
  int finished = 0, truncated = 0;
  for (RequestId id : ids) {
    const std::vector<int32_t> out = events.Tokens(id);
    const TokenEvent* last = events.Last(id);
    ASSERT_TRUE(last && last->finished);
    if (last->reason == FinishReason::kLength) {
      ++truncated;
      EXPECT_EQ(out.size(), 300u);
      grammar::GrammarMatcher m(compiled);
      EXPECT_TRUE(m.AcceptTokens(out).ok());
      EXPECT_FALSE(m.IsTerminated());
      continue;
    }
    ++finished;
    Json doc;
    ASSERT_TRUE(FinishedDocument(out, last, &doc));
    EXPECT_TRUE(doc.is_object()) << doc.dump();
  }
  std::printf("json_object: %d finished, %d cut at max_tokens\n", finished, truncated);
}

// A constrained request whose prompt prefix is in the prefix cache samples exactly the tokens
// it samples on an engine without the cache (greedy and seeded).
TEST(EngineConstraintTest, PrefixCacheHitsLeaveConstrainedOutputsUnchanged) {
  grammar::GrammarCache cache(TestVocabulary());
  BoundedSchemaGen gen(31);
  const Json schema = gen.Make();
  const std::vector<int32_t> shared = MakePrompt(100, 17);
  auto with_suffix = [&](int salt) {
    std::vector<int32_t> p = shared;
    for (int32_t t : MakePrompt(9, salt)) p.push_back(t);
    return p;
  };
  auto run = [&](bool prefix_cache, std::vector<int64_t>* cached) {
    EngineOptions o = Options(&cache);
    o.prefix_cache = prefix_cache;
    auto engine = Engine::Create(o, &TinyModel());
    EXPECT_TRUE(engine.ok());
    EventCollector events;
    std::vector<RequestId> ids;
    for (int i = 0; i < 4; ++i) {  // one at a time: each later one finds the earlier ones' blocks
      ids.push_back((*engine)->AddRequest(with_suffix(i), Constrained(SchemaConstraint(schema, i), i % 2 == 0, 40 + i,
                                                                      kMaxTokens, &events)).value());
      EXPECT_TRUE(RunUntilIdle(engine->get()));
    }
    std::vector<std::vector<int32_t>> out;
    for (RequestId id : ids) {
      out.push_back(events.Tokens(id));
      cached->push_back(events.Last(id)->cached_prompt_tokens);
    }
    return out;
  };
  std::vector<int64_t> warm_cached, cold_cached;
  const auto warm = run(true, &warm_cached);
  const auto cold = run(false, &cold_cached);
  EXPECT_EQ(warm, cold);
  EXPECT_EQ(warm_cached, (std::vector<int64_t>{0, 96, 96, 96}));
  EXPECT_EQ(cold_cached, (std::vector<int64_t>{0, 0, 0, 0}));
}

// A bounded schema cut by max_tokens: length, not stop, and a valid prefix.
TEST(EngineConstraintTest, TruncatedJsonReportsLength) {
  grammar::GrammarCache cache(TestVocabulary());
  auto engine = Engine::Create(Options(&cache), &TinyModel());
  ASSERT_TRUE(engine.ok());
  EventCollector events;
  Constraint c = SchemaConstraint(Json::parse(R"({"type": "object", "properties": {"name": {"type": "string",
      "maxLength": 8}, "tags": {"type": "array", "items": {"enum": ["red", "green", "blue"]}, "maxItems": 3}},
      "required": ["name", "tags"], "additionalProperties": false})"), 0);
  const RequestId id = (*engine)->AddRequest(MakePrompt(12, 3), Constrained(c, true, 0, 4, &events)).value();
  ASSERT_TRUE(RunUntilIdle(engine->get()));
  ASSERT_EQ(events.Last(id)->reason, FinishReason::kLength);
  const std::vector<int32_t> out = events.Tokens(id);
  ASSERT_EQ(out.size(), 4u);
  const std::string text = Text(out);
  EXPECT_EQ(text.rfind("{\"name\":", 0), 0u) << text;  // compact: the only way to start
  EXPECT_FALSE(Json::accept(text)) << text;
}

// Unconstrained rows sample the same tokens whether or not constrained rows share their batch.
TEST(EngineConstraintTest, UnconstrainedRowsUnchangedByConstrainedNeighbours) {
  grammar::GrammarCache cache(TestVocabulary());
  BoundedSchemaGen gen(7);
  auto run = [&](bool with_constrained) {
    auto engine = Engine::Create(Options(&cache), &TinyModel());
    EXPECT_TRUE(engine.ok());
    EventCollector events;
    std::vector<RequestId> plain;
    for (int i = 0; i < 8; ++i) {
      RequestOptions ro;
      ro.sampling.temperature = i % 2 ? 0.9f : 0.0f;
      ro.sampling.top_p = 0.95f;
      ro.sampling.seed = 40 + i;
      ro.sampling.max_tokens = 40;
      ro.on_event = events.Callback();
      plain.push_back((*engine)->AddRequest(MakePrompt(20 + i, 900 + i), ro).value());
      if (with_constrained) {
        EXPECT_TRUE((*engine)->AddRequest(MakePrompt(20 + i, 900 + i),
                                          Constrained(SchemaConstraint(gen.Make(), i), i % 2, 40 + i, 40, &events)).ok());
      }
    }
    EXPECT_TRUE(RunUntilIdle(engine->get()));
    if (with_constrained) {
      EXPECT_GT((*engine)->Stats().constrained_rows, 0);
    } else {
      EXPECT_EQ((*engine)->Stats().constrained_rows, 0);
    }
    std::vector<std::vector<int32_t>> out;
    for (RequestId id : plain) out.push_back(events.Tokens(id));
    return out;
  };
  const auto alone = run(false);
  const auto mixed = run(true);
  ASSERT_EQ(alone.size(), mixed.size());
  for (size_t i = 0; i < alone.size(); ++i) {
    EXPECT_EQ(alone[i].size(), 40u);
    EXPECT_EQ(alone[i], mixed[i]) << "request " << i;
  }
}

const char* kHandOverSchema = R"({"type": "object", "properties": {
    "id": {"type": "string", "format": "uuid"}, "kind": {"enum": ["red", "green", "blue"]},
    "items": {"type": "array", "items": {"type": "object", "properties": {"name": {"type": "string", "maxLength": 6},
        "score": {"type": "integer", "minimum": 0, "maximum": 999}}, "required": ["name", "score"],
        "additionalProperties": false}, "minItems": 1, "maxItems": 3},
    "meta": {"anyOf": [{"type": "null"}, {"$ref": "#/$defs/meta"}]}},
  "required": ["id", "kind", "items", "meta"], "additionalProperties": false,
  "$defs": {"meta": {"type": "object", "properties": {"n": {"type": "number"}}, "additionalProperties": false}}})";

// Prefill (first token, matcher state exported with it) -> decode (KV blocks copied, state
// restored at CommitImport) continues exactly like the colocated run, greedy and sampled; the
// replay route (no state) too; a state from another grammar ends the request with an error.
TEST(EngineConstraintTest, PrefillToDecodeHandOverContinuesIdentically) {
  grammar::GrammarCache cache(TestVocabulary());
  const Constraint c = SchemaConstraint(Json::parse(kHandOverSchema), 1);
  const std::vector<int32_t> prompt = MakePrompt(45, 17);
  for (const bool greedy : {true, false}) {
    auto colocated = Engine::Create(Options(&cache), &TinyModel());
    EventCollector ce;
    const RequestId cid = (*colocated)->AddRequest(prompt, Constrained(c, greedy, 5, kMaxTokens, &ce)).value();
    ASSERT_TRUE(RunUntilIdle(colocated->get()));
    const std::vector<int32_t> want = ce.Tokens(cid);
    Json doc;
    ASSERT_TRUE(FinishedDocument(want, ce.Last(cid), &doc));
    EXPECT_EQ(grammar::testing::ValidateJson(doc, Json::parse(kHandOverSchema)), "");

    for (const int route : {0, 1, 2}) {  // 0: state, 1: replay, 2: a wrong state
      SCOPED_TRACE(std::string(greedy ? "greedy" : "sampled") + " route " + std::to_string(route));
      auto prefill = Engine::Create(Options(&cache), &TinyModel());
      auto decode = Engine::Create(Options(&cache), &TinyModel());
      EventCollector pe, de;
      RequestOptions po = Constrained(c, greedy, 5, 1, &pe);
      po.hold_kv = true;
      po.constraint.export_state = true;
      const RequestId pid = (*prefill)->AddRequest(prompt, po).value();
      ASSERT_TRUE(RunUntilIdle(prefill->get()));
      const TokenEvent* last = pe.Last(pid);
      ASSERT_TRUE(last && last->finished && last->reason == FinishReason::kLength);
      ASSERT_FALSE(last->constraint_state.empty());
      const int32_t first = pe.Tokens(pid).at(0);
      std::string state = last->constraint_state;
      if (route == 1) state.clear();
      if (route == 2) {
        grammar::GrammarMatcher other(cache.Get(Constraint{.kind = ConstraintKind::kJsonObject}).value());
        ASSERT_TRUE(other.AcceptToken(first).ok());
        state = other.Serialize();
      }
      auto import = (*decode)->ReserveImport(prompt, Constrained(c, greedy, 5, kMaxTokens, &de));
      ASSERT_TRUE(import.ok()) << import.status().ToString();
      const std::vector<int32_t> held = (*prefill)->HeldBlocks(pid).value();
      const BlockPool& src = (*prefill)->pool();
      const BlockPool& dst = (*decode)->pool();
      ASSERT_EQ(held.size(), import->block_ids.size());
      for (size_t b = 0; b < held.size(); ++b)
        std::memcpy(dst.base() + import->block_ids[b] * dst.block_bytes(), src.base() + held[b] * src.block_bytes(),
                    static_cast<size_t>(src.block_bytes()));
      ASSERT_TRUE((*prefill)->ReleaseKv(pid).ok());
      ASSERT_TRUE((*decode)->CommitImport(import->id, first, state).ok());
      ASSERT_TRUE(RunUntilIdle(decode->get()));
      if (route == 2) {
        ASSERT_EQ(de.Last(import->id)->reason, FinishReason::kError);
        EXPECT_NE(de.Last(import->id)->error.message().find("constraint state"), std::string::npos)
            << de.Last(import->id)->error.ToString();
        continue;
      }
      EXPECT_EQ(de.Tokens(import->id), want);
      EXPECT_EQ(de.Last(import->id)->reason, FinishReason::kStop);
    }
  }
}

// An attempt cut after k tokens (its finishing event exports the state) resumed on another
// engine with its output as resumed_output and the state (or by replay) gives the same tokens
// as one uninterrupted run; a state that follows a different number of tokens is refused.
TEST(EngineConstraintTest, ResumedRequestWithStateContinuesIdentically) {
  grammar::GrammarCache cache(TestVocabulary());
  const Constraint c = SchemaConstraint(Json::parse(kHandOverSchema), 0);
  const std::vector<int32_t> prompt = MakePrompt(30, 23);
  for (const bool greedy : {true, false}) {
    auto whole = Engine::Create(Options(&cache), &TinyModel());
    EventCollector we;
    const RequestId wid = (*whole)->AddRequest(prompt, Constrained(c, greedy, 11, kMaxTokens, &we)).value();
    ASSERT_TRUE(RunUntilIdle(whole->get()));
    const std::vector<int32_t> want = we.Tokens(wid);
    ASSERT_GT(want.size(), 12u);
    const int32_t k = static_cast<int32_t>(want.size() / 2);

    auto first = Engine::Create(Options(&cache), &TinyModel());
    EventCollector fe;
    RequestOptions fo = Constrained(c, greedy, 11, k, &fe);
    fo.constraint.export_state = true;
    const RequestId fid = (*first)->AddRequest(prompt, fo).value();
    ASSERT_TRUE(RunUntilIdle(first->get()));
    ASSERT_EQ(fe.Tokens(fid), std::vector<int32_t>(want.begin(), want.begin() + k));
    const std::string state = fe.Last(fid)->constraint_state;
    ASSERT_FALSE(state.empty());

    for (const bool with_state : {true, false}) {
      auto second = Engine::Create(Options(&cache), &TinyModel());
      EventCollector se;
      std::vector<int32_t> resumed = prompt;
      resumed.insert(resumed.end(), want.begin(), want.begin() + k);
      RequestOptions so = Constrained(c, greedy, 11, kMaxTokens, &se);
      so.sampling.resumed_output = k;
      if (with_state) so.constraint.state = state;
      const RequestId sid = (*second)->AddRequest(resumed, so).value();
      ASSERT_TRUE(RunUntilIdle(second->get()));
      EXPECT_EQ(se.Tokens(sid), std::vector<int32_t>(want.begin() + k, want.end())) << (greedy ? "greedy" : "sampled");
      EXPECT_EQ(se.Last(sid)->reason, FinishReason::kStop);

      // The state of k tokens does not describe k - 1 resumed tokens.
      if (with_state) {
        RequestOptions bad = Constrained(c, greedy, 11, kMaxTokens, &se);
        bad.sampling.resumed_output = k - 1;
        bad.constraint.state = state;
        auto r = (*second)->AddRequest(std::vector<int32_t>(resumed.begin(), resumed.end() - 1), bad);
        ASSERT_FALSE(r.ok());
        EXPECT_NE(r.status().message().find("constraint state"), std::string::npos) << r.status().ToString();
      }
    }
  }
}

TEST(EngineConstraintTest, BadConstraintsAreRefusedAtAddRequest) {
  grammar::GrammarCache cache(TestVocabulary());
  auto engine = Engine::Create(Options(&cache), &TinyModel());
  EventCollector events;
  // An unsupported keyword, named with its pointer.
  auto r = (*engine)->AddRequest(MakePrompt(5, 1), Constrained(Constraint{.kind = ConstraintKind::kJsonSchema,
      .text = R"({"type": "object", "properties": {"a": {"type": "string", "not": {}}}})"}, true, 0, 10, &events));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("not"), std::string::npos) << r.status().ToString();
  // A grammar over another vocabulary.
  auto small = grammar::Vocabulary::Create({"a", "b"}, {1, 1}, {}, 2).value();
  RequestOptions ro = Constrained(Constraint{}, true, 0, 10, &events);
  ro.constraint.compiled = grammar::GrammarCache(small).Get(Constraint{.kind = ConstraintKind::kRegex, .text = "a+"}).value();
  r = (*engine)->AddRequest(MakePrompt(5, 1), ro);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("vocabulary of 2 ids"), std::string::npos) << r.status().ToString();
  // No cache: only compiled grammars.
  EngineOptions o = Options(nullptr);
  auto bare = Engine::Create(o, &TinyModel());
  r = (*bare)->AddRequest(MakePrompt(5, 1), Constrained(Constraint{.kind = ConstraintKind::kJsonObject}, true, 0, 10, &events));
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("grammar cache"), std::string::npos) << r.status().ToString();
  // A resumed output the grammar does not allow.
  RequestOptions rr = Constrained(Constraint{.kind = ConstraintKind::kJsonObject}, true, 0, 10, &events);
  rr.sampling.resumed_output = 1;
  std::vector<int32_t> p = MakePrompt(5, 1);
  p.push_back(2 + 'x');  // the byte 'x': no object starts with it
  r = (*engine)->AddRequest(p, rr);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("resumed output"), std::string::npos) << r.status().ToString();
}

}  // namespace
}  // namespace pdserve::engine
