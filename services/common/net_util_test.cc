// Address helpers (net_util.h): listen vs advertised hosts, endpoint rewriting, finding this
// host's address on a network given as an interface or a subnet. The interface cases use the
// loopback interface, which every network namespace has.
#include "services/common/net_util.h"

#include <gtest/gtest.h>

namespace pdserve::services {
namespace {

TEST(NetUtilTest, WildcardHosts) {
  for (const char* h : {"", "0.0.0.0", "::", "[::]", "*"}) EXPECT_TRUE(IsWildcardHost(h)) << h;
  for (const char* h : {"127.0.0.1", "10.0.0.5", "router", "::1"}) EXPECT_FALSE(IsWildcardHost(h)) << h;
}

TEST(NetUtilTest, LoopbackHosts) {
  for (const char* h : {"localhost", "127.0.0.1", "127.1.2.3", "::1", "[::1]"}) EXPECT_TRUE(IsLoopbackHost(h)) << h;
  for (const char* h : {"0.0.0.0", "10.0.0.1", "node-a", "128.0.0.1"}) EXPECT_FALSE(IsLoopbackHost(h)) << h;
}

TEST(NetUtilTest, EndpointHostIsReplacedOnlyInTcpEndpoints) {
  EXPECT_EQ(EndpointWithHost("tcp://0.0.0.0:7000", "10.1.2.3"), "tcp://10.1.2.3:7000");
  EXPECT_EQ(EndpointWithHost("tcp://*:41234", "node-a"), "tcp://node-a:41234");
  EXPECT_EQ(EndpointWithHost("tcp://[::]:7000", "fd00::2"), "tcp://[fd00::2]:7000");
  EXPECT_EQ(EndpointWithHost("ipc:///tmp/router.sock", "10.1.2.3"), "ipc:///tmp/router.sock");
  EXPECT_EQ(EndpointHost("tcp://10.1.2.3:7000"), "10.1.2.3");
  EXPECT_EQ(EndpointHost("tcp://[::]:7000"), "::");
  EXPECT_EQ(EndpointHost("ipc:///tmp/x"), "");
}

TEST(NetUtilTest, AdvertisedHostPrefersTheExplicitThenTheListenAddress) {
  EXPECT_EQ(AdvertisedHost("0.0.0.0", "10.9.8.7"), "10.9.8.7");
  EXPECT_EQ(AdvertisedHost("127.0.0.1", "10.9.8.7"), "10.9.8.7");
  EXPECT_EQ(AdvertisedHost("10.1.1.1", ""), "10.1.1.1");
  // A wildcard is never advertised as such, and never as loopback when another interface is up.
  const std::string wild = AdvertisedHost("0.0.0.0", "");
  EXPECT_FALSE(wild.empty());
  EXPECT_FALSE(IsWildcardHost(wild));
}

TEST(NetUtilTest, FindsTheAddressByInterfaceOrSubnet) {
  auto by_name = FindInterfaceAddress("lo");
  ASSERT_TRUE(by_name.ok()) << by_name.status().ToString();
  EXPECT_EQ(by_name->address, "127.0.0.1");
  auto by_subnet = FindInterfaceAddress("127.0.0.0/8");
  ASSERT_TRUE(by_subnet.ok()) << by_subnet.status().ToString();
  EXPECT_EQ(by_subnet->interface, "lo");
  EXPECT_EQ(by_subnet->address, "127.0.0.1");

  auto missing = FindInterfaceAddress("no-such-if0");
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  EXPECT_NE(missing.status().message().find("lo 127.0.0.1"), std::string::npos) << missing.status().ToString();
  auto empty_subnet = FindInterfaceAddress("203.0.113.0/24");  // TEST-NET-3: on no interface here
  EXPECT_EQ(empty_subnet.status().code(), StatusCode::kNotFound);
  for (const char* bad : {"10.0.0.0/33", "10.0.0/24", "10.0.0.0/x", "10.0.0.0/"}) {
    auto r = FindInterfaceAddress(bad);
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << bad;
  }
}

}  // namespace
}  // namespace pdserve::services
