// The multiturn dataset against a real cluster (a router and engine workers on the tiny model,
// colocated and P/D): each turn's prompt is the conversation so far, continued by the token ids
// the router returned (return_token_ids); every reply is the single-process engine's greedy
// output for that prompt; the prefix cache supplies the conversation so far (colocated: the
// previous prompt and reply; P/D: the previous prompt, which the prefill worker computed), and
// the report's cached / reusable ratio is what the records say.
#include <gtest/gtest.h>

#include "bench/loadgen/dataset.h"
#include "bench/loadgen/driver.h"
#include "bench/loadgen/stats.h"
#include "services/testing/worker_test_cluster.h"

namespace pdserve::loadgen {
namespace {

using namespace std::chrono_literals;
using router::testing::TestCluster;
using services::worker::e2e::Reference;
using services::worker::e2e::UcxTcpUsable;
using services::worker::e2e::Workers;

constexpr int64_t kBlock = 64;  // the test workers' KV block

TEST(LoadgenMultiTurn, TurnsContinueByIdsExactlyAndHitTheCache) {
  for (const bool pd : {false, true}) {
    SCOPED_TRACE(pd ? "P/D" : "colocated");
    if (pd && !UcxTcpUsable()) GTEST_SKIP() << "no /sys/class/net here: UCX's tcp transport has no device to use";
    TestCluster c(pd ? "loadgen-turns-pd" : "loadgen-turns");
    ASSERT_TRUE(c.StartRouter().ok());
    Workers w(&c);
    if (pd) {
      ASSERT_TRUE(w.Start("p0", "prefill").ok()) << w.Logs();
      ASSERT_TRUE(w.Start("d0", "decode").ok()) << w.Logs();
    } else {
      ASSERT_TRUE(w.Start("c0", "colocated").ok()) << w.Logs();
    }
    ASSERT_TRUE(c.WaitForWorkers(pd ? 2 : 1, 30s)) << w.Logs();

    DatasetOptions d;
    d.name = "multiturn";
    d.conversations = 2;
    d.turns = 3;
    d.system_len = 300;  // past the first prefill chunk (256): a hit's least
    d.user_len = 40;
    d.output_len = 24;
    d.seed = 7;
    auto specs = MakeDataset(d);
    ASSERT_TRUE(specs.ok()) << specs.status().ToString();
    AssignPoissonArrivals(&specs.value(), 0, d.seed);
    Target target;
    target.port = c.http_port();
    target.model = "pdserve";
    target.timeout = 120s;
    const std::vector<RequestRecord> records = RunConversations(target, specs.value(), 1);
    ASSERT_EQ(records.size(), specs.value().size());

    std::vector<int32_t> history;
    for (size_t i = 0; i < records.size(); ++i) {
      const RequestSpec& s = specs.value()[i];
      const RequestRecord& r = records[i];
      SCOPED_TRACE("conversation " + std::to_string(s.conversation) + " turn " + std::to_string(s.turn + 1));
      ASSERT_TRUE(r.ok) << r.error << w.Logs();
      if (s.turn == 0) history.clear();
      std::vector<int32_t> prompt = history;
      prompt.insert(prompt.end(), s.prompt_ids.begin(), s.prompt_ids.end());
      EXPECT_EQ(r.prompt_tokens, static_cast<int64_t>(prompt.size()));
      EXPECT_EQ(r.prompt_tokens, s.prompt_len);
      EXPECT_EQ(r.output_token_ids, Reference(prompt, static_cast<int>(d.output_len)));
      ASSERT_GE(r.cached_tokens, 0) << "no usage.prompt_tokens_details.cached_tokens";
      if (s.turn > 0) {
        EXPECT_EQ(r.reusable_tokens, static_cast<int64_t>(history.size()));
        // Colocated: the last turn's prompt and reply but its last token (never fed back);
        // P/D: the prefill worker's last prompt.
        const int64_t previous_prompt = static_cast<int64_t>(history.size()) - d.output_len;
        const int64_t floor = (pd ? previous_prompt : static_cast<int64_t>(history.size()) - 1) / kBlock * kBlock;
        EXPECT_GE(r.cached_tokens, floor);
      } else if (s.conversation > 0) {
        EXPECT_EQ(r.reusable_tokens, d.system_len);
        EXPECT_GE(r.cached_tokens, d.system_len / kBlock * kBlock);  // the shared system prompt
      } else {
        EXPECT_EQ(r.cached_tokens, 0);
      }
      history = prompt;
      history.insert(history.end(), r.output_token_ids.begin(), r.output_token_ids.end());
    }
    const RunSummary all = Summarize(records, Slo{});
    int64_t cached = 0, reusable = 0;
    for (const auto& r : records) cached += r.cached_tokens, reusable += r.reusable_tokens;
    EXPECT_EQ(all.cached_tokens, cached);
    EXPECT_EQ(all.reusable_tokens, reusable);
    EXPECT_DOUBLE_EQ(all.hit_rate_of_ideal, static_cast<double>(cached) / static_cast<double>(reusable));
    std::printf("[multiturn %s] cached %lld of %lld reusable prompt tokens (%.0f%%)\n", pd ? "P/D" : "colocated",
                static_cast<long long>(cached), static_cast<long long>(reusable), 100 * all.hit_rate_of_ideal);
    if (HasFailure()) ADD_FAILURE() << w.Logs();
  }
}

// The dataset's shape: one system prompt for every conversation, later turns carry only their
// own message, arrivals per conversation; chat and bad sizes are refused.
TEST(LoadgenMultiTurn, DatasetRefusesChatAndBadSizes) {
  DatasetOptions d;
  d.name = "multiturn";
  d.chat = true;
  EXPECT_NE(MakeDataset(d).status().message().find("completions"), std::string::npos);
  d.chat = false;
  d.turns = 0;
  EXPECT_FALSE(MakeDataset(d).ok());
  d.turns = 2;
  d.conversations = 3;
  d.system_len = 10;
  d.user_len = 5;
  d.output_len = 4;
  auto specs = MakeDataset(d);
  ASSERT_TRUE(specs.ok());
  ASSERT_EQ(specs.value().size(), 6u);
  // One system prompt for all; turn 2 carries only its own user message.
  for (const auto& s : specs.value()) {
    EXPECT_EQ(s.prompt_ids.size(), s.turn == 0 ? 15u : 5u);
    EXPECT_EQ(s.prompt_len, 10 + (s.turn + 1) * 5 + s.turn * 4);
    EXPECT_TRUE(std::equal(specs.value()[0].prompt_ids.begin(), specs.value()[0].prompt_ids.begin() + 10,
                           specs.value()[s.conversation * 2].prompt_ids.begin()));
  }
  AssignPoissonArrivals(&specs.value(), 2.0, 1);
  EXPECT_EQ(specs.value()[1].arrival_s, specs.value()[0].arrival_s);
  EXPECT_GT(specs.value()[2].arrival_s, specs.value()[0].arrival_s);
}

}  // namespace
}  // namespace pdserve::loadgen
