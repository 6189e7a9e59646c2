#include "services/control/control_channel.h"

#include <atomic>
#include <mutex>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "services/testing/child_process.h"

namespace pdserve::services {
namespace {

using namespace std::chrono_literals;
using testing::WaitFor;

struct Inbox {
  std::mutex mu;
  std::vector<std::pair<std::string, std::string>> messages;
  void Add(std::string_view peer, std::string_view payload) {
    std::lock_guard<std::mutex> l(mu);
    messages.emplace_back(std::string(peer), std::string(payload));
  }
  size_t size() {
    std::lock_guard<std::mutex> l(mu);
    return messages.size();
  }
};

TEST(ControlChannelTest, RouterAndDealerExchangeInOrder) {
  Inbox router_inbox, dealer_inbox;
  std::atomic<int> ticks{0};
  auto router = ControlChannel::Start({ControlChannelOptions::Kind::kRouterBind, "tcp://127.0.0.1:*", 10ms, "r"},
                                      [&](std::string_view p, std::string_view m) { router_inbox.Add(p, m); },
                                      [&](auto) { ++ticks; });
  ASSERT_TRUE(router.ok()) << router.status().ToString();
  const std::string endpoint = (*router)->endpoint();
  ASSERT_NE(endpoint.find("tcp://127.0.0.1:"), std::string::npos);
  auto dealer = ControlChannel::Start({ControlChannelOptions::Kind::kDealerConnect, endpoint, 10ms, "d"},
                                      [&](std::string_view p, std::string_view m) { dealer_inbox.Add(p, m); });
  ASSERT_TRUE(dealer.ok());
  // ZMQ_IMMEDIATE drops messages until the connection is up: retry the first one.
  ASSERT_TRUE(WaitFor([&] {
    (*dealer)->Send("", "hello");
    return router_inbox.size() > 0;
  }, 5s, 50ms));
  // Several "hello"s may still be in flight: look only at the numbered messages.
  for (int i = 0; i < 1000; ++i) (*dealer)->Send("", std::to_string(i));
  auto numbered = [&] {
    std::lock_guard<std::mutex> l(router_inbox.mu);
    std::vector<std::string> out;
    for (const auto& [p, m] : router_inbox.messages)
      if (m != "hello") out.push_back(m);
    return out;
  };
  ASSERT_TRUE(WaitFor([&] { return numbered().size() == 1000; }, 10s));
  const auto got = numbered();
  for (int i = 0; i < 1000; ++i) EXPECT_EQ(got[i], std::to_string(i));
  std::string peer;
  {
    std::lock_guard<std::mutex> l(router_inbox.mu);
    peer = router_inbox.messages[0].first;
  }
  EXPECT_FALSE(peer.empty());
  (*router)->Send(peer, "reply");
  ASSERT_TRUE(WaitFor([&] { return dealer_inbox.size() == 1; }, 5s));
  EXPECT_EQ(dealer_inbox.messages[0].second, "reply");
  EXPECT_GT(ticks.load(), 0);

  // A peer the ROUTER never heard of: dropped and counted, nothing blocks.
  const uint64_t dropped = (*router)->dropped_messages();
  (*router)->Send("no-such-peer", "x");
  EXPECT_TRUE(WaitFor([&] { return (*router)->dropped_messages() == dropped + 1; }, 5s));
}

// A flood of messages with slow handlers (a starved control thread) must not hold back the
// owner's timers or its sends: the batch ends once a tick is due, the tick learns that messages
// are still waiting (caught_up() false: no silence timeout may fire), and a reply queued while
// handling the first message leaves within a tick, not after the whole backlog. (Before the
// batch was bounded in time, 500 messages of 3 ms each held ticks and sends for 1.5 s.)
TEST(ControlChannelTest, SlowFloodStillTicksAndSends) {
  using Clock = std::chrono::steady_clock;
  std::atomic<ControlChannel*> router_ptr{nullptr};
  std::mutex mu;
  std::vector<Clock::time_point> ticks;
  std::vector<bool> caught_up;
  std::atomic<int> handled{0};
  std::atomic<int64_t> first_handled_ns{0};
  auto router = ControlChannel::Start(
      {ControlChannelOptions::Kind::kRouterBind, "tcp://127.0.0.1:*", 50ms, "r"},
      [&](std::string_view peer, std::string_view m) {
        if (m == "hello") return;
        if (handled++ == 0) {
          first_handled_ns = Clock::now().time_since_epoch().count();
          router_ptr.load()->Send(std::string(peer), "ack");
        }
        std::this_thread::sleep_for(3ms);
      },
      [&](Clock::time_point now) {
        ControlChannel* r = router_ptr.load();
        if (!r) return;
        std::lock_guard<std::mutex> l(mu);
        ticks.push_back(now);
        caught_up.push_back(r->caught_up());
      });
  ASSERT_TRUE(router.ok()) << router.status().ToString();
  router_ptr = router->get();
  std::atomic<int64_t> ack_ns{0};
  Inbox probe;
  auto dealer = ControlChannel::Start({ControlChannelOptions::Kind::kDealerConnect, (*router)->endpoint(), 10ms, "d"},
                                      [&](std::string_view, std::string_view m) {
                                        if (m == "ack") ack_ns = Clock::now().time_since_epoch().count();
                                      });
  ASSERT_TRUE(dealer.ok());
  ASSERT_TRUE(WaitFor([&] {
    (*dealer)->Send("", "hello");
    return (*router)->received_messages() > 0;
  }, 5s, 50ms));
  constexpr int kFlood = 500;
  for (int i = 0; i < kFlood; ++i) (*dealer)->Send("", "m" + std::to_string(i));
  ASSERT_TRUE(WaitFor([&] { return handled.load() == kFlood; }, 20s));
  const auto flood_end = Clock::now();
  ASSERT_TRUE(WaitFor([&] { return ack_ns.load() != 0; }, 5s));
  EXPECT_LT(std::chrono::nanoseconds(ack_ns.load() - first_handled_ns.load()), 700ms);
  // Once the flood is over a tick reports the backlog cleared. Not necessarily the first tick
  // after flood_end: the batch that handled the last message can end on a due tick before it
  // polls the socket again, and that tick rightly reports caught_up() false.
  ASSERT_TRUE(WaitFor([&] {
    std::lock_guard<std::mutex> l(mu);
    return !ticks.empty() && ticks.back() > flood_end && caught_up.back();
  }, 5s)) << "no tick after the flood saw the backlog cleared";
  std::lock_guard<std::mutex> l(mu);
  const auto first_ns = Clock::time_point(Clock::duration(first_handled_ns.load()));
  Clock::duration widest{0};
  bool saw_backlog = false;
  for (size_t i = 1; i < ticks.size(); ++i) {
    if (ticks[i] <= first_ns || ticks[i - 1] >= flood_end) continue;
    widest = std::max(widest, ticks[i] - ticks[i - 1]);
    saw_backlog = saw_backlog || !caught_up[i];
  }
  EXPECT_LT(widest, 700ms) << "ticks were held back by the backlog";
  EXPECT_TRUE(saw_backlog) << "ticks during the flood must see the backlog";
}

TEST(ControlChannelTest, BindingABusyPortFails) {
  auto first = ControlChannel::Start({ControlChannelOptions::Kind::kRouterBind, "tcp://127.0.0.1:*", 10ms, "a"},
                                     [](auto, auto) {});
  ASSERT_TRUE(first.ok());
  auto second = ControlChannel::Start({ControlChannelOptions::Kind::kRouterBind, (*first)->endpoint(), 10ms, "b"},
                                      [](auto, auto) {});
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), StatusCode::kUnavailable);
  auto bad = ControlChannel::Start({ControlChannelOptions::Kind::kRouterBind, "nonsense://x", 10ms, "c"},
                                   [](auto, auto) {});
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
}

TEST(ControlChannelTest, DestroyingWithQueuedMessagesIsPrompt) {
  auto dealer = ControlChannel::Start({ControlChannelOptions::Kind::kDealerConnect, "tcp://127.0.0.1:1", 10ms, "d"},
                                      [](auto, auto) {});
  ASSERT_TRUE(dealer.ok());
  for (int i = 0; i < 100; ++i) (*dealer)->Send("", "x");
  const auto t0 = std::chrono::steady_clock::now();
  dealer->reset();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 2s);
}

}  // namespace
}  // namespace pdserve::services
