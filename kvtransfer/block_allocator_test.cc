#include "kvtransfer/block_allocator.h"

#include <gtest/gtest.h>

namespace pdserve::kvtransfer {
namespace {

TEST(FreeListBlockAllocatorTest, AllOrNothingAndReuse) {
  FreeListBlockAllocator allocator(8);
  auto a = allocator.Allocate(3);
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a.value(), (std::vector<uint32_t>{0, 1, 2}));  // a fresh pool is contiguous
  EXPECT_EQ(allocator.num_free(), 5u);
  auto too_many = allocator.Allocate(6);
  EXPECT_EQ(too_many.status().code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(allocator.num_free(), 5u);
  allocator.Free(a.value());
  EXPECT_EQ(allocator.num_free(), 8u);
  auto again = allocator.Allocate(8);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(allocator.num_free(), 0u);
}

TEST(FreeListBlockAllocatorDeathTest, DoubleFreeIsABug) {
  FreeListBlockAllocator allocator(2);
  auto a = allocator.Allocate(1);
  ASSERT_TRUE(a.ok());
  allocator.Free(a.value());
  EXPECT_DEATH(allocator.Free(a.value()), "not allocated");
}

}  // namespace
}  // namespace pdserve::kvtransfer
