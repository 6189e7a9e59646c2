#include "comm/cp_split.h"

#include "common/check.h"

namespace pdserve::comm {

CpSplit::CpSplit(int64_t seq_len, int cp_size) : seq_len_(seq_len), cp_size_(cp_size) {
  PDSERVE_CHECK(seq_len >= 0 && cp_size >= 1, "CpSplit arguments");
}

std::array<ShardRange, 2> CpSplit::RankChunks(int rank) const {
  PDSERVE_DCHECK(rank >= 0 && rank < cp_size_, "CpSplit rank");
  return {Chunk(rank), Chunk(n_chunks() - 1 - rank)};
}

int64_t CpSplit::RankTokens(int rank) const {
  const auto c = RankChunks(rank);
  return c[0].size() + c[1].size();
}

std::vector<int64_t> CpSplit::RankPositions(int rank) const {
  std::vector<int64_t> out;
  out.reserve(RankTokens(rank));
  for (const ShardRange& c : RankChunks(rank)) {
    for (int64_t p = c.begin; p < c.end; ++p) out.push_back(p);
  }
  return out;
}

int CpSplit::OwnerOf(int64_t pos) const {
  const int c = EvenShardOwner(seq_len_, n_chunks(), pos);
  return c < cp_size_ ? c : n_chunks() - 1 - c;
}

int64_t CpSplit::LocalIndexOf(int64_t pos) const {
  const int c = EvenShardOwner(seq_len_, n_chunks(), pos);
  const ShardRange chunk = Chunk(c);
  if (c < cp_size_) return pos - chunk.begin;
  return Chunk(n_chunks() - 1 - c).size() + (pos - chunk.begin);
}

int64_t CpSplit::RankCausalWork(int rank) const {
  int64_t work = 0;
  for (const ShardRange& c : RankChunks(rank)) {
    // sum_{p=begin}^{end-1} (p+1) = (end*(end+1) - begin*(begin+1)) / 2
    work += (c.end * (c.end + 1) - c.begin * (c.begin + 1)) / 2;
  }
  return work;
}

}  // namespace pdserve::comm
