// bench_grammar: the cost of structured output per decode step at batch 64 over the real
// DeepSeek-V3 vocabulary (129,280 ids), against a decode step of the `small` preset at batch 64
// measured in the same run (goal: mask work < 5% of the step).
//
//   build/bin/bench_grammar [--steps N] [--context N] [--decode-steps N] [--model DIR] [--skip-decode]
//                           [--engine-steps N] [--skip-engine]
//
// Per step and for all 64 rows: FillNextTokenBitmask (one thread, and on a 2-thread pool),
// ApplyTokenBitmaskRows over 64 x 129,280 fp32 logits, AcceptToken of the row's next token.
// Rows follow realistic documents (an order JSON Schema with nested objects, arrays, enums,
// formats, patterns; and json_object, the recursive grammar with context-dependent tokens) at
// staggered offsets, so they sit in different states. Steady state: every document was walked
// once before timing (token sets are computed once per grammar node and kept); the first
// walk's cost (the cold pass) is reported apart, with the compile time.
// Then the same inside the engine: `small` made with the 129,280-id vocabulary (DIR-v129k), 64
// decode rows all constrained vs none, the engine's own mask time (EngineStats::
// constraint_seconds: fill + apply + advance) per step.
// Writes bench/results/grammar.{json,md}.
#include <charconv>
#include <type_traits>
#include <algorithm>
#include <cstring>
#include <filesystem>
#include <random>

#include "bench/common/bench_util.h"
#include "common/cpu_features.h"
#include "engine/engine.h"
#include "grammar/bitmask.h"
#include "grammar/constraint.h"
#include "grammar/matcher.h"
#include "model/tools/make_model.h"
#include "tokenizer/token_table.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/tokenizer_paths.h"

namespace pdserve::bench {
namespace {

constexpr int64_t kModelVocab = 129280;
constexpr int kBatch = 64;

const char* kOrderSchema = R"({"type": "object", "properties": {
    "order_id": {"type": "string", "format": "uuid"},
    "customer": {"type": "object", "properties": {"name": {"type": "string", "minLength": 1, "maxLength": 60},
        "email": {"type": "string", "format": "email"}, "vip": {"type": "boolean"}},
        "required": ["name", "email"], "additionalProperties": false},
    "items": {"type": "array", "minItems": 1, "maxItems": 20, "items": {"type": "object", "properties": {
        "sku": {"type": "string", "pattern": "^[A-Z]{3}-\\d{4}$"}, "description": {"type": "string"},
        "qty": {"type": "integer", "minimum": 1, "maximum": 999}, "price": {"type": "number"}},
        "required": ["sku", "qty", "price"], "additionalProperties": false}},
    "status": {"enum": ["pending", "paid", "shipped", "cancelled"]},
    "placed_at": {"type": "string", "format": "date-time"},
    "shipping": {"anyOf": [{"type": "null"}, {"type": "object", "properties": {
        "street": {"type": "string"}, "city": {"type": "string"}, "zip": {"type": "string", "pattern": "^\\d{5}$"},
        "country": {"type": "string", "enum": ["US", "DE", "FR", "JP", "CN"]}}, "required": ["street", "city", "country"]}]},
    "notes": {"type": ["string", "null"]}},
  "required": ["order_id", "customer", "items", "status", "placed_at", "shipping"], "additionalProperties": false})";

// Documents that validate against kOrderSchema (also objects for json_object).
const std::vector<std::string> kDocuments = {
    R"({"order_id": "123e4567-e89b-12d3-a456-426614174000", "customer": {"name": "Ada Lovelace", "email": "ada@example.com", "vip": true}, "items": [{"sku": "ABC-1234", "description": "A very long description of a mechanical calculating engine, with notes on its gears and cards.", "qty": 2, "price": 19.99}, {"sku": "XYZ-0001", "qty": 1, "price": 5}], "status": "paid", "placed_at": "2025-03-14T15:09:26Z", "shipping": {"street": "12 St James's Square", "city": "London", "country": "US"}, "notes": null})",
    "{\n  \"order_id\": \"00000000-0000-4000-8000-000000000001\",\n  \"customer\": {\n    \"name\": \"李雷\",\n    \"email\": \"li.lei@example.cn\"\n  },\n  \"items\": [\n    {\n      \"sku\": \"QQQ-9999\",\n      \"description\": \"茶叶，两盒，用于测试多字节字符的分词\",\n      \"qty\": 12,\n      \"price\": 3.5\n    }\n  ],\n  \"status\": \"pending\",\n  \"placed_at\": \"2024-12-31T23:59:59+08:00\",\n  \"shipping\": null,\n  \"notes\": \"Leave at the door\"\n}",
    R"({"order_id":"a1b2c3d4-e5f6-7890-abcd-ef0123456789","customer":{"name":"Grace Hopper","email":"grace@navy.mil","vip":false},"items":[{"sku":"COB-1959","qty":999,"price":0.01},{"sku":"BUG-1947","description":"moth \"found\" in relay #70, panel F","qty":1,"price":1e2}],"status":"shipped","placed_at":"1947-09-09T15:45:00Z","shipping":{"street":"Harvard Mark II","city":"Cambridge","zip":"02138","country":"US"}})",
    "{\"order_id\": \"ffffffff-ffff-ffff-ffff-ffffffffffff\", \"customer\": {\"name\": \"Émile Zola\", \"email\": \"emile@zola.fr\"}, \"items\": [{\"sku\": \"LIV-0042\", \"description\": \"J'accuse...!\\nA letter, printed in L'Aurore.\", \"qty\": 3, \"price\": 12.75}], \"status\": \"cancelled\", \"placed_at\": \"1898-01-13T08:00:00+01:00\", \"shipping\": {\"street\": \"142 rue Montmartre\", \"city\": \"Paris\", \"zip\": \"75002\", \"country\": \"FR\"}, \"notes\": \"Second attempt; the first parcel was returned.\"}",
};

struct Row {
  const std::vector<int32_t>* doc = nullptr;
  size_t pos = 0;
  std::unique_ptr<grammar::GrammarMatcher> m;
};

struct GrammarFigures {
  std::string name;
  double compile_ms = 0, cold_us_per_token = 0, cold_max_token_ms = 0;
  double fill_ms = 0, fill_pool_ms = 0, apply_ms = 0, advance_ms = 0;
  int64_t nodes = 0, classified = 0, state_cache_misses = 0, memory_bytes = 0;
  double total_ms() const { return std::min(fill_ms, fill_pool_ms) + apply_ms + advance_ms; }
};

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

GrammarFigures MeasureGrammar(const std::string& name, const grammar::Constraint& constraint,
                              std::shared_ptr<const grammar::Vocabulary> vocab,
                              const std::vector<std::vector<int32_t>>& docs, int steps, ThreadPool* pool) {
  GrammarFigures f;
  f.name = name;
  auto t0 = Clock::now();
  auto built = grammar::BuildGrammar(constraint);
  auto compiled = grammar::CompiledGrammar::Compile(built.value(), vocab);
  if (!compiled.ok()) {
    std::fprintf(stderr, "%s: %s\n", name.c_str(), compiled.status().ToString().c_str());
    std::exit(1);
  }
  f.compile_ms = SecondsSince(t0) * 1e3;
  const auto& g = *compiled;
  f.nodes = g->n_nodes();
  const int64_t words = vocab->mask_words();
  std::vector<uint32_t> masks(static_cast<size_t>(words * kBatch));
  // Cold pass: every document once, masks at every step (classifies the nodes they visit).
  int64_t cold_tokens = 0;
  t0 = Clock::now();
  for (const auto& doc : docs) {
    grammar::GrammarMatcher m(g);
    for (int32_t id : doc) {
      const auto t1 = Clock::now();
      m.FillNextTokenBitmask(masks.data());
      f.cold_max_token_ms = std::max(f.cold_max_token_ms, SecondsSince(t1) * 1e3);
      if (!m.AcceptToken(id).ok()) {
        std::fprintf(stderr, "%s: a document does not fit the grammar\n", name.c_str());
        std::exit(1);
      }
      ++cold_tokens;
    }
  }
  f.cold_us_per_token = SecondsSince(t0) * 1e6 / static_cast<double>(cold_tokens);
  f.classified = g->nodes_classified();

  std::vector<Row> rows(kBatch);
  for (int r = 0; r < kBatch; ++r) {
    rows[static_cast<size_t>(r)].doc = &docs[static_cast<size_t>(r) % docs.size()];
    rows[static_cast<size_t>(r)].m = std::make_unique<grammar::GrammarMatcher>(g);
    const size_t offset = static_cast<size_t>(r / static_cast<int>(docs.size())) * 7 % rows[static_cast<size_t>(r)].doc->size();
    for (size_t k = 0; k < offset; ++k) (void)rows[static_cast<size_t>(r)].m->AcceptToken((*rows[static_cast<size_t>(r)].doc)[k]);
    rows[static_cast<size_t>(r)].pos = offset;
  }
  std::vector<grammar::GrammarMatcher*> ptrs;
  for (Row& r : rows) ptrs.push_back(r.m.get());
  std::vector<float> logits(static_cast<size_t>(kModelVocab) * kBatch);
  std::mt19937 rng(1);
  for (float& x : logits) x = std::uniform_real_distribution<float>(-5, 5)(rng);
  std::vector<int32_t> row_ids(kBatch);
  for (int r = 0; r < kBatch; ++r) row_ids[static_cast<size_t>(r)] = r;
  std::vector<double> fill, fill_pool, apply, advance;
  const int64_t misses0 = g->state_mask_misses();
  for (int s = 0; s < steps; ++s) {
    auto t = Clock::now();
    grammar::FillNextTokenBitmasks(ptrs, masks.data(), words, nullptr);
    fill.push_back(SecondsSince(t));
    t = Clock::now();
    grammar::FillNextTokenBitmasks(ptrs, masks.data(), words, pool);
    fill_pool.push_back(SecondsSince(t));
    t = Clock::now();
    grammar::ApplyTokenBitmaskRows(logits.data(), kModelVocab, kModelVocab, masks.data(), words, row_ids);
    apply.push_back(SecondsSince(t));
    t = Clock::now();
    for (Row& r : rows) {
      if (r.pos == r.doc->size()) {  // document done: the row starts a new request
        r.m = std::make_unique<grammar::GrammarMatcher>(g);
        r.pos = 0;
      }
      (void)r.m->AcceptToken((*r.doc)[r.pos++]);
    }
    advance.push_back(SecondsSince(t));
    for (size_t k = 0; k < rows.size(); ++k) ptrs[k] = rows[k].m.get();
  }
  f.fill_ms = Median(fill) * 1e3;
  f.fill_pool_ms = Median(fill_pool) * 1e3;
  f.apply_ms = Median(apply) * 1e3;
  f.advance_ms = Median(advance) * 1e3;
  f.state_cache_misses = g->state_mask_misses() - misses0;
  f.memory_bytes = g->MemoryBytes();
  return f;
}

// Median decode step of the Engine on `small` with kBatch requests of `context` prompt tokens.
double DecodeStepMs(const std::string& model_dir, int64_t context, int steps, ThreadPool* pool) {
  if (!std::filesystem::exists(model_dir + "/config.json")) {
    std::printf("making the small preset in %s ...\n", model_dir.c_str());
    model::MakeModelOptions o;
    o.preset = "small";
    o.out_dir = model_dir;
    if (Status s = model::MakeModel(o); !s.ok()) return std::fprintf(stderr, "%s\n", s.ToString().c_str()), -1;
  }
  auto m = model::Model::Load(model_dir, pool);
  if (!m.ok()) return std::fprintf(stderr, "%s\n", m.status().ToString().c_str()), -1;
  engine::EngineOptions eo;
  eo.kv_cache_gib = 1.0;
  eo.scheduler.max_num_seqs = kBatch;
  eo.scheduler.max_step_tokens = 512;
  eo.seed = 1;
  auto eng = engine::Engine::Create(eo, m->get());
  if (!eng.ok()) return std::fprintf(stderr, "%s\n", eng.status().ToString().c_str()), -1;
  engine::Engine& e = **eng;
  const int64_t vocab = (*m)->config().vocab_size;
  for (int r = 0; r < kBatch; ++r) {
    std::vector<int32_t> prompt(static_cast<size_t>(context));
    for (int64_t i = 0; i < context; ++i) prompt[static_cast<size_t>(i)] = static_cast<int32_t>((i * 7919 + r * 104729 + 13) % vocab);
    engine::RequestOptions ro;
    ro.sampling.temperature = 0;
    ro.sampling.max_tokens = 100000;
    if (!e.AddRequest(std::move(prompt), std::move(ro)).ok()) return -1;
  }
  // Until every request decodes (prefill chunks share steps with decode rows before that).
  for (int guard = 0; guard < 10000; ++guard) {
    const engine::EngineStats s = e.Stats();
    if (s.waiting == 0 && s.prompt_rows >= kBatch * context && s.generated_tokens >= kBatch) break;
    e.Step();
  }
  e.Step();  // one more: every row is a decode row now
  std::vector<double> times;
  for (int s = 0; s < steps; ++s) {
    const auto t = Clock::now();
    e.Step();
    times.push_back(SecondsSince(t));
  }
  return Median(times) * 1e3;
}

// The masks inside the engine: `small` with the full 129,280-id vocabulary (so the logits and
// masks have DeepSeek's size), kBatch decode rows: the same engine step with every row
// constrained (half json_object, half the order schema; greedy and sampled) and with none.
struct EngineMaskFigures {
  double step_constrained_ms = 0, step_plain_ms = 0, mask_ms = 0, rows_per_step = 0;
  std::string load_before, load_after;
};

bool EnsureModel(const std::string& dir, int64_t vocab) {
  if (std::filesystem::exists(dir + "/config.json")) return true;
  std::printf("making the small preset (vocab %lld) in %s ...\n", static_cast<long long>(vocab), dir.c_str());
  model::MakeModelOptions o;
  o.preset = "small";
  o.out_dir = dir;
  o.vocab = vocab;
  if (Status s = model::MakeModel(o); !s.ok()) return std::fprintf(stderr, "%s\n", s.ToString().c_str()), false;
  return true;
}

// Median step time (and mask time per step) of kBatch decode rows, after their prefill.
bool EngineDecodeSteps(const model::Model& m, grammar::GrammarCache* cache, bool constrained, int64_t context,
                       int steps, double* step_ms, double* mask_ms, double* rows_per_step) {
  engine::EngineOptions eo;
  eo.kv_cache_gib = 1.0;
  eo.scheduler.max_num_seqs = kBatch;
  eo.scheduler.max_step_tokens = 512;
  eo.seed = 1;
  eo.grammars = cache;
  auto eng = engine::Engine::Create(eo, &m);
  if (!eng.ok()) return std::fprintf(stderr, "%s\n", eng.status().ToString().c_str()), false;
  engine::Engine& e = **eng;
  for (int r = 0; r < kBatch; ++r) {
    std::vector<int32_t> prompt(static_cast<size_t>(context));
    for (int64_t i = 0; i < context; ++i)
      prompt[static_cast<size_t>(i)] = static_cast<int32_t>((i * 7919 + r * 104729 + 13) % 128000);
    engine::RequestOptions ro;
    ro.sampling.temperature = r % 2 ? 1.0f : 0.0f;
    ro.sampling.max_tokens = 100000;
    if (constrained) {
      ro.constraint.spec = r % 4 < 2 ? grammar::Constraint{.kind = grammar::ConstraintKind::kJsonObject}
                                     : grammar::Constraint{.kind = grammar::ConstraintKind::kJsonSchema, .text = kOrderSchema};
    }
    if (auto id = e.AddRequest(std::move(prompt), std::move(ro)); !id.ok())
      return std::fprintf(stderr, "%s\n", id.status().ToString().c_str()), false;
  }
  for (int guard = 0; guard < 10000; ++guard) {
    const engine::EngineStats s = e.Stats();
    if (s.waiting == 0 && s.prompt_rows >= kBatch * context && s.generated_tokens >= kBatch) break;
    e.Step();
  }
  for (int k = 0; k < 3; ++k) e.Step();  // decode rows only; the grammar nodes met first are classified
  std::vector<double> times, masks;
  int64_t rows = 0;
  for (int s = 0; s < steps; ++s) {
    const engine::EngineStats before = e.Stats();
    const auto t = Clock::now();
    e.Step();
    times.push_back(SecondsSince(t));
    const engine::EngineStats after = e.Stats();
    masks.push_back(after.constraint_seconds - before.constraint_seconds);
    rows += after.constrained_rows - before.constrained_rows;
  }
  *step_ms = Median(times) * 1e3;
  *mask_ms = Median(masks) * 1e3;
  *rows_per_step = static_cast<double>(rows) / steps;
  return true;
}

EngineMaskFigures MeasureEngineMasks(const std::string& model_dir, grammar::GrammarCache* cache, int64_t context,
                                     int steps, ThreadPool* pool) {
  EngineMaskFigures f;
  if (!EnsureModel(model_dir, kModelVocab)) std::exit(1);
  auto m = model::Model::Load(model_dir, pool);
  if (!m.ok()) std::fprintf(stderr, "%s\n", m.status().ToString().c_str()), std::exit(1);
  f.load_before = CommandOutput("uptime");
  double unused = 0;
  if (!EngineDecodeSteps(**m, cache, true, context, steps, &f.step_constrained_ms, &f.mask_ms, &f.rows_per_step) ||
      !EngineDecodeSteps(**m, cache, false, context, steps, &f.step_plain_ms, &unused, &unused))
    std::exit(1);
  f.load_after = CommandOutput("uptime");
  return f;
}

std::vector<int32_t> Tokens(const tokenizer::Tokenizer& tok, const std::string& text) {
  std::vector<int32_t> ids = tok.Encode(text).value();
  ids.push_back(*tok.eos_id());
  return ids;
}

int Main(int argc, char** argv) {
  RequireCpuFeatures();
  int steps = 200, decode_steps = 5;
  int64_t context = 128;
  std::string model_dir = "models/small";
  bool skip_decode = false, skip_engine = false;
  int engine_steps = 8;
  const char* usage =
      "bench_grammar [--steps N] [--context N] [--decode-steps N] [--model DIR] [--skip-decode]\n"
      "              [--engine-steps N] [--skip-engine]\n"
      "Constrained-decoding cost: mask computation per step against a decode step "
      "(bench/grammar/bench_grammar.cc).\n";
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    // A count option's value: a whole number >= 1, or a usage error.
    auto count = [&](auto* out) {
      const std::string v = i + 1 < argc ? argv[++i] : "";
      long long n = 0;
      const auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), n);
      if (ec != std::errc() || end != v.data() + v.size() || n < 1) {
        std::fprintf(stderr, "%s '%s': expected a whole number >= 1\n%s", a.c_str(), v.c_str(), usage);
        return false;
      }
      *out = static_cast<std::remove_reference_t<decltype(*out)>>(n);
      return true;
    };
    bool ok = true;
    if (a == "--help" || a == "-h") return std::fprintf(stderr, "%s", usage), 0;
    else if (a == "--skip-decode") skip_decode = true;
    else if (a == "--skip-engine") skip_engine = true;
    else if (a == "--engine-steps") ok = count(&engine_steps);
    else if (a == "--steps") ok = count(&steps);
    else if (a == "--decode-steps") ok = count(&decode_steps);
    else if (a == "--context") ok = count(&context);
    else if (a == "--model" && i + 1 < argc) model_dir = argv[++i];
    else return std::fprintf(stderr, "unknown option '%s'\n%s", a.c_str(), usage), 2;
    if (!ok) return 2;
  }
  const std::string load_before = CommandOutput("uptime");
  auto tok = tokenizer::Tokenizer::Load(tokenizer::DefaultTokenizerDir());
  if (!tok.ok()) return std::fprintf(stderr, "%s\n", tok.status().ToString().c_str()), 1;
  auto table = tokenizer::BuildTokenByteTable(**tok, kModelVocab).value();
  auto vocab = grammar::Vocabulary::Create(std::move(table.bytes), std::move(table.is_text), table.stop_ids, kModelVocab).value();
  std::vector<std::vector<int32_t>> docs;
  for (const std::string& d : kDocuments) docs.push_back(Tokens(**tok, d));
  ThreadPool pool(2);

  std::vector<GrammarFigures> figs;
  figs.push_back(MeasureGrammar("json_schema (order)",
                                grammar::Constraint{.kind = grammar::ConstraintKind::kJsonSchema, .text = kOrderSchema},
                                vocab, docs, steps, &pool));
  figs.push_back(MeasureGrammar("json_object", grammar::Constraint{.kind = grammar::ConstraintKind::kJsonObject}, vocab,
                                docs, steps, &pool));
  const std::string load_mid = CommandOutput("uptime");
  const double decode_ms = skip_decode ? 0 : DecodeStepMs(model_dir, context, decode_steps, &pool);
  const std::string load_after = CommandOutput("uptime");
  EngineMaskFigures ef;
  grammar::GrammarCache cache(vocab);
  if (!skip_engine) ef = MeasureEngineMasks(model_dir + "-v129k", &cache, context, engine_steps, &pool);

  nlohmann::json j = {{"bench", "grammar"}, {"batch", kBatch}, {"vocab", kModelVocab}, {"steps", steps},
                      {"decode_step_ms", decode_ms}, {"decode_context", context}, {"machine", MachineName()},
                      {"commit", GitRevision()}, {"uptime_before", load_before}, {"uptime_mid", load_mid},
                      {"uptime_after", load_after}};
  std::string md = "# Structured-output mask cost per decode step (batch 64, vocab 129,280)\n\n";
  md += "| grammar | nodes (classified) | memory | compile | cold pass (max) | fill 1 thr | fill 2 thr | apply to logits | advance | total | of decode step |\n";
  md += "|---|---|---|---|---|---|---|---|---|---|---|\n";
  for (const GrammarFigures& f : figs) {
    const double share = decode_ms > 0 ? f.total_ms() / decode_ms : 0;
    j["grammars"].push_back({{"name", f.name}, {"nodes", f.nodes}, {"classified", f.classified},
                             {"compile_ms", f.compile_ms}, {"cold_us_per_token", f.cold_us_per_token},
                             {"cold_max_token_ms", f.cold_max_token_ms},
                             {"fill_ms", f.fill_ms}, {"fill_pool2_ms", f.fill_pool_ms}, {"apply_ms", f.apply_ms},
                             {"advance_ms", f.advance_ms}, {"total_ms", f.total_ms()}, {"share_of_decode_step", share},
                             {"state_cache_misses", f.state_cache_misses}, {"memory_bytes", f.memory_bytes}});
    char line[512];
    std::snprintf(line, sizeof(line),
                  "| %s | %lld (%lld) | %.1f MB | %.1f ms | %.0f us/token (%.1f ms) | %.3f ms | %.3f ms | %.3f ms | %.3f ms | %.3f ms | %.2f%% |\n",
                  f.name.c_str(), static_cast<long long>(f.nodes), static_cast<long long>(f.classified),
                  static_cast<double>(f.memory_bytes) / 1e6, f.compile_ms,
                  f.cold_us_per_token, f.cold_max_token_ms, f.fill_ms, f.fill_pool_ms, f.apply_ms, f.advance_ms, f.total_ms(), 100 * share);
    md += line;
  }
  char tail[1024];
  std::snprintf(tail, sizeof(tail),
                "\nDecode step of `small` at batch 64 (context %lld, engine, 2 threads), same run: %.1f ms (median of %d).\n"
                "Total = the faster fill + apply + advance, for all 64 rows, once every node the documents visit has its "
                "token sets (steady state); the cold pass is the first walk of the documents by one matcher, computing "
                "those sets (max: the slowest single mask).\n\n"
                "Load: before `%s`; after the grammar part `%s`; after decode `%s`.\n%s, commit %s\n",
                static_cast<long long>(context), decode_ms, decode_steps, load_before.c_str(), load_mid.c_str(),
                load_after.c_str(), MachineName().c_str(), GitRevision().c_str());
  md += tail;
  if (!skip_engine) {
    const double of_step = ef.step_constrained_ms > 0 ? ef.mask_ms / ef.step_constrained_ms : 0;
    const double of_small = decode_ms > 0 ? ef.mask_ms / decode_ms : 0;
    j["engine"] = {{"model", "small, vocab 129280"}, {"steps", engine_steps}, {"rows_masked_per_step", ef.rows_per_step},
                   {"mask_ms_per_step", ef.mask_ms}, {"step_constrained_ms", ef.step_constrained_ms},
                   {"step_unconstrained_ms", ef.step_plain_ms}, {"share_of_constrained_step", of_step},
                   {"share_of_small_decode_step", of_small}, {"uptime_before", ef.load_before},
                   {"uptime_after", ef.load_after}};
    char eng[2048];
    std::snprintf(eng, sizeof(eng),
                  "\n## Inside the engine\n\n`small` made with the 129,280-id vocabulary, %d decode rows (context %lld), "
                  "%d steps (medians): every row constrained (half json_object, half the order schema; half greedy, half "
                  "sampled), then the same rows unconstrained, in the same run.\n\n"
                  "| rows masked per step | masks per step (fill + apply + advance) | step, constrained | step, unconstrained | "
                  "masks / constrained step | masks / `small` decode step (vocab 32,000, above) |\n|---|---|---|---|---|---|\n"
                  "| %.1f | %.3f ms | %.1f ms | %.1f ms | %.2f%% | %.2f%% |\n\nLoad: before `%s`; after `%s`.\n",
                  kBatch, static_cast<long long>(context), engine_steps, ef.rows_per_step, ef.mask_ms,
                  ef.step_constrained_ms, ef.step_plain_ms, 100 * of_step, 100 * of_small, ef.load_before.c_str(),
                  ef.load_after.c_str());
    md += eng;
  }
  WriteResults("grammar", j, md);
  return 0;
}

}  // namespace
}  // namespace pdserve::bench

int main(int argc, char** argv) { return pdserve::bench::Main(argc, argv); }
