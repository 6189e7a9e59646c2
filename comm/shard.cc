#include "comm/shard.h"

#include "common/check.h"

namespace pdserve::comm {

ShardRange EvenShard(int64_t n, int parts, int index) {
  PDSERVE_DCHECK(n >= 0 && parts >= 1 && index >= 0 && index < parts, "EvenShard arguments");
  const int64_t base = n / parts, extra = n % parts;
  const int64_t begin = index * base + (index < extra ? index : extra);
  return {begin, begin + base + (index < extra ? 1 : 0)};
}

int EvenShardOwner(int64_t n, int parts, int64_t i) {
  PDSERVE_DCHECK(i >= 0 && i < n, "EvenShardOwner index");
  const int64_t base = n / parts, extra = n % parts;
  // The first `extra` shards have base + 1 items.
  const int64_t big = extra * (base + 1);
  if (i < big) return static_cast<int>(i / (base + 1));
  return static_cast<int>(extra + (i - big) / base);
}

ShardRange HeadShard(int64_t n_heads, int parts, int index) {
  PDSERVE_CHECK(n_heads % parts == 0, "HeadShard: tp must divide the head count (plan validation)");
  return EvenShard(n_heads, parts, index);
}

ShardRange HeadColumnShard(int64_t n_heads, int64_t head_dim, int parts, int index) {
  const ShardRange h = HeadShard(n_heads, parts, index);
  return {h.begin * head_dim, h.end * head_dim};
}

}  // namespace pdserve::comm
