// The engine-backed worker in-process: the identity each DP rank of a multi-rank instance
// registers with (ForDpRank), and jobs placed on another DP rank refused with a clear error
// (a colocated worker over the tiny model; no router needed to call the handler).
#include <gtest/gtest.h>

#include "model/tools/make_model.h"
#include "model/test_util.h"
#include "services/worker/engine_worker.h"
#include "services/worker/model_instance.h"

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

}  // namespace
}  // namespace pdserve::services::worker
