#include "services/common/yaml_config.h"

#include <gtest/gtest.h>

namespace pdserve::services {
namespace {

TEST(YamlConfigTest, ReadsTypedValuesAndKeepsDefaults) {
  auto root = YamlSection::Parse("a: 5\nb: true\nc: hello\nd: [x, y]\ne: 2.5\nsub:\n  f: 10\n");
  ASSERT_TRUE(root.ok()) << root.status().ToString();
  int64_t a = 1;
  bool b = false;
  std::string c, missing = "keep";
  std::vector<std::string> d;
  double e = 0;
  ASSERT_TRUE(root->Get("a", &a).ok());
  ASSERT_TRUE(root->Get("b", &b).ok());
  ASSERT_TRUE(root->Get("c", &c).ok());
  ASSERT_TRUE(root->Get("d", &d).ok());
  ASSERT_TRUE(root->Get("e", &e).ok());
  ASSERT_TRUE(root->Get("nope", &missing).ok());
  EXPECT_EQ(a, 5);
  EXPECT_TRUE(b);
  EXPECT_EQ(c, "hello");
  EXPECT_EQ(d, (std::vector<std::string>{"x", "y"}));
  EXPECT_EQ(e, 2.5);
  EXPECT_EQ(missing, "keep");
  auto sub = root->Section("sub");
  ASSERT_TRUE(sub.ok());
  std::chrono::milliseconds f{0};
  ASSERT_TRUE(sub->Get("f", &f).ok());
  EXPECT_EQ(f.count(), 10);
  EXPECT_EQ(sub->path(), "sub");
}

TEST(YamlConfigTest, ErrorsNameTheKeyPath) {
  auto root = YamlSection::Parse("sub:\n  port: eighty\n  typo: 1\n  mode: fast\n");
  ASSERT_TRUE(root.ok());
  auto sub = root->Section("sub").value();
  uint32_t port = 0;
  Status s = sub.Get("port", &port);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("sub.port"), std::string::npos) << s.message();
  s = sub.CheckKeys({"port", "mode"});
  EXPECT_NE(s.message().find("sub.typo"), std::string::npos) << s.message();
  std::string mode = "slow";
  s = sub.GetEnum("mode", {"slow", "medium"}, &mode);
  EXPECT_NE(s.message().find("sub.mode"), std::string::npos);
  EXPECT_EQ(mode, "slow");
  uint32_t neg = 0;
  EXPECT_FALSE(YamlSection::Parse("x: -1").value().Get("x", &neg).ok());
}

TEST(YamlConfigTest, MalformedInputIsAStatus) {
  EXPECT_FALSE(YamlSection::Parse("a: [1, 2").ok());
  EXPECT_FALSE(YamlSection::Parse("- 1\n- 2\n").ok());  // not a mapping
  EXPECT_EQ(YamlSection::LoadFile("/nonexistent/x.yaml").status().code(), StatusCode::kNotFound);
  auto root = YamlSection::Parse("list: 5\nmap: [1]\n").value();
  EXPECT_FALSE(root.SectionList("list").ok());
  EXPECT_FALSE(root.Section("map").ok());
  EXPECT_TRUE(YamlSection::Parse("").ok());  // empty file: all defaults
}

TEST(YamlConfigTest, SectionLists) {
  auto root = YamlSection::Parse("workers:\n  - role: prefill\n  - role: decode\n").value();
  auto list = root.SectionList("workers");
  ASSERT_TRUE(list.ok());
  ASSERT_EQ(list->size(), 2u);
  std::string role;
  ASSERT_TRUE((*list)[1].Get("role", &role).ok());
  EXPECT_EQ(role, "decode");
  EXPECT_EQ((*list)[1].path(), "workers[1]");
}

}  // namespace
}  // namespace pdserve::services
