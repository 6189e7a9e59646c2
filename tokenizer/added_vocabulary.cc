#include "tokenizer/added_vocabulary.h"

#include <algorithm>

#include <nlohmann/json.hpp>

#include "common/json_excerpt.h"
#include "tokenizer/utf8.h"

namespace pdserve::tokenizer {

namespace {
using nlohmann::json;

std::string_view TrimStart(std::string_view s) {
  size_t pos = 0;
  while (pos < s.size()) {
    size_t next = pos;
    if (!IsEcmaScriptSpace(DecodeUtf8Char(s, &next))) break;
    pos = next;
  }
  return s.substr(pos);
}

std::string_view TrimEnd(std::string_view s) {
  size_t end = s.size();
  while (end > 0) {
    size_t start = end - 1;
    while (start > 0 && (static_cast<uint8_t>(s[start]) & 0xC0) == 0x80) --start;
    size_t probe = start;
    if (!IsEcmaScriptSpace(DecodeUtf8Char(s, &probe))) break;
    end = start;
  }
  return s.substr(0, end);
}
}  // namespace

Result<AddedVocabulary> AddedVocabulary::FromJson(const json& added_tokens) {
  AddedVocabulary v;
  v.nodes_.emplace_back();
  v.root_children_.fill(-1);
  if (added_tokens.is_null()) return v;
  if (!added_tokens.is_array()) return Status::InvalidArgument("\"added_tokens\" must be an array");
  try {
    for (const json& entry : added_tokens) {
      AddedToken t;
      const json& id = entry.at("id");
      if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() >= (1 << 24))
        return Status::InvalidArgument("added token id " + JsonExcerpt(id) + " is not an integer in [0, 2^24)");
      t.id = id.get<int32_t>();
      t.content = entry.at("content").get<std::string>();
      t.special = entry.value("special", false);
      t.lstrip = entry.value("lstrip", false);
      t.rstrip = entry.value("rstrip", false);
      t.normalized = entry.value("normalized", !t.special);
      if (t.content.empty()) return Status::InvalidArgument("added token " + std::to_string(t.id) + " is empty");
      PDSERVE_RETURN_IF_ERROR(ValidateUtf8(t.content).WithContext("added token " + std::to_string(t.id)));
      if (entry.value("single_word", false))
        return Status::Unimplemented("added token '" + t.content + "' uses single_word, which is not supported");
      v.tokens_.push_back(std::move(t));
    }
  } catch (const json::exception& e) {
    return Status::InvalidArgument(std::string("malformed added_tokens: ") + e.what());
  }

  for (size_t index = 0; index < v.tokens_.size(); ++index) {
    const AddedToken& t = v.tokens_[index];
    if (t.id >= static_cast<int32_t>(v.index_by_id_.size())) v.index_by_id_.resize(t.id + 1, -1);
    if (v.index_by_id_[t.id] >= 0)
      return Status::InvalidArgument("added token id " + std::to_string(t.id) + " appears twice");
    v.index_by_id_[t.id] = static_cast<int32_t>(index);

    int32_t node = 0;
    for (char ch : t.content) {
      const uint8_t byte = static_cast<uint8_t>(ch);
      int32_t child = v.Child(node, byte);
      if (child < 0) {
        child = static_cast<int32_t>(v.nodes_.size());
        v.nodes_.emplace_back();
        auto& children = v.nodes_[node].children;
        children.insert(std::upper_bound(children.begin(), children.end(), std::make_pair(byte, -1)),
                        {byte, child});
        if (node == 0) v.root_children_[byte] = child;
      }
      node = child;
    }
    if (v.nodes_[node].token >= 0)
      return Status::InvalidArgument("added token '" + t.content + "' appears twice");
    v.nodes_[node].token = static_cast<int32_t>(index);
  }
  return v;
}

int32_t AddedVocabulary::Child(int32_t node, uint8_t byte) const {
  if (node == 0) return root_children_[byte];
  const auto& children = nodes_[node].children;
  auto it = std::lower_bound(children.begin(), children.end(), std::make_pair(byte, int32_t{-1}));
  return (it != children.end() && it->first == byte) ? it->second : -1;
}

int32_t AddedVocabulary::LongestMatch(std::string_view text, size_t pos) const {
  int32_t node = 0;
  int32_t best = -1;
  for (size_t i = pos; i < text.size(); ++i) {
    node = Child(node, static_cast<uint8_t>(text[i]));
    if (node < 0) break;
    if (nodes_[node].token >= 0) best = nodes_[node].token;
  }
  return best;
}

void AddedVocabulary::Split(std::string_view text, std::vector<Segment>* out) const {
  const size_t first = out->size();
  size_t start = 0;
  size_t pos = 0;
  while (pos < text.size()) {
    if (root_children_[static_cast<uint8_t>(text[pos])] < 0) {
      ++pos;
      continue;
    }
    const int32_t index = LongestMatch(text, pos);
    if (index < 0) {
      ++pos;
      continue;
    }
    if (pos > start) out->push_back({text.substr(start, pos - start), -1});
    const AddedToken& t = tokens_[index];
    out->push_back({text.substr(pos, t.content.size()), t.id});
    pos += t.content.size();
    start = pos;
  }
  if (start < text.size()) out->push_back({text.substr(start), -1});

  // lstrip / rstrip eat whitespace of the neighbouring plain runs.
  for (size_t k = first; k < out->size(); ++k) {
    Segment& seg = (*out)[k];
    if (seg.id < 0) continue;
    const AddedToken& t = tokens_[index_by_id_[seg.id]];
    if (t.lstrip && k > first && (*out)[k - 1].id < 0) (*out)[k - 1].text = TrimEnd((*out)[k - 1].text);
    if (t.rstrip && k + 1 < out->size() && (*out)[k + 1].id < 0)
      (*out)[k + 1].text = TrimStart((*out)[k + 1].text);
  }
}

const AddedToken* AddedVocabulary::FindById(int32_t id) const {
  if (id < 0 || id >= static_cast<int32_t>(index_by_id_.size()) || index_by_id_[id] < 0) return nullptr;
  return &tokens_[index_by_id_[id]];
}

const AddedToken* AddedVocabulary::FindByContent(std::string_view content) const {
  int32_t node = 0;
  for (char ch : content) {
    node = Child(node, static_cast<uint8_t>(ch));
    if (node < 0) return nullptr;
  }
  return nodes_[node].token >= 0 ? &tokens_[nodes_[node].token] : nullptr;
}

}  // namespace pdserve::tokenizer
