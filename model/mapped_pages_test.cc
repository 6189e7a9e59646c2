#include "model/mapped_pages.h"

#include <gtest/gtest.h>
#include <sys/resource.h>

#include <cstdint>
#include <fstream>
#include <string>
#include <utility>

namespace pdserve::model {
namespace {

std::string ThpMode() {
  std::ifstream f("/sys/kernel/mm/transparent_hugepage/enabled");
  std::string line;
  std::getline(f, line);
  return line;  // e.g. "always [madvise] never": the bracketed word is the mode
}

TEST(PopulatedPages, AlignedZeroedAndMappedUpFront) {
  constexpr size_t kAsked = (64u << 20) + 12345;
  auto pages = PopulatedPages::Map(kAsked);
  ASSERT_TRUE(pages.ok()) << pages.status().ToString();
  EXPECT_EQ(reinterpret_cast<uintptr_t>(pages->data()) % kHugePageBytes, 0u);
  EXPECT_EQ(pages->size() % kHugePageBytes, 0u);
  EXPECT_GE(pages->size(), kAsked);
  // Every page is already there: reading and writing all of it faults nothing in.
  rusage before{}, after{};
  getrusage(RUSAGE_THREAD, &before);
  auto* bytes = static_cast<volatile uint8_t*>(pages->data());
  uint64_t sum = 0;
  for (size_t i = 0; i < pages->size(); i += 4096) {
    sum += bytes[i];
    bytes[i] = 1;
  }
  getrusage(RUSAGE_THREAD, &after);
  EXPECT_EQ(sum, 0u) << "fresh anonymous memory reads as zeros";
  EXPECT_LT(after.ru_minflt - before.ru_minflt, 16) << "the pages were not populated by Map";
  // Moving keeps the one owner.
  PopulatedPages moved = std::move(*pages);
  EXPECT_EQ(pages->data(), nullptr);
  EXPECT_EQ(moved.size() % kHugePageBytes, 0u);
}

TEST(PopulatedPages, BackedByHugePagesWhereTheKernelAllowsThem) {
  const std::string mode = ThpMode();
  if (mode.empty() || mode.find("[never]") != std::string::npos)
    GTEST_SKIP() << "transparent huge pages are off on this machine ('" << mode
                 << "'): the weights arena falls back to 4 KiB pages";
  auto pages = PopulatedPages::Map(64u << 20);
  ASSERT_TRUE(pages.ok()) << pages.status().ToString();
  EXPECT_TRUE(pages->huge_advised());
  // The kernel may find fewer free 2 MiB frames than asked; most of 64 MiB must be huge.
  EXPECT_GE(pages->HugeBytes(), size_t{32} << 20) << "THP mode '" << mode << "'";
}

TEST(PopulatedPages, EmptyIsEmpty) {
  auto pages = PopulatedPages::Map(0);
  ASSERT_TRUE(pages.ok());
  EXPECT_EQ(pages->data(), nullptr);
  EXPECT_EQ(pages->size(), 0u);
  EXPECT_EQ(pages->HugeBytes(), 0u);
}

}  // namespace
}  // namespace pdserve::model
