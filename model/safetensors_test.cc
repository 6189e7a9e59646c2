// SafetensorsFile::ParseHeader on crafted headers (regressions found while fuzzing,
// tests/fuzz/fuzz_safetensors.cc).
#include <cstring>

#include <gtest/gtest.h>

#include "model/safetensors.h"

namespace pdserve::model {
namespace {

std::string Image(const std::string& header, size_t data_bytes = 0) {
  std::string out(8, '\0');
  const uint64_t n = header.size();
  std::memcpy(out.data(), &n, 8);
  return out + header + std::string(data_bytes, '\0');
}

Status Parse(const std::string& image) {
  return SafetensorsFile::ParseHeader(reinterpret_cast<const uint8_t*>(image.data()), image.size(), "x.safetensors")
      .status();
}

TEST(SafetensorsParseTest, ValidHeader) {
  const std::string img = Image(R"({"a":{"dtype":"BF16","shape":[2,2],"data_offsets":[0,8]}})", 8);
  auto t = SafetensorsFile::ParseHeader(reinterpret_cast<const uint8_t*>(img.data()), img.size(), "x");
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  EXPECT_EQ(t->at("a").n_bytes, 8u);
}

// A shape, dtype or data_offsets nested 200k deep used to be dump()ed into the error message:
// the recursion overflowed the stack (a crash on a 400 KB file).
TEST(SafetensorsParseTest, DeeplyNestedValuesGiveAnError) {
  const std::string deep = std::string(200000, '[') + std::string(200000, ']');
  for (const std::string& header :
       {R"({"a":{"dtype":"BF16","shape":)" + deep + R"(,"data_offsets":[0,8]}})",
        R"({"a":{"dtype":)" + deep + R"(,"shape":[2],"data_offsets":[0,4]}})",
        R"({"a":{"dtype":"BF16","shape":[2],"data_offsets":)" + deep + "}}"}) {
    Status s = Parse(Image(header, 8));
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
    EXPECT_NE(s.message().find("[[[[...]]]]"), std::string::npos) << s.message().substr(0, 200);
    EXPECT_LT(s.message().size(), 400u);
  }
}

// A dimension beyond int64 with a zero dimension before it passed the overflow check and was
// stored as a negative dimension.
TEST(SafetensorsParseTest, DimensionOutOfRange) {
  Status s = Parse(Image(R"({"z":{"dtype":"BF16","shape":[0,18446744073709551615],"data_offsets":[0,0]}})"));
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("out of range"), std::string::npos) << s.ToString();
}

}  // namespace
}  // namespace pdserve::model
