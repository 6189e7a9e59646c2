#include "tokenizer/tokenizer.h"

#include <nlohmann/json.hpp>

#include "common/json_excerpt.h"
#include "common/mapped_file.h"
#include "tokenizer/byte_level.h"
#include "tokenizer/utf8.h"

namespace pdserve::tokenizer {

namespace {
using nlohmann::json;

// Only the ByteLevel decoder (alone or as the single member of a Sequence) is byte-level BPE.
// Iterative: a crafted file may nest Sequences arbitrarily deep. The message shows an excerpt
// (dump() of a deep value would overflow the stack).
Status CheckDecoder(const json& decoder) {
  const json* d = &decoder;
  while (true) {
    if (d->is_object() && d->value("type", std::string()) == "ByteLevel") return Status::Ok();
    if (!d->is_object() || d->value("type", std::string()) != "Sequence") break;
    auto it = d->find("decoders");
    if (it == d->end() || !it->is_array() || it->size() != 1) break;
    d = &(*it)[0];
  }
  return Status::Unimplemented("decoder " + JsonExcerpt(decoder, 200) + " is not supported (only ByteLevel)");
}
}  // namespace

Result<std::unique_ptr<Tokenizer>> Tokenizer::Load(const std::string& dir,
                                                   const TokenizerOptions& options) {
  auto tokenizer_json = ReadFileToString(dir + "/tokenizer.json");
  if (!tokenizer_json.ok()) {
    return Status(tokenizer_json.status().code(),
                  "cannot read " + dir + "/tokenizer.json: " + tokenizer_json.status().message());
  }
  std::string config_text;
  auto config_json = ReadFileToString(dir + "/tokenizer_config.json");
  if (config_json.ok()) {
    config_text = std::move(config_json).value();
  } else if (config_json.status().code() != StatusCode::kNotFound) {
    return config_json.status();
  }
  auto tokenizer = FromJson(*tokenizer_json, config_text, options);
  if (!tokenizer.ok()) return tokenizer.status().WithContext("tokenizer in " + dir);
  return tokenizer;
}

Result<std::unique_ptr<Tokenizer>> Tokenizer::FromJson(std::string_view tokenizer_json,
                                                       std::string_view config_json,
                                                       const TokenizerOptions& options) {
  // Components report wrong types themselves; this catches anything they missed so a malformed
  // file can never escape as an exception.
  try {
    return Build(tokenizer_json, config_json, options);
  } catch (const json::exception& e) {
    return Status::InvalidArgument(std::string("malformed tokenizer.json: ") + e.what());
  }
}

Result<std::unique_ptr<Tokenizer>> Tokenizer::Build(std::string_view tokenizer_json,
                                                    std::string_view config_json,
                                                    const TokenizerOptions& options) {
  std::unique_ptr<Tokenizer> t(new Tokenizer());
  if (!config_json.empty()) {
    PDSERVE_ASSIGN_OR_RETURN(t->config_, TokenizerConfig::FromJsonText(config_json));
  }
  json root;
  try {
    root = json::parse(tokenizer_json);
  } catch (const json::exception& e) {
    return Status::InvalidArgument(std::string("tokenizer.json is not valid JSON: ") + e.what());
  }
  if (!root.is_object()) return Status::InvalidArgument("tokenizer.json must hold an object");
  const json null_json;
  auto field = [&](const char* key) -> const json& {
    auto it = root.find(key);
    return it == root.end() ? null_json : *it;
  };
  if (field("model").is_null()) return Status::InvalidArgument("tokenizer.json has no \"model\"");

  PDSERVE_ASSIGN_OR_RETURN(t->added_, AddedVocabulary::FromJson(field("added_tokens")));
  PDSERVE_ASSIGN_OR_RETURN(t->normalizer_, Normalizer::FromJson(field("normalizer"), options.regex_dialect));
  PDSERVE_ASSIGN_OR_RETURN(t->pre_tokenizer_,
                           PreTokenizer::FromJson(field("pre_tokenizer"), options.regex_dialect));
  if (!t->pre_tokenizer_ || !t->pre_tokenizer_->HasByteLevel())
    return Status::Unimplemented("pre_tokenizer has no ByteLevel step: only byte-level BPE is supported");
  PDSERVE_RETURN_IF_ERROR(CheckDecoder(field("decoder")));
  PDSERVE_ASSIGN_OR_RETURN(t->model_, BpeModel::FromJson(field("model"), options.cache_capacity));
  PDSERVE_RETURN_IF_ERROR(t->BuildDecodeTable());

  if (!t->config_.bos_token.empty()) t->bos_id_ = t->TokenToId(t->config_.bos_token);
  if (!t->config_.eos_token.empty()) t->eos_id_ = t->TokenToId(t->config_.eos_token);
  return t;
}

Status Tokenizer::BuildDecodeTable() {
  int32_t limit = model_->id_limit();
  for (const AddedToken& a : added_.tokens()) limit = std::max(limit, a.id + 1);
  // Ids index dense tables; refuse absurdly sparse ones instead of allocating for them.
  const size_t entries = model_->vocab_size() + added_.tokens().size();
  if (static_cast<size_t>(limit) > 2 * entries + 1024)
    return Status::InvalidArgument("token ids go up to " + std::to_string(limit - 1) + " for only " +
                                   std::to_string(entries) + " tokens: ids too sparse");
  decode_bytes_.assign(limit, std::string());
  flags_.assign(limit, 0);
  for (int32_t id = 0; id < model_->id_limit(); ++id) {
    const std::string* token = model_->IdToToken(id);
    if (token == nullptr) continue;
    // A token spelled outside the byte-level alphabet decodes to its own UTF-8 bytes (the Rust
    // library's rule).
    auto bytes = ByteLevelToBytes(*token);
    decode_bytes_[id] = bytes ? std::move(*bytes) : *token;
    flags_[id] = kValid;
  }
  for (const AddedToken& a : added_.tokens()) {
    decode_bytes_[a.id] = a.content;
    flags_[a.id] = kValid | (a.special ? kSpecial : 0);
  }
  return Status::Ok();
}

Result<std::vector<int32_t>> Tokenizer::Encode(std::string_view text, const EncodeOptions& options) const {
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3 + 4);
  PDSERVE_RETURN_IF_ERROR(EncodeAppend(text, options, &ids));
  return ids;
}

Status Tokenizer::EncodeAppend(std::string_view text, const EncodeOptions& options,
                               std::vector<int32_t>* out) const {
  PDSERVE_RETURN_IF_ERROR(ValidateUtf8(text));
  if (options.add_bos) {
    if (!bos_id_) return Status::FailedPrecondition("add_bos requested but the tokenizer has no BOS token");
    out->push_back(*bos_id_);
  }
  std::vector<AddedVocabulary::Segment> segments;
  if (options.parse_special_tokens) {
    added_.Split(text, &segments);
  } else {
    segments.push_back({text, -1});
  }
  PieceArena arena;
  Pieces in(1);
  Pieces pieces;
  std::string normalized;
  for (const auto& seg : segments) {
    if (seg.id >= 0) {
      out->push_back(seg.id);
      continue;
    }
    std::string_view plain = seg.text;
    if (normalizer_ && !plain.empty()) {
      normalized.assign(plain);
      PDSERVE_RETURN_IF_ERROR(normalizer_->Apply(&normalized));
      plain = normalized;
    }
    if (plain.empty()) continue;
    in[0] = plain;
    pieces.clear();
    PDSERVE_RETURN_IF_ERROR(pre_tokenizer_->Split(in, &pieces, &arena));
    for (std::string_view piece : pieces) model_->EncodeBytes(piece, out);
  }
  return Status::Ok();
}

Result<std::string_view> Tokenizer::TokenBytes(int32_t id, bool skip_special) const {
  if (!IsValidId(id)) {
    return Status::InvalidArgument("token id " + std::to_string(id) +
                                   " is not in the vocabulary (ids are 0.." +
                                   std::to_string(id_limit() - 1) + ")");
  }
  if (skip_special && (flags_[id] & kSpecial)) return std::string_view();
  return std::string_view(decode_bytes_[id]);
}

Result<std::string> Tokenizer::Decode(std::span<const int32_t> ids, const DecodeOptions& options) const {
  std::string bytes;
  bytes.reserve(ids.size() * 4);
  for (int32_t id : ids) {
    PDSERVE_ASSIGN_OR_RETURN(std::string_view b, TokenBytes(id, options.skip_special_tokens));
    bytes.append(b);
  }
  // Decoding the concatenation in one pass equals the references' per-group decoding: an added
  // token's content starts with a lead byte, which ends any open sequence the same way.
  return DecodeUtf8Lossy(bytes);
}

std::optional<int32_t> Tokenizer::TokenToId(std::string_view token) const {
  if (const AddedToken* a = added_.FindByContent(token)) return a->id;
  return model_->TokenToId(token);
}

std::optional<std::string> Tokenizer::IdToToken(int32_t id) const {
  if (const AddedToken* a = added_.FindById(id)) return a->content;
  if (const std::string* t = model_->IdToToken(id)) return *t;
  return std::nullopt;
}

}  // namespace pdserve::tokenizer
