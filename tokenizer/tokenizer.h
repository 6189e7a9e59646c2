// Tokenizer: a Hugging Face byte-level BPE tokenizer (tokenizer.json + tokenizer_config.json),
// e.g. DeepSeek-V3 / V3.2's 128K vocabulary, giving the same ids as the reference
// implementations.
//
// Encode pipeline, in order:
//   1. added tokens (specials like <｜User｜>) are cut out of the raw text (AddedVocabulary);
//   2. each plain run is normalized (Normalizer; DeepSeek declares none);
//   3. pre-tokenized into pieces (PreTokenizer: DeepSeek's three regex splits + ByteLevel);
//   4. each piece's bytes go through BPE merges (BpeModel, with a cache).
// Encode never adds BOS/EOS on its own (post-processors are not applied); ask for BOS with
// EncodeOptions::add_bos. Decode maps ids back to bytes (added tokens verbatim, others via the
// byte-level alphabet) and repairs invalid UTF-8 with U+FFFD exactly as the references do.
//
// Thread-safety: immutable after loading except the BPE cache, which is thread-safe; every
// const method may be called concurrently from any thread on one shared Tokenizer.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "tokenizer/added_vocabulary.h"
#include "tokenizer/bpe_model.h"
#include "tokenizer/normalizer.h"
#include "tokenizer/pre_tokenizer.h"
#include "tokenizer/regex.h"
#include "tokenizer/tokenizer_config.h"

namespace pdserve::tokenizer {

struct TokenizerOptions {
  // How tokenizer.json regexes are read; kEcmaScript reproduces the JS reference exactly
  // (see regex.h for the few characters where the dialects differ).
  RegexDialect regex_dialect = RegexDialect::kEcmaScript;
  // Entries in the BPE piece cache (0 disables it).
  size_t cache_capacity = size_t{1} << 17;
};

struct EncodeOptions {
  bool add_bos = false;              // prepend the config's bos_token id
  bool parse_special_tokens = true;  // false: added-token text is encoded as plain text
};

struct DecodeOptions {
  bool skip_special_tokens = false;  // drop added tokens marked "special"
};

class Tokenizer {
 public:
  // Loads DIR/tokenizer.json and, when present, DIR/tokenizer_config.json.
  // Errors: NotFound (no tokenizer.json), InvalidArgument (malformed files), Unimplemented
  // (a component this library does not implement, named in the message).
  static Result<std::unique_ptr<Tokenizer>> Load(const std::string& dir,
                                                 const TokenizerOptions& options = {});
  // Same from file contents; `config_json` may be empty.
  static Result<std::unique_ptr<Tokenizer>> FromJson(std::string_view tokenizer_json,
                                                     std::string_view config_json,
                                                     const TokenizerOptions& options = {});

  // Text -> ids. Errors: InvalidArgument (text is not valid UTF-8; the message gives the byte
  // offset), FailedPrecondition (add_bos without a known BOS token), ResourceExhausted (a regex
  // hit a PCRE2 limit).
  Result<std::vector<int32_t>> Encode(std::string_view text, const EncodeOptions& options = {}) const;
  // Appends to *out instead (on error *out may hold a partial result).
  Status EncodeAppend(std::string_view text, const EncodeOptions& options,
                      std::vector<int32_t>* out) const;

  // Ids -> text (always valid UTF-8). Errors: InvalidArgument naming the first id that is not
  // in the vocabulary (negative, beyond id_limit(), or a hole in the id space).
  Result<std::string> Decode(std::span<const int32_t> ids, const DecodeOptions& options = {}) const;

  // The raw bytes `id` contributes to a decode (may be part of a UTF-8 character); empty for a
  // special token when skip_special. Errors: InvalidArgument for an unknown id.
  Result<std::string_view> TokenBytes(int32_t id, bool skip_special) const;

  // Id of an added token's content or of a vocabulary entry's byte-level spelling.
  std::optional<int32_t> TokenToId(std::string_view token) const;
  // The token as written in tokenizer.json (byte-level spelling / added content).
  std::optional<std::string> IdToToken(int32_t id) const;

  bool IsValidId(int32_t id) const { return id >= 0 && id < id_limit() && (flags_[id] & kValid); }
  bool IsSpecial(int32_t id) const { return IsValidId(id) && (flags_[id] & kSpecial); }
  // One more than the largest id (128815 for DeepSeek-V3). The model's embedding may be larger.
  int32_t id_limit() const { return static_cast<int32_t>(flags_.size()); }
  std::optional<int32_t> bos_id() const { return bos_id_; }
  std::optional<int32_t> eos_id() const { return eos_id_; }

  const TokenizerConfig& config() const { return config_; }
  const AddedVocabulary& added_vocabulary() const { return added_; }
  const BpeModel& model() const { return *model_; }
  void ClearCache() const { model_->ClearCache(); }

 private:
  Tokenizer() = default;
  static Result<std::unique_ptr<Tokenizer>> Build(std::string_view tokenizer_json,
                                                  std::string_view config_json,
                                                  const TokenizerOptions& options);
  Status BuildDecodeTable();

  static constexpr uint8_t kValid = 1;
  static constexpr uint8_t kSpecial = 2;

  TokenizerConfig config_;
  AddedVocabulary added_;
  std::unique_ptr<Normalizer> normalizer_;      // null: none
  std::unique_ptr<PreTokenizer> pre_tokenizer_;
  std::unique_ptr<BpeModel> model_;
  std::vector<std::string> decode_bytes_;  // per id
  std::vector<uint8_t> flags_;             // per id: kValid | kSpecial
  std::optional<int32_t> bos_id_;
  std::optional<int32_t> eos_id_;
};

}  // namespace pdserve::tokenizer
