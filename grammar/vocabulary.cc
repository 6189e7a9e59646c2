#include "grammar/vocabulary.h"

#include <algorithm>

namespace pdserve::grammar {

namespace {
uint64_t Fnv(uint64_t h, const void* data, size_t n) {
  const auto* p = static_cast<const uint8_t*>(data);
  for (size_t i = 0; i < n; ++i) {
    h ^= p[i];
    h *= 0x100000001b3ULL;
  }
  return h;
}
}  // namespace

Result<std::shared_ptr<const Vocabulary>> Vocabulary::Create(std::vector<std::string> token_bytes,
                                                             std::vector<uint8_t> is_text,
                                                             std::vector<int32_t> stop_ids, int64_t vocab_size) {
  if (vocab_size < 1) return Status::InvalidArgument("vocabulary size must be >= 1");
  if (token_bytes.size() != is_text.size())
    return Status::InvalidArgument("vocabulary: token_bytes and is_text differ in length");
  if (static_cast<int64_t>(token_bytes.size()) > vocab_size)
    return Status::InvalidArgument("vocabulary: " + std::to_string(token_bytes.size()) +
                                   " tokens exceed the vocabulary size " + std::to_string(vocab_size));
  std::shared_ptr<Vocabulary> v(new Vocabulary());
  v->size_ = vocab_size;
  v->text_.assign(static_cast<size_t>(vocab_size), 0);
  for (size_t i = 0; i < token_bytes.size(); ++i)
    v->text_[i] = is_text[i] && !token_bytes[i].empty() ? 1 : 0;
  std::sort(stop_ids.begin(), stop_ids.end());
  stop_ids.erase(std::unique(stop_ids.begin(), stop_ids.end()), stop_ids.end());
  for (int32_t id : stop_ids) {
    if (id < 0 || id >= vocab_size)
      return Status::InvalidArgument("vocabulary: stop id " + std::to_string(id) + " is out of range");
    if (v->text_[static_cast<size_t>(id)])
      return Status::InvalidArgument("vocabulary: stop id " + std::to_string(id) + " is also a text token");
  }
  v->stop_ids_ = std::move(stop_ids);
  v->bytes_ = std::move(token_bytes);
  uint64_t h = 0xcbf29ce484222325ULL;
  h = Fnv(h, &v->size_, sizeof(v->size_));
  for (size_t i = 0; i < v->bytes_.size(); ++i) {
    const uint32_t n = static_cast<uint32_t>(v->bytes_[i].size());
    h = Fnv(h, &n, sizeof(n));
    h = Fnv(h, v->bytes_[i].data(), n);
    h = Fnv(h, &v->text_[i], 1);
  }
  for (int32_t id : v->stop_ids_) h = Fnv(h, &id, sizeof(id));
  v->fingerprint_ = h;
  v->BuildTrie();
  return std::shared_ptr<const Vocabulary>(std::move(v));
}

bool Vocabulary::is_stop(int32_t id) const {
  return std::binary_search(stop_ids_.begin(), stop_ids_.end(), id);
}

void Vocabulary::BuildTrie() {
  for (int32_t id = 0; id < static_cast<int32_t>(bytes_.size()); ++id)
    if (text_[static_cast<size_t>(id)]) order_.push_back(id);
  std::stable_sort(order_.begin(), order_.end(), [&](int32_t a, int32_t b) {
    return bytes_[static_cast<size_t>(a)] < bytes_[static_cast<size_t>(b)];
  });
  auto new_node = [&](uint8_t byte, int32_t first_token) {
    byte_.push_back(byte);
    end_.push_back(-1);
    tok_begin_.push_back(first_token);
    own_end_.push_back(first_token);
    tok_end_.push_back(-1);
    return static_cast<int32_t>(byte_.size() - 1);
  };
  std::vector<int32_t> path = {new_node(0, 0)};  // path[d]: node at depth d
  std::string_view prev;
  const int32_t n = static_cast<int32_t>(order_.size());
  auto close_to = [&](size_t depth, int32_t k) {  // keep path[0..depth]
    while (path.size() > depth + 1) {
      const int32_t node = path.back();
      end_[static_cast<size_t>(node)] = trie_nodes();
      tok_end_[static_cast<size_t>(node)] = k;
      path.pop_back();
    }
  };
  for (int32_t k = 0; k < n; ++k) {
    const std::string_view t = bytes_[static_cast<size_t>(order_[static_cast<size_t>(k)])];
    max_len_ = std::max(max_len_, static_cast<int32_t>(t.size()));
    size_t l = 0;
    while (l < prev.size() && l < t.size() && prev[l] == t[l]) ++l;
    close_to(l, k);
    for (size_t d = l; d < t.size(); ++d) path.push_back(new_node(static_cast<uint8_t>(t[d]), k));
    own_end_[static_cast<size_t>(path.back())] = k + 1;
    prev = t;
  }
  close_to(0, n);
  end_[0] = trie_nodes();
  tok_end_[0] = n;
}

}  // namespace pdserve::grammar
