// CURVE keys (curve_keys.h) and the ControlChannel with CURVE on real loopback sockets.
#include "services/common/curve_keys.h"

#include <sys/stat.h>

#include <atomic>
#include <fstream>
#include <mutex>

#include <gtest/gtest.h>

#include "services/control/control_channel.h"
#include "services/testing/child_process.h"

namespace pdserve::services {
namespace {

using namespace std::chrono_literals;
using testing::WaitFor;

void WriteText(const std::string& path, const std::string& text) { std::ofstream(path) << text; }

TEST(CurveKeysTest, LibzmqHasCurve) { EXPECT_TRUE(CurveAvailable()); }

TEST(CurveKeysTest, KeygenFilesRoundTrip) {
  const std::string dir = testing::MakeTempDir("pdserve-curve");
  auto keys = WriteCurveKeyPairFiles(dir, "router");
  ASSERT_TRUE(keys.ok()) << keys.status().ToString();
  struct stat st {};
  ASSERT_EQ(stat((dir + "/router.secret").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  auto pair = ReadCurveSecretKeyFile(dir + "/router.secret");
  ASSERT_TRUE(pair.ok()) << pair.status().ToString();
  EXPECT_EQ(pair->secret_key, keys->secret_key);
  EXPECT_EQ(pair->public_key, keys->public_key);  // derived from the secret key
  auto pub = ReadCurveKeyFile(dir + "/router.public");
  ASSERT_TRUE(pub.ok());
  EXPECT_EQ(*pub, keys->public_key);
  // Never overwritten.
  auto again = WriteCurveKeyPairFiles(dir, "router");
  EXPECT_EQ(again.status().code(), StatusCode::kAlreadyExists);
  EXPECT_EQ(ReadCurveSecretKeyFile(dir + "/router.secret")->secret_key, keys->secret_key);
}

TEST(CurveKeysTest, ErrorsNameTheFileAndLine) {
  const std::string dir = testing::MakeTempDir("pdserve-curve");
  auto missing = ReadCurveKeyFile(dir + "/nope.public");
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  EXPECT_NE(missing.status().message().find(dir + "/nope.public"), std::string::npos) << missing.status().ToString();

  WriteText(dir + "/short", "# comment\nabc\n");
  auto s = ReadCurveKeyFile(dir + "/short");
  EXPECT_EQ(s.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.status().message().find("'" + dir + "/short' line 2"), std::string::npos) << s.status().ToString();

  const std::string good = GenerateCurveKeyPair()->public_key;
  std::string bad = good;
  bad[5] = '"';  // not in the Z85 alphabet
  WriteText(dir + "/bad", good + "\n" + bad + "\n");
  auto list = ReadCurveKeyListFile(dir + "/bad");
  EXPECT_NE(list.status().message().find("line 2"), std::string::npos) << list.status().ToString();
  EXPECT_NE(ReadCurveKeyFile(dir + "/bad").status().message().find("Z85"), std::string::npos);

  WriteText(dir + "/two", good + "\n" + good + "\n");
  EXPECT_NE(ReadCurveKeyFile(dir + "/two").status().message().find("expected one"), std::string::npos);
  EXPECT_EQ(ReadCurveKeyListFile(dir + "/two")->size(), 2u);

  WriteText(dir + "/empty", "# nothing\n\n");
  EXPECT_NE(ReadCurveKeyFile(dir + "/empty").status().message().find("no CURVE key"), std::string::npos);

  auto client = LoadClientCurveOptions(dir + "/short", "");
  EXPECT_EQ(client.status().code(), StatusCode::kInvalidArgument);
}

struct Inbox {
  std::mutex mu;
  std::vector<std::string> messages;
  void Add(std::string_view m) {
    std::lock_guard<std::mutex> l(mu);
    messages.emplace_back(m);
  }
  size_t size() {
    std::lock_guard<std::mutex> l(mu);
    return messages.size();
  }
};

std::unique_ptr<ControlChannel> StartRouter(const CurveOptions& curve, Inbox* inbox) {
  auto r = ControlChannel::Start({ControlChannelOptions::Kind::kRouterBind, "tcp://127.0.0.1:*", 10ms, "r"},
                                 [inbox](std::string_view, std::string_view m) { inbox->Add(m); }, nullptr, curve);
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  return r.ok() ? std::move(r).value() : nullptr;
}

std::unique_ptr<ControlChannel> StartDealer(const std::string& endpoint, const CurveOptions& curve) {
  auto d = ControlChannel::Start({ControlChannelOptions::Kind::kDealerConnect, endpoint, 10ms, "d"},
                                 [](std::string_view, std::string_view) {}, nullptr, curve);
  EXPECT_TRUE(d.ok()) << d.status().ToString();
  return d.ok() ? std::move(d).value() : nullptr;
}

// Sends `text` repeatedly (ZMQ_IMMEDIATE drops until a connection is up) until the router got
// something or `timeout` passed.
bool Reaches(ControlChannel* dealer, Inbox* inbox, std::chrono::milliseconds timeout) {
  return WaitFor([&] {
    dealer->Send("", "hello");
    return inbox->size() > 0;
  }, timeout, 50ms);
}

CurveOptions ClientOf(const CurveKeyPair& own, const std::string& server_public) {
  CurveOptions c;
  c.enabled = true;
  c.own = own;
  c.server_public_key = server_public;
  return c;
}

TEST(ControlChannelCurveTest, AnyClientKeyPairWhenNoAllowList) {
  const CurveKeyPair server = GenerateCurveKeyPair().value();
  CurveOptions sc;
  sc.enabled = true;
  sc.own = server;
  Inbox inbox;
  auto router = StartRouter(sc, &inbox);
  ASSERT_TRUE(router);
  auto good = StartDealer(router->endpoint(), ClientOf(GenerateCurveKeyPair().value(), server.public_key));
  ASSERT_TRUE(good);
  EXPECT_TRUE(Reaches(good.get(), &inbox, 5s));
  good.reset();

  // Plain (no CURVE) and a wrong server key never get through.
  Inbox inbox2;
  auto router2 = StartRouter(sc, &inbox2);
  ASSERT_TRUE(router2);
  auto plain = StartDealer(router2->endpoint(), CurveOptions{});
  auto wrong_server = StartDealer(router2->endpoint(),
                                  ClientOf(GenerateCurveKeyPair().value(), GenerateCurveKeyPair()->public_key));
  ASSERT_TRUE(plain && wrong_server);
  EXPECT_FALSE(WaitFor([&] {
    plain->Send("", "plain");
    wrong_server->Send("", "wrong");
    return inbox2.size() > 0;
  }, 1500ms, 50ms));
}

TEST(ControlChannelCurveTest, AllowListRefusesOtherKeys) {
  const CurveKeyPair server = GenerateCurveKeyPair().value();
  const CurveKeyPair allowed = GenerateCurveKeyPair().value();
  const CurveKeyPair other = GenerateCurveKeyPair().value();
  CurveOptions sc;
  sc.enabled = true;
  sc.own = server;
  sc.allowed_client_keys = {GenerateCurveKeyPair()->public_key, allowed.public_key};
  Inbox inbox;
  auto router = StartRouter(sc, &inbox);
  ASSERT_TRUE(router);
  auto intruder = StartDealer(router->endpoint(), ClientOf(other, server.public_key));
  ASSERT_TRUE(intruder);
  EXPECT_FALSE(Reaches(intruder.get(), &inbox, 1500ms));
  EXPECT_GE(router->refused_handshakes(), 1u);
  // The router still serves the allowed key, with the intruder still knocking.
  auto good = StartDealer(router->endpoint(), ClientOf(allowed, server.public_key));
  ASSERT_TRUE(good);
  EXPECT_TRUE(Reaches(good.get(), &inbox, 5s));
  std::lock_guard<std::mutex> l(inbox.mu);
  for (const auto& m : inbox.messages) EXPECT_EQ(m, "hello");
}

}  // namespace
}  // namespace pdserve::services
