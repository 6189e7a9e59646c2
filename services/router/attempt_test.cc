// Attempt: every transition of the state machine, the messages it accepts in each state, and
// which workers get Abort when it ends (attempt.h).
#include "services/router/attempt.h"

#include <gtest/gtest.h>

namespace pdserve::router {
namespace {

using services::WorkerRole;
using namespace std::chrono_literals;
using Clock = Attempt::Clock;
using Peers = std::vector<std::string>;

TEST(AttemptTest, PlaceholderIsEnded) {
  Attempt a;
  EXPECT_FALSE(a.live());
  EXPECT_EQ(a.state(), AttemptState::kFinished);
  EXPECT_FALSE(a.SideOf("x"));
  EXPECT_FALSE(a.DependsOn("x"));
  EXPECT_TRUE(a.Holders().empty());
  EXPECT_FALSE(a.Output(1, Clock::now()));
  EXPECT_TRUE(a.End(AttemptState::kFinished).empty());
}

TEST(AttemptTest, ColocatedRunsPrefillingThenDecoding) {
  const auto t0 = Clock::now();
  Attempt a = Attempt::Colocated(7, "c");
  EXPECT_EQ(a.job_id(), 7u);
  EXPECT_FALSE(a.disaggregated());
  EXPECT_EQ(a.state(), AttemptState::kPrefilling);
  EXPECT_EQ(a.RoleOf(AttemptSide::kOutput), WorkerRole::kColocated);
  EXPECT_EQ(a.SideOf("c"), AttemptSide::kOutput);
  EXPECT_FALSE(a.SideOf("other"));
  EXPECT_TRUE(a.DependsOn("c"));
  EXPECT_FALSE(a.DependsOn("other"));
  EXPECT_EQ(a.Holders(), Peers{"c"});
  // Only a decode worker reserves KV; a colocated attempt has no relay.
  EXPECT_FALSE(a.KvReserved("c"));
  EXPECT_FALSE(a.FirstTokenRelayed(t0));
  EXPECT_EQ(a.state(), AttemptState::kPrefilling);
  // An event without tokens (e.g. an empty keep-alive) changes nothing; not stalled before
  // the first token however long it takes.
  EXPECT_TRUE(a.Output(0, t0));
  EXPECT_EQ(a.state(), AttemptState::kPrefilling);
  EXPECT_FALSE(a.Stalled(t0 + 1h, 1s));

  EXPECT_TRUE(a.Output(1, t0));
  EXPECT_EQ(a.state(), AttemptState::kDecoding);
  EXPECT_EQ(a.last_output(), t0);
  EXPECT_FALSE(a.Stalled(t0 + 1s, 1s));
  EXPECT_TRUE(a.Stalled(t0 + 1s + 1ms, 1s));
  EXPECT_TRUE(a.Output(3, t0 + 2s));
  EXPECT_EQ(a.last_output(), t0 + 2s);
  EXPECT_FALSE(a.Stalled(t0 + 2s + 500ms, 1s));
  EXPECT_EQ(a.Holders(), Peers{"c"});

  EXPECT_EQ(a.End(AttemptState::kFinished), Peers{"c"});
  EXPECT_EQ(a.state(), AttemptState::kFinished);
  EXPECT_FALSE(a.live());
  EXPECT_FALSE(a.SideOf("c"));
  EXPECT_FALSE(a.DependsOn("c"));
  EXPECT_FALSE(a.Output(1, t0));
  EXPECT_FALSE(a.Stalled(t0 + 1h, 1s));
  // Ending twice aborts nobody twice.
  EXPECT_TRUE(a.End(AttemptState::kFinished).empty());
  EXPECT_TRUE(a.End(AttemptState::kMigrating).empty());
  EXPECT_EQ(a.state(), AttemptState::kFinished);
}

TEST(AttemptTest, DisaggregatedReservesPrefillsRelaysDecodes) {
  const auto t0 = Clock::now();
  Attempt a = Attempt::Disaggregated(9, "d", "p");
  EXPECT_TRUE(a.disaggregated());
  EXPECT_EQ(a.output_peer(), "d");
  EXPECT_EQ(a.prefill_peer(), "p");
  EXPECT_EQ(a.RoleOf(AttemptSide::kOutput), WorkerRole::kDecode);
  EXPECT_EQ(a.RoleOf(AttemptSide::kPrefill), WorkerRole::kPrefill);

  // kReservingKv: only the decode worker has a job; the prefill worker is chosen (a loss of it
  // fails the attempt) but gets no Abort and its messages are not this attempt's.
  EXPECT_EQ(a.state(), AttemptState::kReservingKv);
  EXPECT_EQ(a.Holders(), Peers{"d"});
  EXPECT_TRUE(a.DependsOn("d"));
  EXPECT_TRUE(a.DependsOn("p"));
  EXPECT_EQ(a.SideOf("d"), AttemptSide::kOutput);
  EXPECT_FALSE(a.SideOf("p"));
  EXPECT_FALSE(a.FirstTokenRelayed(t0));
  EXPECT_FALSE(a.Output(1, t0)) << "a decode worker streamed before the first token";
  EXPECT_FALSE(a.KvReserved("p")) << "only the decode worker reserves";
  EXPECT_EQ(a.state(), AttemptState::kReservingKv);

  EXPECT_TRUE(a.KvReserved("d"));
  EXPECT_EQ(a.state(), AttemptState::kPrefilling);
  EXPECT_FALSE(a.KvReserved("d")) << "a duplicate reservation";
  EXPECT_EQ(a.Holders(), (Peers{"d", "p"}));
  EXPECT_EQ(a.SideOf("p"), AttemptSide::kPrefill);
  EXPECT_EQ(a.SideOf("d"), AttemptSide::kOutput);
  EXPECT_TRUE(a.DependsOn("p"));
  EXPECT_FALSE(a.Output(1, t0));
  EXPECT_TRUE(a.Output(0, t0));  // no tokens: nothing to object to
  EXPECT_FALSE(a.Stalled(t0 + 1h, 1s));

  EXPECT_TRUE(a.FirstTokenRelayed(t0));
  EXPECT_EQ(a.state(), AttemptState::kDecoding);
  EXPECT_EQ(a.last_output(), t0);
  EXPECT_FALSE(a.FirstTokenRelayed(t0)) << "relayed twice";
  // The prefill worker is done: its loss or its late messages no longer concern the attempt.
  EXPECT_EQ(a.Holders(), Peers{"d"});
  EXPECT_FALSE(a.SideOf("p"));
  EXPECT_FALSE(a.DependsOn("p"));
  EXPECT_TRUE(a.DependsOn("d"));
  EXPECT_TRUE(a.Output(2, t0 + 1s));
  EXPECT_TRUE(a.Stalled(t0 + 3s, 1s));

  EXPECT_EQ(a.End(AttemptState::kFinished), Peers{"d"});
  EXPECT_TRUE(a.End(AttemptState::kFinished).empty());
}

TEST(AttemptTest, EndAbortsTheHoldersExceptTheOneThatLetGo) {
  // Each live state, ended by each kind of end, with and without a released worker.
  struct Case {
    const char* name;
    Attempt attempt;
    std::string released;
    Peers aborted;
  };
  auto prefilling = [] {
    Attempt a = Attempt::Disaggregated(1, "d", "p");
    EXPECT_TRUE(a.KvReserved("d"));
    return a;
  };
  auto decoding = [&] {
    Attempt a = prefilling();
    EXPECT_TRUE(a.FirstTokenRelayed(Clock::now()));
    return a;
  };
  auto colocated_decoding = [] {
    Attempt a = Attempt::Colocated(1, "c");
    EXPECT_TRUE(a.Output(1, Clock::now()));
    return a;
  };
  std::vector<Case> cases = {
      {"colocated prefilling, cancelled", Attempt::Colocated(1, "c"), "", {"c"}},
      {"colocated prefilling, worker failed", Attempt::Colocated(1, "c"), "c", {}},
      {"colocated decoding, finished by the worker", colocated_decoding(), "c", {}},
      {"reserving, cancelled", Attempt::Disaggregated(1, "d", "p"), "", {"d"}},
      {"reserving, prefill worker gone", Attempt::Disaggregated(1, "d", "p"), "p", {"d"}},
      {"reserving, decode worker failed", Attempt::Disaggregated(1, "d", "p"), "d", {}},
      {"prefilling, cancelled", prefilling(), "", {"d", "p"}},
      {"prefilling, prefill worker failed", prefilling(), "p", {"d"}},
      {"prefilling, decode worker failed", prefilling(), "d", {"p"}},
      {"decoding, cancelled", decoding(), "", {"d"}},
      {"decoding, prefill worker gone (not a holder)", decoding(), "p", {"d"}},
      {"decoding, finished by the worker", decoding(), "d", {}},
  };
  for (AttemptState terminal : {AttemptState::kFinished, AttemptState::kMigrating}) {
    for (const Case& c : cases) {
      Attempt a = c.attempt;
      EXPECT_EQ(a.End(terminal, c.released), c.aborted) << c.name << " -> " << AttemptStateName(terminal);
      EXPECT_EQ(a.state(), terminal) << c.name;
      EXPECT_FALSE(a.live());
      EXPECT_TRUE(a.Holders().empty());
      EXPECT_TRUE(a.End(AttemptState::kFinished).empty()) << c.name;
      EXPECT_EQ(a.state(), terminal) << "an ended attempt keeps its end";
    }
  }
}

TEST(AttemptTest, StateNames) {
  EXPECT_STREQ(AttemptStateName(AttemptState::kReservingKv), "reserving_kv");
  EXPECT_STREQ(AttemptStateName(AttemptState::kPrefilling), "prefilling");
  EXPECT_STREQ(AttemptStateName(AttemptState::kDecoding), "decoding");
  EXPECT_STREQ(AttemptStateName(AttemptState::kMigrating), "migrating");
  EXPECT_STREQ(AttemptStateName(AttemptState::kFinished), "finished");
}

}  // namespace
}  // namespace pdserve::router
