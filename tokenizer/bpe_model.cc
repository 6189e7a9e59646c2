#include "tokenizer/bpe_model.h"

#include <algorithm>
#include <cstring>

#include <nlohmann/json.hpp>

#include "tokenizer/byte_level.h"
#include "tokenizer/utf8.h"

namespace pdserve::tokenizer {

namespace {
using nlohmann::json;

// Pieces up to this many bytes use the linear merge loop (faster for words).
constexpr size_t kLinearMaxBytes = 48;
constexpr uint32_t kNoRank = ~uint32_t{0};
}  // namespace

void BpeModel::MergeTable::Init(size_t n) {
  size_t capacity = 16;
  int bits = 4;
  while (capacity < 2 * n) {
    capacity <<= 1;
    ++bits;
  }
  keys.assign(capacity, kEmpty);
  values.assign(capacity, 0);
  mask = capacity - 1;
  shift = 64 - bits;
}

void BpeModel::MergeTable::Insert(int32_t a, int32_t b, uint32_t rank, int32_t merged) {
  const uint64_t key = (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
  uint64_t slot = (key * 0x9E3779B97F4A7C15ULL) >> shift;
  while (keys[slot] != kEmpty && keys[slot] != key) slot = (slot + 1) & mask;
  // A repeated pair keeps the later rank, as both reference implementations do.
  keys[slot] = key;
  values[slot] = (static_cast<uint64_t>(rank) << 32) | static_cast<uint32_t>(merged);
}

Result<std::unique_ptr<BpeModel>> BpeModel::FromJson(const json& model, size_t cache_capacity) {
  try {
    if (!model.is_object()) return Status::InvalidArgument("\"model\" must be an object");
    const std::string type = model.value("type", std::string("BPE"));
    if (type != "BPE") return Status::Unimplemented("model type '" + type + "' is not supported (only BPE)");
    if (model.contains("dropout") && !model["dropout"].is_null())
      return Status::Unimplemented("BPE dropout is not supported");
    if (model.value("byte_fallback", false))
      return Status::Unimplemented("BPE byte_fallback is not supported (not a byte-level BPE)");
    for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
      if (model.contains(key) && !model[key].is_null() && !model[key].get<std::string>().empty())
        return Status::Unimplemented(std::string("BPE ") + key + " is not supported");
    }

    std::unique_ptr<BpeModel> m(new BpeModel(cache_capacity));
    m->ignore_merges_ = model.value("ignore_merges", false);

    const auto vocab_it = model.find("vocab");
    if (vocab_it == model.end() || !vocab_it->is_object())
      return Status::InvalidArgument("BPE model needs a \"vocab\" object");
    int64_t max_id = -1;
    m->token_to_id_.reserve(vocab_it->size());
    for (const auto& [token, id_json] : vocab_it->items()) {
      if (!id_json.is_number_integer()) return Status::InvalidArgument("vocab id of '" + token + "' is not an integer");
      const int64_t id = id_json.get<int64_t>();
      if (id < 0 || id >= (int64_t{1} << 24)) return Status::InvalidArgument("vocab id " + std::to_string(id) + " out of range");
      PDSERVE_RETURN_IF_ERROR(ValidateUtf8(token).WithContext("vocab token"));
      m->token_to_id_[token] = static_cast<int32_t>(id);
      max_id = std::max(max_id, id);
    }
    if (static_cast<size_t>(max_id + 1) > 2 * m->token_to_id_.size() + 1024)
      return Status::InvalidArgument("vocab ids go up to " + std::to_string(max_id) + " for only " +
                                     std::to_string(m->token_to_id_.size()) + " tokens: ids too sparse");
    m->id_to_token_.assign(static_cast<size_t>(max_id + 1), std::string());
    m->id_present_.assign(static_cast<size_t>(max_id + 1), false);
    for (const auto& [token, id] : m->token_to_id_) {
      if (m->id_present_[id]) return Status::InvalidArgument("vocab id " + std::to_string(id) + " is used twice");
      m->id_to_token_[id] = token;
      m->id_present_[id] = true;
    }

    for (int b = 0; b < 256; ++b) {
      std::string spelled;
      AppendUtf8(ByteToChar(static_cast<uint8_t>(b)), &spelled);
      auto it = m->token_to_id_.find(spelled);
      if (it == m->token_to_id_.end())
        return Status::InvalidArgument("vocab has no token for byte " + std::to_string(b) +
                                       " ('" + spelled + "'): not a byte-level BPE vocabulary");
      m->byte_ids_[b] = it->second;
    }

    const auto merges_it = model.find("merges");
    if (merges_it == model.end() || !merges_it->is_array())
      return Status::InvalidArgument("BPE model needs a \"merges\" array");
    m->merges_.Init(merges_it->size());
    uint32_t rank = 0;
    std::string left, right;
    for (const json& merge : *merges_it) {
      if (merge.is_string()) {
        const std::string& s = merge.get_ref<const std::string&>();
        const size_t space = s.find(' ');
        if (space == std::string::npos || s.find(' ', space + 1) != std::string::npos)
          return Status::InvalidArgument("merge #" + std::to_string(rank) + " '" + s + "' is not two tokens");
        left = s.substr(0, space);
        right = s.substr(space + 1);
      } else if (merge.is_array() && merge.size() == 2 && merge[0].is_string() && merge[1].is_string()) {
        left = merge[0].get<std::string>();
        right = merge[1].get<std::string>();
      } else {
        return Status::InvalidArgument("merge #" + std::to_string(rank) + " is neither \"a b\" nor [a, b]");
      }
      const auto a = m->TokenToId(left);
      const auto b = m->TokenToId(right);
      const auto merged = m->TokenToId(left + right);
      if (!a || !b || !merged)
        return Status::InvalidArgument("merge #" + std::to_string(rank) + " '" + left + " " + right +
                                       "' uses a token missing from the vocabulary");
      m->merges_.Insert(*a, *b, rank, *merged);
      ++rank;
    }
    m->num_merges_ = rank;
    return m;
  } catch (const json::exception& e) {
    return Status::InvalidArgument(std::string("malformed BPE model: ") + e.what());
  }
}

std::optional<int32_t> BpeModel::TokenToId(std::string_view token) const {
  auto it = token_to_id_.find(token);
  if (it == token_to_id_.end()) return std::nullopt;
  return it->second;
}

const std::string* BpeModel::IdToToken(int32_t id) const {
  if (id < 0 || id >= id_limit() || !id_present_[id]) return nullptr;
  return &id_to_token_[id];
}

void BpeModel::EncodeBytes(std::string_view bytes, std::vector<int32_t>* out) const {
  if (bytes.empty()) return;
  if (bytes.size() == 1) {
    out->push_back(byte_ids_[static_cast<uint8_t>(bytes[0])]);
    return;
  }
  if (cache_.Lookup(bytes, out)) return;
  const size_t before = out->size();
  if (ignore_merges_) {
    if (auto id = TokenToId(BytesToByteLevel(bytes))) {
      out->push_back(*id);
      cache_.Insert(bytes, out->data() + before, 1);
      return;
    }
  }
  Merge(bytes, false, out);
  cache_.Insert(bytes, out->data() + before, out->size() - before);
}

void BpeModel::Merge(std::string_view bytes, bool force_heap, std::vector<int32_t>* out) const {
  if (!force_heap && bytes.size() <= kLinearMaxBytes) {
    MergeLinear(bytes, out);
  } else {
    MergeHeap(bytes, out);
  }
}

void BpeModel::MergeLinear(std::string_view bytes, std::vector<int32_t>* out) const {
  // ids[i] is symbol i; pair[i] caches Find(ids[i], ids[i + 1]).
  int32_t ids[kLinearMaxBytes];
  uint64_t pair[kLinearMaxBytes];
  size_t n = bytes.size();
  for (size_t i = 0; i < n; ++i) ids[i] = byte_ids_[static_cast<uint8_t>(bytes[i])];
  for (size_t i = 0; i + 1 < n; ++i) pair[i] = merges_.Find(ids[i], ids[i + 1]);
  while (n > 1) {
    // Ranks are in the high half, so the smallest value is the best (leftmost on ties).
    size_t best = 0;
    uint64_t best_value = pair[0];
    for (size_t i = 1; i + 1 < n; ++i) {
      if (pair[i] < best_value) {
        best_value = pair[i];
        best = i;
      }
    }
    if (best_value == MergeTable::kEmpty) break;
    ids[best] = static_cast<int32_t>(best_value & 0xFFFFFFFFu);
    std::memmove(ids + best + 1, ids + best + 2, (n - best - 2) * sizeof(int32_t));
    std::memmove(pair + best, pair + best + 1, (n - best - 2) * sizeof(uint64_t));
    --n;
    if (best > 0) pair[best - 1] = merges_.Find(ids[best - 1], ids[best]);
    if (best + 1 < n) pair[best] = merges_.Find(ids[best], ids[best + 1]);
  }
  out->insert(out->end(), ids, ids + n);
}

void BpeModel::MergeHeap(std::string_view bytes, std::vector<int32_t>* out) const {
  const size_t n = bytes.size();
  struct Symbol {
    int32_t id;
    int32_t prev;
    int32_t next;  // -1 at the ends
  };
  // A candidate merge of the symbol at `pos` with its successor, valid only while both still
  // hold the ids recorded here (entries go stale instead of being removed).
  struct Candidate {
    uint32_t rank;
    int32_t pos;
    int32_t left;
    int32_t right;
    int32_t merged;
  };
  // Min-heap on (rank, pos): the lowest rank first, the leftmost on ties.
  auto later = [](const Candidate& a, const Candidate& b) {
    return a.rank != b.rank ? a.rank > b.rank : a.pos > b.pos;
  };
  // Per-thread scratch: long pieces are common in CJK text, and reallocating both arrays for
  // each one costs more than the merges.
  thread_local std::vector<Symbol> sym;
  thread_local std::vector<Candidate> heap;
  sym.resize(n);
  heap.clear();
  for (size_t i = 0; i < n; ++i) {
    sym[i] = {byte_ids_[static_cast<uint8_t>(bytes[i])], static_cast<int32_t>(i) - 1,
              i + 1 < n ? static_cast<int32_t>(i + 1) : -1};
  }
  auto push = [&](int32_t pos) {
    const int32_t next = sym[pos].next;
    if (next < 0) return;
    const uint64_t v = merges_.Find(sym[pos].id, sym[next].id);
    if (v == MergeTable::kEmpty) return;
    heap.push_back({static_cast<uint32_t>(v >> 32), pos, sym[pos].id, sym[next].id,
                    static_cast<int32_t>(v & 0xFFFFFFFFu)});
    std::push_heap(heap.begin(), heap.end(), later);
  };
  for (size_t i = 0; i + 1 < n; ++i) {
    const uint64_t v = merges_.Find(sym[i].id, sym[i + 1].id);
    if (v != MergeTable::kEmpty)
      heap.push_back({static_cast<uint32_t>(v >> 32), static_cast<int32_t>(i), sym[i].id, sym[i + 1].id,
                      static_cast<int32_t>(v & 0xFFFFFFFFu)});
  }
  std::make_heap(heap.begin(), heap.end(), later);
  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), later);
    const Candidate c = heap.back();
    heap.pop_back();
    Symbol& left = sym[c.pos];
    if (left.id != c.left || left.next < 0) continue;
    Symbol& right = sym[left.next];
    if (right.id != c.right) continue;
    left.id = c.merged;
    right.id = -1;  // dead
    left.next = right.next;
    if (right.next >= 0) sym[right.next].prev = c.pos;
    if (left.prev >= 0) push(left.prev);
    push(c.pos);
  }
  for (int32_t i = 0; i >= 0; i = sym[i].next) out->push_back(sym[i].id);
}

}  // namespace pdserve::tokenizer
