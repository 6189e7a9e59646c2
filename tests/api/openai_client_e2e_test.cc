// The real `openai` npm client (tools/js/openai_e2e.js) against a real cluster: a router and a
// colocated engine worker with the tiny model over DeepSeek's vocabulary. The script drives
// plain chat, json_schema, tools (required, named, streamed through the client's own stream
// assembler), thinking, n > 1 and a 400, and exits 0 only when every check passed. Needs node
// and tools/js/node_modules (scripts/setup.sh installs both).
#include <filesystem>

#include <gtest/gtest.h>

#include "services/testing/child_process.h"
#include "tests/api/api_cluster.h"

namespace pdserve::api_e2e {
namespace {

using namespace std::chrono_literals;

TEST(OpenAiClientE2eTest, ToolsJsonSchemaThinkingAndNThroughTheNpmClient) {
  const std::string node = PDSERVE_NODE;
  const std::string script = std::string(PDSERVE_SOURCE_DIR) + "/tools/js/openai_e2e.js";
  ASSERT_FALSE(node.empty()) << "node not found: run scripts/setup.sh";
  ASSERT_TRUE(std::filesystem::exists(std::string(PDSERVE_SOURCE_DIR) + "/tools/js/node_modules/openai/package.json"))
      << "the openai npm package is missing: run scripts/setup.sh (npm install in tools/js)";
  testing::ApiCluster c("api-openai-npm", false);
  ASSERT_TRUE(c.ok());
  const std::string log = c.dir() + "/openai_e2e.log";
  auto child = services::testing::ChildProcess::Spawn(
      {node, script, "--base-url", "http://127.0.0.1:" + std::to_string(c.port()) + "/v1", "--model", "pdserve"}, log);
  ASSERT_TRUE(child.ok()) << child.status().ToString();
  const std::optional<int> status = (*child)->WaitExit(600s);
  ASSERT_TRUE(status.has_value()) << "the script did not finish:\n" << (*child)->Log();
  EXPECT_EQ(*status, 0) << (*child)->Log() << c.Logs();
  // Every check ran (the script counts them).
  EXPECT_NE((*child)->Log().find("12 passed, 0 failed"), std::string::npos) << (*child)->Log();
}

}  // namespace
}  // namespace pdserve::api_e2e
