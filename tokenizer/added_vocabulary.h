// AddedVocabulary: tokenizer.json's "added_tokens" (special tokens such as
// <｜begin▁of▁sentence｜> and extra tokens such as <｜tool▁sep｜>). They are found in the raw
// text before anything else runs, so normalization and pre-tokenization never cut them apart.
//
// Matching is leftmost-longest over a byte trie, the rule of both the Rust library
// (Aho-Corasick, leftmost-longest) and the JS reference (trie walk keeping the longest hit).
// lstrip/rstrip remove whitespace next to a match from the neighbouring text, as in the JS
// reference. single_word tokens are rejected at load (Unimplemented). All added tokens are
// matched on the raw text; with a non-empty normalizer the Rust library would match
// "normalized": true tokens on normalized text instead (see docs/tokenizer.md).
//
// Thread-safety: immutable after FromJson(); Split() may be called from any thread.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "common/status.h"

namespace pdserve::tokenizer {

struct AddedToken {
  int32_t id = -1;
  std::string content;
  bool special = false;
  bool lstrip = false;
  bool rstrip = false;
  bool normalized = false;
};

class AddedVocabulary {
 public:
  // A run of plain text (id == -1) or one added token (its id).
  struct Segment {
    std::string_view text;
    int32_t id;
  };

  // Errors: InvalidArgument (malformed entry, invalid UTF-8, duplicate content),
  // Unimplemented (single_word).
  static Result<AddedVocabulary> FromJson(const nlohmann::json& added_tokens);

  // Splits `text` into plain runs and added tokens, in order. Plain runs may be empty only
  // when lstrip/rstrip consumed them entirely; callers skip empty runs.
  void Split(std::string_view text, std::vector<Segment>* out) const;

  const std::vector<AddedToken>& tokens() const { return tokens_; }
  // The added token with this id, or nullptr.
  const AddedToken* FindById(int32_t id) const;
  const AddedToken* FindByContent(std::string_view content) const;

 private:
  struct Node {
    std::vector<std::pair<uint8_t, int32_t>> children;  // sorted by byte
    int32_t token = -1;                                  // index into tokens_
  };
  int32_t Child(int32_t node, uint8_t byte) const;
  // Index of the longest token starting at text[pos], or -1.
  int32_t LongestMatch(std::string_view text, size_t pos) const;

  std::vector<AddedToken> tokens_;
  std::vector<Node> nodes_;                 // nodes_[0] is the root
  std::array<int32_t, 256> root_children_;  // direct table for the first byte (-1: none)
  std::vector<int32_t> index_by_id_;        // id -> index into tokens_, -1 when not added
};

}  // namespace pdserve::tokenizer
