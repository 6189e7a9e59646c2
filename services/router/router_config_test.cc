#include "services/router/router_config.h"

#include <gtest/gtest.h>

namespace pdserve::router {
namespace {

TEST(RouterConfigTest, DefaultsAndOverrides) {
  auto root = services::YamlSection::Parse(R"(
router:
  port: 0
  model_name: tiny
  routing:
    mode: colocated
    colocated_policy: round_robin
  heartbeat_interval_ms: 100
  heartbeat_timeout_ms: 1000
  max_migrations: 0
)").value();
  auto c = RouterConfig::FromYaml(root.Section("router").value());
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->port, 0);
  EXPECT_EQ(c->model_name, "tiny");
  EXPECT_EQ(c->routing.mode, "colocated");
  EXPECT_EQ(c->routing.colocated_policy, "round_robin");
  EXPECT_EQ(c->routing.decode_policy, "kv_capacity_aware");  // default kept
  EXPECT_EQ(c->heartbeat_timeout.count(), 1000);
  EXPECT_EQ(c->max_body_bytes, 8 << 20);
  EXPECT_EQ(c->request_endpoint, "");  // the ZeroMQ request API is off by default
  EXPECT_EQ(c->request_keepalive.count(), 1000);
  EXPECT_EQ(c->max_migrations, 0u);
  EXPECT_EQ(RouterConfig().max_migrations, 3u);
  EXPECT_EQ(RouterConfig().stall_timeout.count(), 60000);
  EXPECT_TRUE(c->api_keys_file.empty());  // no authentication unless configured
  EXPECT_EQ(c->auth_exempt_paths, (std::vector<std::string>{"/health", "/metrics"}));
  EXPECT_EQ(c->retry_after_s, 1u);
}

TEST(RouterConfigTest, RequestApi) {
  auto root = services::YamlSection::Parse("request_endpoint: tcp://127.0.0.1:7100\nrequest_keepalive_ms: 250\n").value();
  auto c = RouterConfig::FromYaml(root);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->request_endpoint, "tcp://127.0.0.1:7100");
  EXPECT_EQ(c->request_keepalive.count(), 250);
  auto bad = [](const char* yaml) { return RouterConfig::FromYaml(services::YamlSection::Parse(yaml).value()).status(); };
  EXPECT_NE(bad("request_endpoint: localhost:7100").message().find("router.request_endpoint"), std::string::npos);
  EXPECT_NE(bad("request_keepalive_ms: 0").message().find("router.request_keepalive_ms"), std::string::npos);
}

TEST(RouterConfigTest, SecurityKeys) {
  auto root = services::YamlSection::Parse(R"(
router:
  api_keys_file: /etc/pdserve/api_keys
  auth_exempt_paths: [/health]
  max_prompt_tokens: 4096
  retry_after_s: 3
  http_read_timeout_ms: 5000
  control_curve_secret_key_file: /etc/pdserve/router.secret
  control_curve_allowed_clients_file: /etc/pdserve/workers.public
  request_endpoint: tcp://0.0.0.0:7100
  request_curve_secret_key_file: /etc/pdserve/router-api.secret
  request_curve_allowed_clients_file: /etc/pdserve/clients.public
)").value();
  auto c = RouterConfig::FromYaml(root.Section("router").value());
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->api_keys_file, "/etc/pdserve/api_keys");
  EXPECT_EQ(c->auth_exempt_paths, std::vector<std::string>{"/health"});
  EXPECT_EQ(c->max_prompt_tokens, 4096u);
  EXPECT_EQ(c->retry_after_s, 3u);
  EXPECT_EQ(c->http_read_timeout.count(), 5000);
  EXPECT_EQ(c->control_curve_secret_key_file, "/etc/pdserve/router.secret");
  EXPECT_EQ(c->control_curve_allowed_clients_file, "/etc/pdserve/workers.public");
  EXPECT_EQ(c->request_curve_secret_key_file, "/etc/pdserve/router-api.secret");
  EXPECT_EQ(c->request_curve_allowed_clients_file, "/etc/pdserve/clients.public");
  auto bad = [](const char* yaml) { return RouterConfig::FromYaml(services::YamlSection::Parse(yaml).value()).status(); };
  EXPECT_NE(bad("control_curve_allowed_clients_file: /x").message().find("control_curve_secret_key_file"),
            std::string::npos);
  EXPECT_FALSE(bad("auth_exempt_paths: [health]").ok());
  EXPECT_NE(bad("request_endpoint: tcp://h:1\nrequest_curve_allowed_clients_file: /x")
                .message()
                .find("request_curve_secret_key_file"),
            std::string::npos);
  EXPECT_NE(bad("request_curve_secret_key_file: /x").message().find("router.request_endpoint"), std::string::npos);
}

TEST(RouterConfigTest, KvAwareForTheRolesThatComputePrompts) {
  auto parse = [](const char* routing) {
    auto root = services::YamlSection::Parse(std::string("routing: ") + routing).value();
    return RouterConfig::FromYaml(root);
  };
  auto c = parse("{prefill_policy: kv_aware, colocated_policy: kv_aware}");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->routing.prefill_policy, "kv_aware");
  EXPECT_EQ(c->routing.colocated_policy, "kv_aware");
  // Decode workers import the whole prompt: the yaml and the command line are both refused.
  EXPECT_FALSE(parse("{decode_policy: kv_aware}").ok());
  RouterConfig cli;
  cli.routing.decode_policy = "kv_aware";  // as --decode-policy would set it
  const Status s = cli.Validate();
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("decode_policy cannot be kv_aware"), std::string::npos) << s.ToString();
  // kv_aware and decode-side hits are the defaults; the bound is read and range-checked.
  EXPECT_EQ(RouterConfig{}.routing.prefill_policy, "kv_aware");
  EXPECT_EQ(RouterConfig{}.routing.colocated_policy, "kv_aware");
  EXPECT_EQ(RouterConfig{}.routing.decode_local_prefill_tokens, 256);
  auto local = parse("{decode_local_prefill_tokens: 0}");
  ASSERT_TRUE(local.ok()) << local.status().ToString();
  EXPECT_EQ(local->routing.decode_local_prefill_tokens, 0);
  auto negative = parse("{decode_local_prefill_tokens: -1}");
  ASSERT_FALSE(negative.ok());
  EXPECT_NE(negative.status().message().find("decode_local_prefill_tokens"), std::string::npos)
      << negative.status().ToString();
  EXPECT_EQ(RouterConfig{}.routing.pull_min_tokens, 128);
  auto pulls = parse("{pull_min_tokens: 0}");
  ASSERT_TRUE(pulls.ok()) << pulls.status().ToString();
  EXPECT_EQ(pulls->routing.pull_min_tokens, 0);
  auto huge = parse("{pull_min_tokens: 99999999}");
  ASSERT_FALSE(huge.ok());
  EXPECT_NE(huge.status().message().find("pull_min_tokens"), std::string::npos) << huge.status().ToString();
}

TEST(RouterConfigTest, Errors) {
  auto bad = [](const char* yaml) {
    auto root = services::YamlSection::Parse(yaml).value();
    return RouterConfig::FromYaml(root).status();
  };
  EXPECT_NE(bad("prot: 1").message().find("unknown key"), std::string::npos);
  EXPECT_NE(bad("routing: {decode_policy: fastest}").message().find("routing.decode_policy"), std::string::npos);
  EXPECT_FALSE(bad("heartbeat_interval_ms: 1000\nheartbeat_timeout_ms: 500").ok());
  EXPECT_FALSE(bad("port: 70000").ok());
  EXPECT_NE(bad("max_migrations: 1000").message().find("router.max_migrations"), std::string::npos);
  EXPECT_FALSE(bad("max_migrations: -1").ok());
  EXPECT_NE(bad("stall_timeout_ms: -5").message().find("stall_timeout_ms"), std::string::npos);
  EXPECT_FALSE(bad("control_endpoint: localhost:7000").ok());
  EXPECT_EQ(RouterConfig::LoadFile("/nonexistent.yaml").status().code(), StatusCode::kNotFound);
}

}  // namespace
}  // namespace pdserve::router
