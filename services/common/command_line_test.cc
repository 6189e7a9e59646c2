// CommandLine: the one parser of every binary. Each case is one command line and what it must
// give (values, positionals, --help) or the error that must name the bad argument.
#include "services/common/command_line.h"

#include <gtest/gtest.h>

namespace pdserve::services {
namespace {

const CommandSpec kSpec{"prog", "[options] [FILE]", "A test program.",
                        {{"port", "P", "a port"},
                         {"name", "N", "repeatable", true},
                         {"out", "DIR", "needed", false, true},
                         {"verbose", "", "a flag"}},
                        1};

Result<CommandLine> Parse(std::vector<std::string> args) { return CommandLine::Parse(args, kSpec); }

TEST(CommandLineTest, ValuesFlagsPositionalsAndRepeats) {
  auto cl = Parse({"--port", "80", "--out=/x", "--verbose", "--name", "a", "--name=b", "file.yaml"});
  ASSERT_TRUE(cl.ok()) << cl.status().ToString();
  EXPECT_EQ(cl->GetInt("port", 0).value(), 80);
  EXPECT_EQ(cl->GetOr("out", ""), "/x");
  EXPECT_TRUE(cl->Has("verbose"));
  EXPECT_EQ(cl->GetAll("name"), (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(cl->Get("name"), "b");
  EXPECT_EQ(cl->positionals(), std::vector<std::string>{"file.yaml"});
  EXPECT_FALSE(cl->help_requested());
}

TEST(CommandLineTest, ErrorsNameTheArgument) {
  struct Case {
    std::vector<std::string> args;
    std::string says;
  };
  for (const Case& c : std::vector<Case>{{{"--bogus", "1", "--out", "x"}, "unknown option --bogus"},
                                         {{"--out", "x", "--port", "1", "--port", "2"}, "option --port given twice"},
                                         {{"--out", "x", "--verbose=1"}, "flag --verbose takes no value"},
                                         {{"--out"}, "option --out needs a value (DIR)"},
                                         {{"--port", "1"}, "missing required option --out"},
                                         {{"--out", "x", "a", "b"}, "unexpected argument 'b'"}}) {
    auto cl = Parse(c.args);
    ASSERT_FALSE(cl.ok()) << c.says;
    EXPECT_EQ(cl.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(cl.status().message().find(c.says), std::string::npos) << cl.status().ToString();
    EXPECT_TRUE(IsUsageError(cl.status()));
  }
}

TEST(CommandLineTest, TypedValuesAreRangeChecked) {
  auto cl = Parse({"--out", "x", "--port", "70000"});
  ASSERT_TRUE(cl.ok());
  EXPECT_EQ(cl->GetInt("port", 0, 0, 65535).status().message(), "option --port must be in [0, 65535], got 70000");
  EXPECT_FALSE(Parse({"--out", "x", "--port", "12ab"})->GetInt("port", 0).ok());
  EXPECT_FALSE(Parse({"--out", "x", "--port", "nan"})->GetDouble("port", 0).ok());
  EXPECT_FALSE(Parse({"--out", "x", "--port", "maybe"})->GetBool("port", false).ok());
  EXPECT_TRUE(Parse({"--out", "x", "--port", "yes"})->GetBool("port", false).value());
}

TEST(CommandLineTest, HelpWinsOverMissingOptionsAndListsThemAll) {
  auto cl = Parse({"--help"});
  ASSERT_TRUE(cl.ok());
  EXPECT_TRUE(cl->help_requested());
  const std::string usage = FormatUsage(kSpec);
  EXPECT_EQ(usage.rfind("usage: prog [options] [FILE]\n", 0), 0u) << usage;
  for (const char* line : {"--port P", "--name N", "--out DIR", "needed (required)", "--verbose", "--help"})
    EXPECT_NE(usage.find(line), std::string::npos) << line << "\n" << usage;
}

}  // namespace
}  // namespace pdserve::services
