// PrefillPace: the pace a worker serves prompt tokens at, learned from served prefills, and the
// tokens it has probably not computed yet (prefill_pace.h).
#include "services/router/prefill_pace.h"

#include <gtest/gtest.h>

namespace pdserve::router {
namespace {

using namespace std::chrono_literals;
using Clock = PrefillPace::Clock;

TEST(PrefillPaceTest, WithoutAServedPrefillTheOpenTokensAreAllLeft) {
  PrefillPace pace;
  const Clock::time_point t0{};
  pace.Opened(2000, t0);
  EXPECT_EQ(pace.tokens_per_second(), 0.0);
  EXPECT_EQ(pace.TokensLeft(t0 + 60s), 2000);
  // Closed without being served (cancelled): nothing learned, nothing open.
  pace.Closed(2000, false, t0 + 1s);
  EXPECT_EQ(pace.tokens_per_second(), 0.0);
  EXPECT_EQ(pace.open_jobs(), 0);
  EXPECT_EQ(pace.TokensLeft(t0 + 2s), 0);
}

TEST(PrefillPaceTest, LearnsThePaceAndCountsDownTheOpenTokens) {
  PrefillPace pace;
  const Clock::time_point t0{};
  pace.Opened(1000, t0);
  pace.Closed(1000, true, t0 + 5s);  // 200 tokens/s
  EXPECT_DOUBLE_EQ(pace.tokens_per_second(), 200.0);
  // Idle from 5 s to 20 s: busy time starts at the next charge, not at the last served one.
  pace.Opened(2000, t0 + 20s);
  EXPECT_EQ(pace.TokensLeft(t0 + 20s), 2000);
  EXPECT_EQ(pace.TokensLeft(t0 + 25s), 1000);
  // A second prompt queued behind it: the count-down runs over both.
  pace.Opened(500, t0 + 25s);
  EXPECT_EQ(pace.TokensLeft(t0 + 27s), 2500 - 1400);
  // A worker slower than its pace never shows below zero.
  EXPECT_EQ(pace.TokensLeft(t0 + 100s), 0);
  // The first served at 30 s (2000 tokens in 10 s): the pace moves toward 200 and the count
  // restarts from there for what is left.
  pace.Closed(2000, true, t0 + 30s);
  EXPECT_NEAR(pace.tokens_per_second(), (0.75 * 1000 + 2000) / (0.75 * 5 + 10), 1e-9);
  EXPECT_EQ(pace.TokensLeft(t0 + 30s), 500);
  EXPECT_EQ(pace.open_jobs(), 1);
}

TEST(PrefillPaceTest, JobsServedTogetherCountAtTheirJointPace) {
  // Two prompts computed as one batch: both placed at 0, served at 4 s and 4.5 s. The second's
  // own 0.5 s would suggest 800 tokens/s; together they ran at 1400 / 4.5 s.
  PrefillPace pace;
  const Clock::time_point t0{};
  pace.Opened(1000, t0);
  pace.Opened(400, t0);
  pace.Closed(1000, true, t0 + 4s);
  pace.Closed(400, true, t0 + 4500ms);
  EXPECT_NEAR(pace.tokens_per_second(), (0.75 * 1000 + 400) / (0.75 * 4 + 0.5), 1e-9);
  EXPECT_NEAR(pace.tokens_per_second(), 1400 / 4.5, 20.0);
}

TEST(PrefillPaceTest, AFasterPhaseShowsWithinAFewJobs) {
  PrefillPace pace;
  Clock::time_point t{};
  for (int i = 0; i < 10; ++i) {  // 100 tokens/s
    pace.Opened(100, t);
    t += 1s;
    pace.Closed(100, true, t);
  }
  EXPECT_NEAR(pace.tokens_per_second(), 100.0, 1e-6);
  for (int i = 0; i < 8; ++i) {  // then 400 tokens/s
    pace.Opened(400, t);
    t += 1s;
    pace.Closed(400, true, t);
  }
  // 0.75^8 of the old phase's weight is left: within 10% of the new pace.
  EXPECT_GT(pace.tokens_per_second(), 360.0);
}

}  // namespace
}  // namespace pdserve::router
