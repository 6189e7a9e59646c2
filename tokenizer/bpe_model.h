// BpeModel: the "model" section of a byte-level BPE tokenizer.json: the vocabulary and the
// ranked merge list, plus the merge loop that turns one pre-token into ids.
//
// Merges are applied in id space: each byte of the piece starts as the id of its byte-level
// character, and a table maps an adjacent id pair to (rank, merged id). At every step the
// lowest-ranked pair present is merged, the leftmost one on ties; this is the order both the
// Rust library and the JS reference use, so the ids are identical. Short pieces use a linear
// scan over cached pair ranks; long ones a heap with lazy deletion (O(n log n)).
//
// Thread-safety: immutable after FromJson() apart from the internal cache, which is
// thread-safe; EncodeBytes() may be called from any thread.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "common/status.h"
#include "tokenizer/bpe_cache.h"

namespace pdserve::tokenizer {

class BpeModel {
 public:
  // Builds the model from tokenizer.json's "model" object (type "BPE"). Supports vocab, merges
  // in both serialisations ("a b" strings and [a, b] pairs) and ignore_merges.
  // Errors: InvalidArgument (malformed, a merge using a token missing from the vocabulary, a
  // byte with no single-character token), Unimplemented (dropout, byte_fallback, subword
  // prefixes/suffixes: not byte-level BPE).
  static Result<std::unique_ptr<BpeModel>> FromJson(const nlohmann::json& model,
                                                    size_t cache_capacity);

  // Appends the ids of one pre-token given as raw bytes (its byte-level spelling is implied).
  void EncodeBytes(std::string_view bytes, std::vector<int32_t>* out) const;

  // The merge loop without the cache; `force_heap` picks the long-piece algorithm for any
  // length. Exposed so tests can check both loops agree.
  void Merge(std::string_view bytes, bool force_heap, std::vector<int32_t>* out) const;

  // Vocabulary lookups by byte-level spelling.
  std::optional<int32_t> TokenToId(std::string_view token) const;
  // The byte-level spelling of `id`, or nullptr when the vocabulary has no such id.
  const std::string* IdToToken(int32_t id) const;
  // One more than the largest id in the vocabulary.
  int32_t id_limit() const { return static_cast<int32_t>(id_to_token_.size()); }
  size_t vocab_size() const { return token_to_id_.size(); }
  size_t num_merges() const { return num_merges_; }
  void ClearCache() const { cache_.Clear(); }

 private:
  explicit BpeModel(size_t cache_capacity) : cache_(cache_capacity) {}

  // Open-addressing map (left id, right id) -> (rank, merged id).
  struct MergeTable {
    static constexpr uint64_t kEmpty = ~uint64_t{0};
    std::vector<uint64_t> keys;
    std::vector<uint64_t> values;  // rank << 32 | merged id
    uint64_t mask = 0;
    int shift = 64;
    void Init(size_t n);
    void Insert(int32_t a, int32_t b, uint32_t rank, int32_t merged);
    // Returns rank << 32 | merged, or kEmpty when the pair never merges.
    uint64_t Find(int32_t a, int32_t b) const {
      const uint64_t key = (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
      uint64_t slot = (key * 0x9E3779B97F4A7C15ULL) >> shift;
      while (true) {
        const uint64_t k = keys[slot];
        if (k == key) return values[slot];
        if (k == kEmpty) return kEmpty;
        slot = (slot + 1) & mask;
      }
    }
  };

  void MergeLinear(std::string_view bytes, std::vector<int32_t>* out) const;
  void MergeHeap(std::string_view bytes, std::vector<int32_t>* out) const;

  struct StringHash {
    using is_transparent = void;
    size_t operator()(std::string_view s) const { return std::hash<std::string_view>()(s); }
  };
  std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>> token_to_id_;
  std::vector<std::string> id_to_token_;
  std::vector<bool> id_present_;
  int32_t byte_ids_[256] = {};
  MergeTable merges_;
  size_t num_merges_ = 0;
  bool ignore_merges_ = false;
  mutable BpeCache cache_;
};

}  // namespace pdserve::tokenizer
