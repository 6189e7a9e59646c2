#include "tokenizer/bpe_cache.h"

#include <string>
#include <thread>

#include <gtest/gtest.h>

namespace pdserve::tokenizer {
namespace {

using Ids = std::vector<int32_t>;

TEST(BpeCache, StoresAndFindsEntries) {
  BpeCache cache(1024);
  Ids out;
  EXPECT_FALSE(cache.Lookup("hello", &out));
  const int32_t ids[] = {1, 2, 3};
  cache.Insert("hello", ids, 3);
  EXPECT_TRUE(cache.Lookup("hello", &out));
  EXPECT_EQ(out, (Ids{1, 2, 3}));
  EXPECT_TRUE(cache.Lookup("hello", &out));  // appends
  EXPECT_EQ(out.size(), 6u);
  EXPECT_FALSE(cache.Lookup("hellO", &out));
  cache.Clear();
  EXPECT_FALSE(cache.Lookup("hello", &out));
}

TEST(BpeCache, SkipsOversizedEntriesAndCanBeDisabled) {
  BpeCache cache(16);
  const std::string long_key(BpeCache::kMaxKeyBytes + 1, 'x');
  const int32_t one[] = {7};
  cache.Insert(long_key, one, 1);
  Ids out;
  EXPECT_FALSE(cache.Lookup(long_key, &out));
  const Ids many(BpeCache::kMaxIds + 1, 5);
  cache.Insert("k", many.data(), many.size());
  EXPECT_FALSE(cache.Lookup("k", &out));
  BpeCache off(0);
  off.Insert("k", one, 1);
  EXPECT_FALSE(off.Lookup("k", &out));
}

TEST(BpeCache, CollidingKeysNeverReturnWrongIds) {
  BpeCache cache(4);  // tiny: keys keep overwriting each other
  for (int round = 0; round < 3; ++round) {
    for (int i = 0; i < 200; ++i) {
      const std::string key = "k" + std::to_string(i);
      Ids out;
      if (cache.Lookup(key, &out)) {
        ASSERT_EQ(out, (Ids{i}));
      } else {
        const int32_t id = i;
        cache.Insert(key, &id, 1);
      }
    }
  }
}

TEST(BpeCache, ConcurrentUseIsConsistent) {
  BpeCache cache(64);
  std::vector<std::thread> threads;
  std::atomic<int> wrong{0};
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 20000; ++i) {
        const int k = (i * 7 + t) % 500;
        const std::string key = std::to_string(k);
        const int32_t ids[] = {k, k + 1, k + 2};
        Ids out;
        if (cache.Lookup(key, &out)) {
          if (out != Ids{k, k + 1, k + 2}) ++wrong;
        } else {
          cache.Insert(key, ids, 3);
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(wrong.load(), 0);
}

}  // namespace
}  // namespace pdserve::tokenizer
