// The model under parallel plans, under mpirun (2 and 4 ranks), against the single-process
// model computed on every rank: logits cos-sim >= 0.9999 at every greedy step and the same
// 20 greedy tokens, for
//   * DP attention + EP MoE (each rank its own prompt),
//   * CP prefill (cp = world, with and without EP; cp + TP at 4 ranks) then replicated decode,
//   * the decode plan with TP (DP units of TP pairs, EP over every rank), units with several
//     prompts of different lengths and one unit idle for most steps,
//   * routing forced onto the first EP rank's experts (the others receive nothing),
//   * one DP rank with no request at all while another decodes 24 tokens,
//   * plans that do not fit the world or the model, rejected on every rank.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <memory>

#include <nlohmann/json.hpp>

#include "comm/dp_coordinator.h"
#include "comm/mpi_comm.h"
#include "comm/process_groups.h"
#include "comm/testing/mpi_test_util.h"
#include "common/dtype.h"
#include "common/mapped_file.h"
#include "model/tools/convert.h"
#include "model/parallel.h"
#include "model/tools/parallel_greedy.h"
#include "model/test_util.h"

namespace pdserve::model {
namespace {

using comm::ParallelPlan;
using comm::testing::AllRanks;
using comm::testing::WorldRank;
using comm::testing::WorldSize;

constexpr int64_t kSteps = 20;
constexpr double kMinCos = 0.9999;

double Cosine(const float* a, const float* b, int64_t n) {
  double ab = 0, aa = 0, bb = 0;
  for (int64_t i = 0; i < n; ++i) ab += double(a[i]) * b[i], aa += double(a[i]) * a[i], bb += double(b[i]) * b[i];
  if (aa == 0 && bb == 0) return 1.0;  // e.g. an all-zero row of relu'd index scores on both sides
  return ab / std::sqrt(aa * bb);
}

std::vector<int32_t> Prompt(int64_t len, int seed, int64_t vocab) {
  std::vector<int32_t> p;
  for (int64_t i = 0; i < len; ++i) p.push_back(static_cast<int32_t>((i * 37 + seed * 101 + 11) % vocab));
  return p;
}

// Sets every MoE layer's e_score_correction_bias (F32) so that experts 0 and 1 win every
// token: all routed rows then go to the first EP rank's experts.
void ForceRoutingToFirstExperts(const std::string& dir, const ModelConfig& c) {
  auto index = nlohmann::json::parse(*ReadFileToString(dir + "/model.safetensors.index.json"));
  for (int64_t l = c.first_k_dense_replace; l < c.num_hidden_layers; ++l) {
    const std::string name = "model.layers." + std::to_string(l) + ".mlp.gate.e_score_correction_bias";
    const std::string file = dir + "/" + index["weight_map"][name].get<std::string>();
    std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
    uint64_t header_len = 0;
    f.read(reinterpret_cast<char*>(&header_len), 8);
    std::string header(header_len, '\0');
    f.read(header.data(), static_cast<std::streamsize>(header_len));
    const auto h = nlohmann::json::parse(header)[name];
    ASSERT_EQ(h["dtype"], "F32");
    std::vector<float> bias(static_cast<size_t>(c.n_routed_experts), 0.0f);
    bias[0] = bias[1] = 100.0f;
    f.seekp(static_cast<std::streamoff>(8 + header_len + h["data_offsets"][0].get<uint64_t>()));
    f.write(reinterpret_cast<const char*>(bias.data()), static_cast<std::streamsize>(bias.size() * 4));
  }
}

// Every rank builds its own copy of the same tiny checkpoint (deterministic by seed) and the
// single-process reference model.
class ParallelModelTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new testing::TempDir("par_model");
    forced_dir_ = new testing::TempDir("par_forced");
    MakeModelOptions o;
    o.preset = "tiny";
    o.seed = 7;
    o.out_dir = dir_->path();
    ASSERT_TRUE(MakeModel(o).ok());
    o.out_dir = forced_dir_->path();
    ASSERT_TRUE(MakeModel(o).ok());
    pool_ = new ThreadPool(1);
    auto ref = Model::Load(dir_->path(), pool_);
    ASSERT_TRUE(ref.ok()) << ref.status().ToString();
    ref_ = ref->release();
    ForceRoutingToFirstExperts(forced_dir_->path(), ref_->config());
    // tiny2: top-4 of 16 experts, MoE from layer 0, odd sizes: a token's experts usually span
    // EP ranks, so EP changes the routed sum's order (near-bitwise, not bitwise).
    dir2_ = new testing::TempDir("par_model2");
    o.preset = "tiny2";
    o.out_dir = dir2_->path();
    ASSERT_TRUE(MakeModel(o).ok());
    auto ref2 = Model::Load(dir2_->path(), pool_);
    ASSERT_TRUE(ref2.ok());
    ref2_ = ref2->release();
  }
  static void TearDownTestSuite() {
    delete ref2_;
    delete dir2_;
    delete ref_;
    delete pool_;
    delete dir_;
    delete forced_dir_;
  }

  // Groups + context + this rank's model for `plan` (ASSERTs are fine: every rank gets the
  // same statuses from these collective calls).
  struct Instance {
    std::unique_ptr<comm::ProcessGroups> groups;
    std::unique_ptr<ParallelContext> ctx;
    std::unique_ptr<Model> model;
  };
  static Instance Make(const ParallelPlan& plan, const std::string& dir, const Model* ref = nullptr) {
    const ModelConfig& cfg = (ref ? ref : ref_)->config();
    Instance in;
    auto world = comm::MpiComm::World();
    EXPECT_TRUE(world.ok());
    auto groups = comm::ProcessGroups::Create(*world, plan, PlanDimsOf(cfg));
    EXPECT_TRUE(groups.ok()) << groups.status().ToString();
    if (!groups.ok()) return in;
    in.groups = std::move(*groups);
    auto ctx = ParallelContext::Create(*in.groups, cfg);
    EXPECT_TRUE(ctx.ok()) << ctx.status().ToString();
    in.ctx = std::move(*ctx);
    auto m = Model::Load(dir, pool_, in.ctx.get());
    EXPECT_TRUE(m.ok()) << m.status().ToString();
    if (m.ok()) in.model = std::move(*m);
    return in;
  }

  // Every step's logits close to the reference's, and the same tokens.
  static void ExpectMatches(const GreedyRun& got, const GreedyRun& want, const std::string& what) {
    const int64_t V = static_cast<int64_t>(want.step_logits.size() / std::max<size_t>(want.output.size(), 1));
    EXPECT_EQ(got.output, want.output) << what;
    ASSERT_EQ(got.step_logits.size(), want.step_logits.size()) << what;
    double worst = 1.0;
    int64_t bitwise = 0, first_diff = -1;
    const int64_t steps = static_cast<int64_t>(got.step_logits.size()) / V;
    for (int64_t s = 0; s < steps; ++s) {
      worst = std::min(worst, Cosine(&got.step_logits[s * V], &want.step_logits[s * V], V));
      const bool same = std::memcmp(&got.step_logits[s * V], &want.step_logits[s * V], V * 4) == 0;
      bitwise += same;
      if (!same && first_diff < 0) first_diff = s;
    }
    EXPECT_GE(worst, kMinCos) << what;
    std::printf("[rank %d] %s: %lld steps, min cos %.9f, %lld/%lld steps bitwise%s\n", WorldRank(), what.c_str(),
                static_cast<long long>(steps), worst, static_cast<long long>(bitwise), static_cast<long long>(steps),
                first_diff < 0 ? "" : (" (first difference at step " + std::to_string(first_diff) + ")").c_str());
  }

  static GreedyRun Reference(const std::vector<int32_t>& prompt, int64_t max_new, const Model* model = nullptr) {
    auto r = RunGreedy(model ? *model : *ref_, prompt, max_new);
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    return r.ok() ? std::move(*r) : GreedyRun{};
  }

  static inline testing::TempDir* dir_ = nullptr;
  static inline testing::TempDir* forced_dir_ = nullptr;
  static inline ThreadPool* pool_ = nullptr;
  static inline Model* ref_ = nullptr;
  static inline testing::TempDir* dir2_ = nullptr;
  static inline Model* ref2_ = nullptr;
};

TEST_F(ParallelModelTest, DpEpGreedyMatchesSingleProcess) {
  const int W = WorldSize(), me = WorldRank();
  Instance in = Make({.cp = 1, .dp = W, .ep = W, .tp = 1}, dir_->path());
  ASSERT_TRUE(AllRanks(in.model != nullptr));
  EXPECT_EQ(in.model->weights().expert_end() - in.model->weights().expert_begin(), 8 / W);
  const auto prompt = Prompt(24 + 7 * me, me, ref_->config().vocab_size);
  auto got = RunGreedy(*in.model, prompt, kSteps);  // same number of forwards on every rank
  ASSERT_TRUE(AllRanks(got.ok())) << got.status().ToString();
  ExpectMatches(*got, Reference(prompt, kSteps), "dp=" + std::to_string(W) + " ep=" + std::to_string(W));
}

TEST_F(ParallelModelTest, DpEpGreedyMatchesSingleProcessTiny2) {
  const int W = WorldSize(), me = WorldRank();
  Instance in = Make({.cp = 1, .dp = W, .ep = W, .tp = 1}, dir2_->path(), ref2_);
  ASSERT_TRUE(AllRanks(in.model != nullptr));
  const auto prompt = Prompt(29 + 5 * me, 3 + me, ref2_->config().vocab_size);
  auto got = RunGreedy(*in.model, prompt, kSteps);
  ASSERT_TRUE(AllRanks(got.ok())) << got.status().ToString();
  ExpectMatches(*got, Reference(prompt, kSteps, ref2_), "tiny2 dp=" + std::to_string(W) + " ep=" + std::to_string(W));
}

// The shared expert computed during the EP exchanges (the default) or before the dispatch gives
// bitwise the same run; the dispatcher counts every exchange, its time in flight and the part
// waited for.
TEST_F(ParallelModelTest, SharedExpertOverlapChangesNoNumber) {
  const int W = WorldSize(), me = WorldRank();
  Instance in = Make({.cp = 1, .dp = W, .ep = W, .tp = 1}, dir_->path());
  ASSERT_TRUE(AllRanks(in.model != nullptr));
  const auto prompt = Prompt(31 + 3 * me, 2 + me, ref_->config().vocab_size);
  comm::EpDispatcher& ep = *in.ctx->ep();
  ASSERT_TRUE(in.ctx->ep_overlap());
  ep.ResetOverlap();
  auto overlapped = RunGreedy(*in.model, prompt, 6);
  ASSERT_TRUE(AllRanks(overlapped.ok())) << overlapped.status().ToString();
  const comm::EpOverlap o = ep.overlap();
  const int64_t moe_layers = ref_->config().num_hidden_layers - ref_->config().first_k_dense_replace;
  EXPECT_EQ(o.exchanges, 2 * moe_layers * 6);  // a dispatch and a combine per MoE layer per forward
  EXPECT_GE(o.in_flight_seconds, o.exposed_seconds);
  EXPECT_GE(o.exposed_seconds, 0.0);
  in.ctx->set_ep_overlap(false);
  auto sequential = RunGreedy(*in.model, prompt, 6);
  in.ctx->set_ep_overlap(true);
  ASSERT_TRUE(AllRanks(sequential.ok())) << sequential.status().ToString();
  EXPECT_EQ(overlapped->output, sequential->output);
  EXPECT_EQ(overlapped->step_logits, sequential->step_logits);
}

TEST_F(ParallelModelTest, CpPrefillMatchesSingleProcess) {
  const int W = WorldSize();
  std::vector<ParallelPlan> plans = {{.cp = W, .dp = 1, .ep = W, .tp = 1}, {.cp = W, .dp = 1, .ep = 1, .tp = 1}};
  if (W == 4) {
    plans.push_back({.cp = 4, .dp = 1, .ep = 2, .tp = 1});
    plans.push_back({.cp = 2, .dp = 1, .ep = 4, .tp = 2});
  }
  // 83 tokens: uneven chunks, > 8 rows on every rank at cp = 4; the indexer's top-16 is sparse.
  const auto prompt = Prompt(83, 5, ref_->config().vocab_size);
  const GreedyRun want = Reference(prompt, kSteps);
  for (const ParallelPlan& plan : plans) {
    Instance in = Make(plan, dir_->path());
    ASSERT_TRUE(AllRanks(in.model != nullptr));
    auto got = RunGreedyCp(*in.model, prompt, kSteps);
    ASSERT_TRUE(AllRanks(got.ok())) << got.status().ToString();
    ExpectMatches(*got, want, plan.ToString());
    EXPECT_GT(in.ctx->comm_seconds(), 0.0);
    // A prompt too short for > 8 rows per CP rank runs replicated (MoE rows split over the unit).
    const auto short_prompt = Prompt(13, 6, ref_->config().vocab_size);
    auto got_short = RunGreedyCp(*in.model, short_prompt, 8);
    ASSERT_TRUE(AllRanks(got_short.ok()));
    ExpectMatches(*got_short, Reference(short_prompt, 8), plan.ToString() + " short prompt");
  }
}

// A prompt's rest after a cached prefix (RowGrouping::kPromptRest: how a CP unit's prefix cache
// computes a hit's remainder): the prefix's KV from an earlier CP prefill of its own, then the
// rest split over the CP ranks (35 tokens) or replicated (3 tokens: too short to split). Its
// logits and every KV byte equal one CP prefill of the whole prompt, bit for bit.
TEST_F(ParallelModelTest, CpPromptRestAfterACachedPrefixIsTheWholePromptBitwise) {
  const int W = WorldSize();
  const ModelConfig& c = ref_->config();
  std::vector<ParallelPlan> plans = {{.cp = W, .dp = 1, .ep = 1, .tp = 1}, {.cp = W, .dp = 1, .ep = W, .tp = 1}};
  if (W == 4) plans.push_back({.cp = 2, .dp = 1, .ep = 4, .tp = 2});
  const auto prompt = Prompt(83, 7, c.vocab_size);
  const int64_t n = static_cast<int64_t>(prompt.size());
  for (const ParallelPlan& plan : plans) {
    Instance in = Make(plan, dir_->path());
    ASSERT_TRUE(AllRanks(in.model != nullptr));
    SequenceKvCache whole(c);
    std::vector<float> want(static_cast<size_t>(c.vocab_size));
    ASSERT_TRUE(AllRanks(in.model->ForwardCp(prompt.data(), n, &whole, want.data()).ok()));
    for (int64_t prefix : {int64_t{48}, int64_t{80}}) {
      SequenceKvCache cache(c);
      std::vector<float> prefix_logits(static_cast<size_t>(c.vocab_size)), got(static_cast<size_t>(c.vocab_size));
      ASSERT_TRUE(AllRanks(in.model->ForwardCp(prompt.data(), prefix, &cache, prefix_logits.data()).ok()));
      cache.Resize(n);
      BatchSequence rest;
      rest.tokens = prompt.data() + prefix;
      rest.n_tokens = n - prefix;
      rest.start = prefix;
      rest.kv = cache.Ref();
      rest.grouping = RowGrouping::kPromptRest;
      rest.logits = got.data();
      ASSERT_TRUE(AllRanks(in.model->ForwardCp(rest).ok())) << plan.ToString();
      const std::string what = plan.ToString() + ", prefix " + std::to_string(prefix);
      EXPECT_EQ(std::memcmp(got.data(), want.data(), want.size() * sizeof(float)), 0) << what;
      for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
        const kernels::KvTokenView a = cache.View(l), b = whole.View(l);
        const std::pair<int64_t, int64_t> fields[] = {{a.latent_offset, a.latent_stride},
                                                      {a.latent_scale_offset, a.latent_scale_stride},
                                                      {a.kpe_offset, a.kpe_stride},
                                                      {a.idx_k_offset, a.idx_k_stride},
                                                      {a.idx_scale_offset, a.idx_scale_stride}};
        for (int64_t t = 0; t < n; ++t)
          for (const auto& [offset, stride] : fields)
            ASSERT_EQ(std::memcmp(a.Field(t, offset, stride), b.Field(t, offset, stride), static_cast<size_t>(stride)), 0)
                << what << ": KV of layer " << l << " position " << t << " (field at offset " << offset << ")";
      }
    }
    // A kChunk at start > 0 is no CP prefill.
    SequenceKvCache cache(c);
    cache.Resize(n);
    BatchSequence chunk;
    chunk.tokens = prompt.data() + 8;
    chunk.n_tokens = n - 8;
    chunk.start = 8;
    chunk.kv = cache.Ref();
    EXPECT_EQ(in.model->ForwardCp(chunk).code(), StatusCode::kInvalidArgument);
  }
}

// A traced CP prefill (what `generate --plan --dump-dir` records): every CP rank ends with the
// whole prompt's trace in the single-process layout, each position filled by its owner rank.
TEST_F(ParallelModelTest, CpPrefillTraceIsTheWholePromptOnEveryRank) {
  const int W = WorldSize();
  const ModelConfig& c = ref_->config();
  const int64_t L = c.num_hidden_layers, D = c.hidden_size;
  for (int64_t len : {int64_t{83}, int64_t{13}}) {  // 13: too short for CP, replicated prefill
    const auto prompt = Prompt(len, 5, c.vocab_size);
    ForwardTrace want;
    {
      SequenceKvCache cache(c);
      std::vector<float> logits(static_cast<size_t>(c.vocab_size));
      ForwardOptions o;
      o.trace = &want;
      ASSERT_TRUE(ref_->Forward(prompt.data(), len, &cache, logits.data(), o).ok());
    }
    Instance in = Make({.cp = W, .dp = 1, .ep = W, .tp = 1}, dir_->path());
    ASSERT_TRUE(AllRanks(in.model != nullptr));
    SequenceKvCache cache(c);
    std::vector<float> logits(static_cast<size_t>(c.vocab_size));
    ForwardTrace got;
    ASSERT_TRUE(AllRanks(in.model->ForwardCp(prompt.data(), len, &cache, logits.data(), &got).ok()));
    ASSERT_EQ(got.hidden.size(), static_cast<size_t>((L + 1) * len * D));
    ASSERT_EQ(got.index_scores.size(), want.index_scores.size());
    EXPECT_EQ(got.topk, want.topk) << "prompt of " << len;
    for (int64_t l = 0; l <= L; ++l)
      for (int64_t p = 0; p < len; ++p)  // per position: a position left unfilled would be all zeros
        ASSERT_GE(Cosine(&got.hidden[(l * len + p) * D], &want.hidden[(l * len + p) * D], D), kMinCos)
            << "hidden row " << l << " position " << p << ", prompt of " << len;
    for (int64_t l = 0; l < L; ++l)
      for (int64_t p = 0; p < len; ++p)  // causal scores, keys [0, p]
        ASSERT_GE(Cosine(&got.index_scores[(l * len + p) * len], &want.index_scores[(l * len + p) * len], p + 1), kMinCos)
            << "index scores layer " << l << " position " << p << ", prompt of " << len;
  }
}

// The decode plan: DP units of TP peers, EP over every rank. Unit 0 decodes two prompts for 20
// tokens; unit 1 (at 4 ranks) decodes two short requests and then idles for most steps.
TEST_F(ParallelModelTest, DecodePlanWithTpMatchesSingleProcess) {
  const int W = WorldSize();
  const ParallelPlan plan = W == 4 ? ParallelPlan{.cp = 1, .dp = 2, .ep = 4, .tp = 2}
                                   : ParallelPlan{.cp = 1, .dp = 1, .ep = 2, .tp = 2};
  Instance in = Make(plan, dir_->path());
  ASSERT_TRUE(AllRanks(in.model != nullptr));
  EXPECT_EQ(in.model->weights().local_heads(), ref_->config().num_attention_heads / 2);
  auto coordinator = comm::DpCoordinator::Create(in.groups->world());
  ASSERT_TRUE(coordinator.ok());
  const int unit = in.groups->coords().dp;
  const int64_t V = ref_->config().vocab_size;
  std::vector<std::vector<int32_t>> prompts = {Prompt(30 + 11 * unit, 2 * unit, V), Prompt(17, 2 * unit + 1, V)};
  std::vector<int64_t> max_new = unit == 0 ? std::vector<int64_t>{kSteps, kSteps} : std::vector<int64_t>{3, 1};
  DpRunStats stats;
  auto got = RunGreedyDp(*in.model, coordinator->get(), prompts, max_new, &stats);
  ASSERT_TRUE(AllRanks(got.ok())) << got.status().ToString();
  for (size_t i = 0; i < prompts.size(); ++i)
    ExpectMatches((*got)[i], Reference(prompts[i], max_new[i]), plan.ToString() + " unit " + std::to_string(unit) +
                                                                     " prompt " + std::to_string(i));
  EXPECT_EQ(stats.steps, kSteps + 1);  // 1 prefill step + 19 decode steps + the stop vote
  if (unit == 1) {
    EXPECT_GE(stats.dummy_steps, kSteps - 4);
  }
}

// Routing forced onto experts 0 and 1 (EP rank 0): every other EP rank receives no rows in any
// MoE layer, yet takes part in every exchange.
TEST_F(ParallelModelTest, ForcedRoutingLeavesRanksWithoutRows) {
  const int W = WorldSize(), me = WorldRank();
  auto forced_ref = Model::Load(forced_dir_->path(), pool_);
  ASSERT_TRUE(forced_ref.ok());
  Instance in = Make({.cp = 1, .dp = W, .ep = W, .tp = 1}, forced_dir_->path());
  ASSERT_TRUE(AllRanks(in.model != nullptr));
  const auto prompt = Prompt(26 + 3 * me, 9 + me, ref_->config().vocab_size);
  // One prefill with stats: only EP rank 0 runs routed experts.
  SequenceKvCache cache(ref_->config());
  std::vector<float> logits(static_cast<size_t>(ref_->config().vocab_size));
  BatchSequence q;
  q.tokens = prompt.data();
  q.n_tokens = static_cast<int64_t>(prompt.size());
  q.logits = logits.data();
  cache.Resize(q.n_tokens);
  q.kv = cache.Ref();
  BatchStats stats;
  ASSERT_TRUE(AllRanks(in.model->ForwardBatch({&q, 1}, &stats).ok()));
  const auto runs = comm::testing::AllGather(stats.routed_expert_runs);
  EXPECT_GT(runs[0], 0);
  for (int r = 1; r < W; ++r) EXPECT_EQ(runs[r], 0) << "EP rank " << r << " received rows";
  auto got = RunGreedy(*in.model, prompt, kSteps);
  ASSERT_TRUE(AllRanks(got.ok()));
  ExpectMatches(*got, Reference(prompt, kSteps, forced_ref->get()), "forced routing ep=" + std::to_string(W));
}

// DP rank 1 has no request at all; rank 0 decodes 24 tokens; the others stop after 2.
TEST_F(ParallelModelTest, IdleDpRankRunsDummySteps) {
  const int W = WorldSize(), me = WorldRank();
  Instance in = Make({.cp = 1, .dp = W, .ep = W, .tp = 1}, dir_->path());
  ASSERT_TRUE(AllRanks(in.model != nullptr));
  auto coordinator = comm::DpCoordinator::Create(in.groups->world());
  ASSERT_TRUE(coordinator.ok());
  std::vector<std::vector<int32_t>> prompts;
  std::vector<int64_t> max_new;
  if (me != 1) {
    prompts.push_back(Prompt(20 + me, 40 + me, ref_->config().vocab_size));
    max_new.push_back(me == 0 ? 24 : 2);
  }
  DpRunStats stats;
  auto got = RunGreedyDp(*in.model, coordinator->get(), prompts, max_new, &stats);
  ASSERT_TRUE(AllRanks(got.ok())) << got.status().ToString();
  if (me != 1) {
    ExpectMatches((*got)[0], Reference(prompts[0], max_new[0]), "dp idle test");
  }
  EXPECT_EQ(stats.steps, 25);
  if (me == 1) {
    EXPECT_EQ(stats.dummy_steps, 24);
    EXPECT_EQ(stats.forward_steps, 0);
  }
  // Every rank ran as many EP rounds: one per MoE layer per step with work anywhere.
  const auto rounds = comm::testing::AllGather(in.ctx->ep()->rounds());
  for (int r = 1; r < W; ++r) EXPECT_EQ(rounds[r], rounds[0]);
}

// A W8A8 checkpoint converted with --ep-size = world: each rank opens only its own index and
// shards (its experts + the shared tensors) and matches the single-process W8A8 model. TP is
// refused for W8A8 (o_proj cannot be column-sharded) on every rank, at load.
TEST_F(ParallelModelTest, W8A8RankShardsMatchSingleProcess) {
  const int W = WorldSize(), me = WorldRank();
  testing::TempDir d("par_w8");
  ConvertOptions co;
  co.in_dir = dir_->path();
  co.out_dir = d / "w8";
  co.ep_size = W;
  co.pool = pool_;
  ASSERT_TRUE(AllRanks(Convert(co).ok()));
  auto w8_ref = Model::Load(co.out_dir, pool_);
  ASSERT_TRUE(AllRanks(w8_ref.ok()));
  Instance in = Make({.cp = 1, .dp = W, .ep = W, .tp = 1}, co.out_dir);
  ASSERT_TRUE(AllRanks(in.model != nullptr));
  const auto prompt = Prompt(21 + 4 * me, 60 + me, ref_->config().vocab_size);
  auto got = RunGreedy(*in.model, prompt, kSteps);
  ASSERT_TRUE(AllRanks(got.ok()));
  ExpectMatches(*got, Reference(prompt, kSteps, w8_ref->get()), "w8a8 rank shards ep=" + std::to_string(W));

  auto world = comm::MpiComm::World();
  auto groups = comm::ProcessGroups::Create(*world, {.cp = 1, .dp = W / 2, .ep = W, .tp = 2}, PlanDimsOf(ref_->config()));
  ASSERT_TRUE(groups.ok());
  auto ctx = ParallelContext::Create(**groups, ref_->config());
  ASSERT_TRUE(ctx.ok());
  auto tp_model = Model::Load(co.out_dir, pool_, ctx->get());
  EXPECT_FALSE(tp_model.ok());
  EXPECT_NE(tp_model.status().message().find("cannot be sharded by input columns"), std::string::npos)
      << tp_model.status().ToString();
}

// A bad request on one DP rank stops every rank (its own error there, kAborted elsewhere)
// instead of leaving the others blocked in an EP exchange.
TEST_F(ParallelModelTest, BadRequestOnOneRankStopsEveryRank) {
  const int W = WorldSize(), me = WorldRank();
  Instance in = Make({.cp = 1, .dp = W, .ep = W, .tp = 1}, dir_->path());
  ASSERT_TRUE(AllRanks(in.model != nullptr));
  auto coordinator = comm::DpCoordinator::Create(in.groups->world());
  ASSERT_TRUE(coordinator.ok());
  auto prompt = Prompt(12, me, ref_->config().vocab_size);
  if (me == W - 1) prompt[3] = static_cast<int32_t>(ref_->config().vocab_size) + 5;
  auto got = RunGreedyDp(*in.model, coordinator->get(), {prompt}, {4});
  ASSERT_FALSE(got.ok());
  EXPECT_EQ(got.status().code(), me == W - 1 ? StatusCode::kInvalidArgument : StatusCode::kAborted)
      << got.status().ToString();
}

TEST_F(ParallelModelTest, MisconfiguredPlanFailsOnEveryRank) {
  const int W = WorldSize();
  auto world = comm::MpiComm::World();
  ASSERT_TRUE(world.ok());
  // ep = 3 divides neither the 8 experts nor (at 2 and 4 ranks) the world; cp = 3 misses the world.
  for (const ParallelPlan& plan : {ParallelPlan{.cp = 1, .dp = W, .ep = 3, .tp = 1},
                                   ParallelPlan{.cp = 3, .dp = 1, .ep = 1, .tp = 1},
                                   ParallelPlan{.cp = 1, .dp = W / 2, .ep = 1, .tp = 2 * 4}}) {
    auto groups = comm::ProcessGroups::Create(*world, plan, PlanDimsOf(ref_->config()));
    EXPECT_FALSE(groups.ok()) << plan.ToString();
    if (!groups.ok()) {
      EXPECT_EQ(groups.status().code(), StatusCode::kInvalidArgument);
      EXPECT_FALSE(groups.status().message().empty());
    }
  }
}

}  // namespace
}  // namespace pdserve::model
