// The engine-backed worker in-process: the identity each DP rank of a multi-rank instance
// registers with (ForDpRank), jobs placed on another DP rank refused with a clear error, and a
// job's output constraint compiled over the model's vocabulary (or refused with the reason)
// (colocated workers over tiny models; no router needed to call the handler), and the prefix
// cache's disk tier keys reaching the engine and its metrics.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>

#include <prometheus/registry.h>

#include "model/tools/make_model.h"
#include "model/test_util.h"
#include "services/worker/engine_worker.h"
#include "services/worker/model_instance.h"
#include "services/worker/worker_grammars.h"

namespace pdserve::services::worker {
namespace {

TEST(WorkerServiceTest, EveryDpRankGetsItsOwnIdentity) {
  WorkerServiceConfig c;
  c.worker_id = "decode-a";
  c.ready_file = "/tmp/d.ready";
  c.metrics_port = 9100;
  const WorkerServiceConfig one = ForDpRank(c, 0, 1);
  EXPECT_EQ(one.worker_id, "decode-a");
  EXPECT_EQ(one.ready_file, "/tmp/d.ready");
  EXPECT_EQ(one.metrics_port, 9100);
  const WorkerServiceConfig r1 = ForDpRank(c, 1, 2);
  EXPECT_EQ(r1.worker_id, "decode-a-dp1");
  EXPECT_EQ(r1.ready_file, "/tmp/d.ready.dp1");
  EXPECT_EQ(r1.metrics_port, 9101);
  c.metrics_port = 0;  // ephemeral stays ephemeral
  EXPECT_EQ(ForDpRank(c, 1, 2).metrics_port, 0);
}

TEST(WorkerServiceTest, JobForAnotherDpRankIsRefused) {
  model::testing::TempDir dir("worker_service");
  model::MakeModelOptions o;
  o.preset = "tiny";
  o.seed = 3;
  o.out_dir = dir.path();
  ASSERT_TRUE(model::MakeModel(o).ok());
  WorkerServiceConfig c;
  c.model_dir = dir.path();
  c.threads = 1;
  c.kv_cache_gib = 0.0625;
  int argc = 0;
  char** argv = nullptr;
  auto instance = ModelInstance::Load(c, &argc, &argv);
  ASSERT_TRUE(instance.ok()) << instance.status().ToString();
  auto worker = EngineWorker::Create(c, nullptr, instance->get());
  ASSERT_TRUE(worker.ok()) << worker.status().ToString();
  EXPECT_EQ((*worker)->Capacity().dp_ranks, 1u);

  JobMsg job;
  job.request_id = 7;
  job.phase = JobPhase::kColocated;
  job.prompt = {1, 2, 3};
  job.sampling.max_tokens = 2;
  job.dp_rank = 1;  // this worker is DP rank 0 of 1
  const Status refused = (*worker)->StartJob(job);
  EXPECT_EQ(refused.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(refused.message().find("job for DP rank 1 reached worker-0, DP rank 0 of 1"), std::string::npos)
      << refused.ToString();
  job.dp_rank = 0;
  EXPECT_TRUE((*worker)->StartJob(job).ok());
}

// The bundled tokenizer over DeepSeek-V3's 129,280 logit rows: a schema compiles once and is
// then a cache hit; a bad schema is the client's error naming the keyword; a model with fewer
// rows than the tokenizer has ids cannot host structured output, and says why every time.
TEST(WorkerGrammarsTest, CompilesOnceAndRefusesWithReasons) {
  grammar::Constraint schema;
  schema.kind = grammar::ConstraintKind::kJsonSchema;
  schema.text = R"({"type":"object","properties":{"n":{"type":"integer"}},"required":["n"]})";
  WorkerGrammars grammars("", 129280);
  auto first = grammars.Compile(schema);
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  auto again = grammars.Compile(schema);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(first->get(), again->get());
  EXPECT_EQ(grammars.misses(), 1);
  EXPECT_EQ(grammars.hits(), 1);
  grammar::Constraint bad = schema;
  bad.text = R"({"type":"object","patternProperties":{"a":{}}})";
  auto refused = grammars.Compile(bad);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(refused.status().message().find("patternProperties"), std::string::npos) << refused.status().ToString();

  WorkerGrammars small("", 1024);
  for (int i = 0; i < 2; ++i) {
    auto no = small.Compile(schema);
    ASSERT_FALSE(no.ok());
    EXPECT_EQ(no.status().code(), StatusCode::kFailedPrecondition);
    EXPECT_NE(no.status().message().find("structured output is unavailable on this worker"), std::string::npos)
        << no.status().ToString();
  }
  WorkerGrammars missing("/nonexistent-tokenizer-dir", 129280);
  auto none = missing.Compile(schema);
  EXPECT_EQ(none.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(none.status().message().find("/nonexistent-tokenizer-dir"), std::string::npos) << none.status().ToString();
}

// A colocated worker takes a constrained job when its model covers the tokenizer and refuses
// it, naming the reason, when it does not.
TEST(WorkerServiceTest, ConstrainedJobsAreCompiledOrRefused) {
  grammar::Constraint schema;
  schema.kind = grammar::ConstraintKind::kJsonObject;
  for (const int64_t vocab : {int64_t{129280}, int64_t{1024}}) {
    SCOPED_TRACE(vocab);
    model::testing::TempDir dir("worker_grammar");
    model::MakeModelOptions o;
    o.preset = "tiny";
    o.seed = 5;
    o.vocab = vocab;
    o.out_dir = dir.path();
    ASSERT_TRUE(model::MakeModel(o).ok());
    WorkerServiceConfig c;
    c.model_dir = dir.path();
    c.threads = 1;
    c.kv_cache_gib = 0.0625;
    int argc = 0;
    char** argv = nullptr;
    auto instance = ModelInstance::Load(c, &argc, &argv);
    ASSERT_TRUE(instance.ok()) << instance.status().ToString();
    auto worker = EngineWorker::Create(c, nullptr, instance->get());
    ASSERT_TRUE(worker.ok()) << worker.status().ToString();
    JobMsg job;
    job.request_id = 9;
    job.phase = JobPhase::kColocated;
    job.prompt = {1, 2, 3};
    job.sampling.max_tokens = 4;
    job.constraint = schema;
    const Status s = (*worker)->StartJob(job);
    if (vocab == 129280) {
      EXPECT_TRUE(s.ok()) << s.ToString();
    } else {
      EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition) << s.ToString();
      EXPECT_NE(s.message().find("model vocabulary 1024 is smaller than the tokenizer's"), std::string::npos)
          << s.ToString();
    }
  }
}

// The disk tier's yaml keys and flags reach the engine: a tier in <dir>/<worker id>, its
// metrics registered; a bound that is not positive is refused.
TEST(WorkerServiceTest, PrefixCacheDiskTierKeysReachTheEngine) {
  model::testing::TempDir dir("worker_tier");
  model::MakeModelOptions o;
  o.preset = "tiny";
  o.seed = 3;
  o.out_dir = dir / "model";
  ASSERT_TRUE(model::MakeModel(o).ok());
  const std::string yaml = dir / "worker.yaml";
  std::ofstream(yaml) << "worker:\n  prefix_cache_disk_dir: " << (dir / "from-yaml") << "\n  prefix_cache_disk_gib: 2\n";
  const CommandSpec& spec = WorkerCommandSpec(WorkerRole::kColocated);
  auto parse = [&](std::vector<std::string> extra) {
    std::vector<std::string> args = {"--router", "tcp://127.0.0.1:1", "--model", o.out_dir, "--threads", "1",
                                     "--kv-gib", "0.0625", "--worker-id", "c7"};
    args.insert(args.end(), extra.begin(), extra.end());
    auto cl = CommandLine::Parse(args, spec);
    EXPECT_TRUE(cl.ok()) << cl.status().ToString();
    return WorkerConfigFromCommandLine(*cl, WorkerRole::kColocated);
  };
  auto from_yaml = parse({"--config", yaml});
  ASSERT_TRUE(from_yaml.ok()) << from_yaml.status().ToString();
  EXPECT_EQ(from_yaml->prefix_cache_disk_dir, dir / "from-yaml");
  EXPECT_EQ(from_yaml->prefix_cache_disk_gib, 2.0);
  auto c = parse({"--config", yaml, "--prefix-cache-disk-dir", dir / "tiers", "--prefix-cache-disk-gib", "0.5"});
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->prefix_cache_disk_dir, dir / "tiers");
  EXPECT_EQ(c->prefix_cache_disk_gib, 0.5);
  EXPECT_EQ(parse({"--prefix-cache-disk-gib", "0"}).status().code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(parse({}).ok());
  EXPECT_TRUE(parse({}).value().prefix_cache_disk_dir.empty());  // off by default

  int argc = 0;
  char** argv = nullptr;
  auto instance = ModelInstance::Load(*c, &argc, &argv);
  ASSERT_TRUE(instance.ok()) << instance.status().ToString();
  auto registry = std::make_shared<prometheus::Registry>();
  auto worker = EngineWorker::Create(*c, registry, instance->get());
  ASSERT_TRUE(worker.ok()) << worker.status().ToString();
  EXPECT_TRUE(std::filesystem::exists(dir / "tiers/c7/LOCK"));
  (*worker)->CurrentLoad();  // refreshes the engine metrics
  std::vector<std::string> names;
  for (const auto& family : registry->Collect()) names.push_back(family.name);
  for (const char* name : {"pdserve_prefix_cache_tier_blocks", "pdserve_prefix_cache_tier_bytes",
                           "pdserve_prefix_cache_tier_stored_blocks_total", "pdserve_prefix_cache_tier_stored_bytes_total",
                           "pdserve_prefix_cache_tier_restored_tokens_total", "pdserve_prefix_cache_tier_evictions_total",
                           "pdserve_prefix_cache_tier_corrupt_files_total"}) {
    EXPECT_NE(std::find(names.begin(), names.end(), name), names.end()) << name;
  }
}

}  // namespace
}  // namespace pdserve::services::worker
