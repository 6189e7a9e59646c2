// Vocabulary: the tokens a grammar is matched against, as byte strings, plus the trie the mask
// computation walks.
//
// A token id i in [0, size()) may be:
//   - a text token: bytes(i) is what it adds to the output (possibly part of a UTF-8
//     character); the grammar allows it when those bytes continue the text validly;
//   - a stop token (EOS): allowed exactly when the grammar accepts the text so far;
//   - neither (special tokens, ids beyond the tokenizer, empty tokens): never allowed while a
//     grammar constrains the output.
// size() is the model's vocabulary (rows of lm_head, e.g. 129,280 for DeepSeek-V3), which may
// be larger than the tokenizer's; masks have one bit per id of size().
//
// The trie holds the text tokens sorted by bytes, in preorder: node 0 is the empty prefix; the
// children of node i are i + 1, end(i + 1), ... up to end(i). Every node's subtree covers a
// contiguous range of the sorted tokens (token_order()), tokens ending exactly at the node first.
//
// Thread-safety: immutable after Create; share one instance between grammars and threads.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace pdserve::grammar {

class Vocabulary {
 public:
  // token_bytes[i] and is_text[i] describe id i (ids past token_bytes.size() have no bytes);
  // stop_ids are the end-of-sequence ids. Errors: InvalidArgument when vocab_size < 1 or
  // smaller than token_bytes, the two vectors differ in length, or a stop id is out of range
  // or also a text token.
  static Result<std::shared_ptr<const Vocabulary>> Create(std::vector<std::string> token_bytes,
                                                          std::vector<uint8_t> is_text,
                                                          std::vector<int32_t> stop_ids, int64_t vocab_size);

  int64_t size() const { return size_; }
  // uint32 words of a token bitmask: ceil(size / 32).
  int64_t mask_words() const { return (size_ + 31) / 32; }
  bool is_text(int32_t id) const { return id >= 0 && id < size_ && text_[static_cast<size_t>(id)]; }
  bool is_stop(int32_t id) const;
  std::string_view bytes(int32_t id) const {
    return static_cast<size_t>(id) < bytes_.size() ? std::string_view(bytes_[static_cast<size_t>(id)])
                                                   : std::string_view();
  }
  const std::vector<int32_t>& stop_ids() const { return stop_ids_; }
  int64_t n_text_tokens() const { return static_cast<int64_t>(order_.size()); }
  int32_t max_token_bytes() const { return max_len_; }
  // FNV-1a 64 over every id's bytes and kind and the size: a compiled grammar is tied to it.
  uint64_t fingerprint() const { return fingerprint_; }

  // ---- trie ----
  int32_t trie_nodes() const { return static_cast<int32_t>(byte_.size()); }
  uint8_t trie_byte(int32_t node) const { return byte_[static_cast<size_t>(node)]; }
  int32_t trie_end(int32_t node) const { return end_[static_cast<size_t>(node)]; }
  // Tokens of the subtree: token_order()[tok_begin .. tok_end); those ending at the node:
  // [tok_begin .. own_end).
  int32_t trie_tok_begin(int32_t node) const { return tok_begin_[static_cast<size_t>(node)]; }
  int32_t trie_own_end(int32_t node) const { return own_end_[static_cast<size_t>(node)]; }
  int32_t trie_tok_end(int32_t node) const { return tok_end_[static_cast<size_t>(node)]; }
  const std::vector<int32_t>& token_order() const { return order_; }

 private:
  Vocabulary() = default;
  void BuildTrie();

  int64_t size_ = 0;
  std::vector<std::string> bytes_;
  std::vector<uint8_t> text_;      // per id < size_
  std::vector<int32_t> stop_ids_;  // sorted
  std::vector<int32_t> order_;     // text token ids sorted by bytes
  int32_t max_len_ = 0;
  uint64_t fingerprint_ = 0;
  std::vector<uint8_t> byte_;
  std::vector<int32_t> end_, tok_begin_, own_end_, tok_end_;
};

}  // namespace pdserve::grammar
