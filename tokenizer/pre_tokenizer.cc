#include "tokenizer/pre_tokenizer.h"

#include <algorithm>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tokenizer/utf8.h"

namespace pdserve::tokenizer {

namespace {

using nlohmann::json;

// The GPT-2 split the ByteLevel pre-tokenizer applies when "use_regex" is true.
constexpr std::string_view kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

enum class Behavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };

// A split pattern: a compiled regex, or a literal string.
class Pattern {
 public:
  static Result<Pattern> FromJson(const json& j, RegexDialect dialect) {
    Pattern p;
    if (j.is_object() && j.contains("Regex") && j["Regex"].is_string()) {
      PDSERVE_ASSIGN_OR_RETURN(p.regex_, Regex::Compile(j["Regex"].get<std::string>(), dialect));
      return p;
    }
    if (j.is_object() && j.contains("String") && j["String"].is_string()) {
      p.literal_ = j["String"].get<std::string>();
      if (p.literal_.empty()) return Status::InvalidArgument("Split pattern String is empty");
      PDSERVE_RETURN_IF_ERROR(ValidateUtf8(p.literal_));
      return p;
    }
    return Status::InvalidArgument("Split pattern must be {\"Regex\": ...} or {\"String\": ...}");
  }
  static Result<Pattern> FromRegex(std::string_view pattern, RegexDialect dialect) {
    Pattern p;
    PDSERVE_ASSIGN_OR_RETURN(p.regex_, Regex::Compile(pattern, dialect));
    return p;
  }

  bool Find(std::string_view text, size_t start, size_t* b, size_t* e, Status* error) const {
    if (regex_) return regex_->Find(text, start, b, e, error);
    const size_t at = text.find(literal_, start);
    if (at == std::string_view::npos) return false;
    *b = at;
    *e = at + literal_.size();
    return true;
  }

 private:
  std::unique_ptr<Regex> regex_;  // shared_ptr-free: Pattern is moved, never copied
  std::string literal_;
};

struct Span {
  size_t begin;
  size_t end;
  bool is_delimiter;
};

class SplitStage final : public PreTokenizer {
 public:
  SplitStage(Pattern pattern, Behavior behavior, bool invert)
      : pattern_(std::move(pattern)), behavior_(behavior), invert_(invert) {}

  Status Split(const Pieces& in, Pieces* out, PieceArena*) const override {
    for (std::string_view piece : in) PDSERVE_RETURN_IF_ERROR(SplitPiece(piece, out));
    return Status::Ok();
  }

 private:
  // Calls emit(begin, end, is_match) for the alternating gaps and matches covering `text`.
  template <typename Emit>
  Status Scan(std::string_view text, Emit&& emit) const {
    size_t prev = 0;
    size_t pos = 0;
    while (pos <= text.size()) {
      size_t b = 0, e = 0;
      Status error;
      if (!pattern_.Find(text, pos, &b, &e, &error)) {
        if (!error.ok()) return error;
        break;
      }
      if (b > prev) emit(prev, b, false);
      if (e > b) emit(b, e, true);
      prev = e;
      if (e == b) {
        // An empty match: move on by one character (JS matchAll semantics).
        if (e >= text.size()) break;
        const size_t len = Utf8CharLength(text, e);
        pos = e + (len == 0 ? 1 : len);
      } else {
        pos = e;
      }
    }
    if (prev < text.size()) emit(prev, text.size(), false);
    return Status::Ok();
  }

  Status SplitPiece(std::string_view piece, Pieces* out) const {
    if (behavior_ == Behavior::kIsolated) {
      // The hot path (every DeepSeek stage): all spans, each its own piece.
      return Scan(piece, [&](size_t b, size_t e, bool) { out->push_back(piece.substr(b, e - b)); });
    }
    std::vector<Span> spans;
    PDSERVE_RETURN_IF_ERROR(Scan(piece, [&](size_t b, size_t e, bool is_match) {
      spans.push_back({b, e, is_match != invert_});
    }));
    std::vector<Span> merged;
    bool previous_delimiter = false;
    switch (behavior_) {
      case Behavior::kRemoved:
        for (const Span& s : spans)
          if (!s.is_delimiter) merged.push_back(s);
        break;
      case Behavior::kIsolated:
        merged = spans;
        break;
      case Behavior::kMergedWithPrevious:
        for (const Span& s : spans) {
          if (s.is_delimiter && !previous_delimiter && !merged.empty()) {
            merged.back().end = s.end;
          } else {
            merged.push_back(s);
          }
          previous_delimiter = s.is_delimiter;
        }
        break;
      case Behavior::kMergedWithNext:
        for (size_t k = spans.size(); k-- > 0;) {
          const Span& s = spans[k];
          if (s.is_delimiter && !previous_delimiter && !merged.empty()) {
            merged.back().begin = s.begin;
          } else {
            merged.push_back(s);
          }
          previous_delimiter = s.is_delimiter;
        }
        std::reverse(merged.begin(), merged.end());
        break;
      case Behavior::kContiguous:
        for (size_t k = 0; k < spans.size(); ++k) {
          const Span& s = spans[k];
          if (k > 0 && s.is_delimiter == previous_delimiter) {
            merged.back().end = s.end;
          } else {
            merged.push_back(s);
          }
          previous_delimiter = s.is_delimiter;
        }
        break;
    }
    for (const Span& s : merged)
      if (s.end > s.begin) out->push_back(piece.substr(s.begin, s.end - s.begin));
    return Status::Ok();
  }

  Pattern pattern_;
  Behavior behavior_;
  bool invert_;
};

class ByteLevelStage final : public PreTokenizer {
 public:
  ByteLevelStage(bool add_prefix_space, std::unique_ptr<PreTokenizer> regex_split)
      : add_prefix_space_(add_prefix_space), regex_split_(std::move(regex_split)) {}

  Status Split(const Pieces& in, Pieces* out, PieceArena* arena) const override {
    if (!add_prefix_space_ && !regex_split_) {
      out->insert(out->end(), in.begin(), in.end());
      return Status::Ok();
    }
    Pieces prefixed;
    const Pieces* src = &in;
    if (add_prefix_space_) {
      prefixed.reserve(in.size());
      for (std::string_view p : in)
        prefixed.push_back(!p.empty() && p.front() == ' ' ? p : arena->Store(" " + std::string(p)));
      src = &prefixed;
    }
    if (!regex_split_) {
      out->insert(out->end(), src->begin(), src->end());
      return Status::Ok();
    }
    return regex_split_->Split(*src, out, arena);
  }
  bool HasByteLevel() const override { return true; }

 private:
  bool add_prefix_space_;
  std::unique_ptr<PreTokenizer> regex_split_;  // the GPT-2 split, when use_regex
};

class SequenceStage final : public PreTokenizer {
 public:
  explicit SequenceStage(std::vector<std::unique_ptr<PreTokenizer>> stages)
      : stages_(std::move(stages)) {}

  Status Split(const Pieces& in, Pieces* out, PieceArena* arena) const override {
    if (stages_.empty()) {
      out->insert(out->end(), in.begin(), in.end());
      return Status::Ok();
    }
    Pieces a, b;
    const Pieces* src = &in;
    for (size_t k = 0; k < stages_.size(); ++k) {
      Pieces* dst = out;
      if (k + 1 < stages_.size()) {
        dst = (src == &a) ? &b : &a;
        dst->clear();
      }
      PDSERVE_RETURN_IF_ERROR(stages_[k]->Split(*src, dst, arena));
      src = dst;
    }
    return Status::Ok();
  }
  bool HasByteLevel() const override {
    for (const auto& s : stages_)
      if (s->HasByteLevel()) return true;
    return false;
  }

 private:
  std::vector<std::unique_ptr<PreTokenizer>> stages_;
};

Result<Behavior> ParseBehavior(const json& j) {
  const std::string name = j.is_string() ? j.get<std::string>() : "";
  if (name == "Removed") return Behavior::kRemoved;
  if (name == "Isolated") return Behavior::kIsolated;
  if (name == "MergedWithPrevious") return Behavior::kMergedWithPrevious;
  if (name == "MergedWithNext") return Behavior::kMergedWithNext;
  if (name == "Contiguous") return Behavior::kContiguous;
  return Status::InvalidArgument("unknown Split behavior '" + name + "'");
}

bool BoolOr(const json& j, const char* key, bool fallback) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return fallback;
  return it->get<bool>();  // throws type_error on a non-bool: caught by FromJson
}

// Sequences nest at most this deep (real files use one level; an unbounded depth would let a
// crafted file overflow the stack here and at every Split call).
constexpr int kMaxSequenceDepth = 8;

Result<std::unique_ptr<PreTokenizer>> Build(const json& j, RegexDialect dialect, int depth = 0) {
  if (depth > kMaxSequenceDepth)
    return Status::InvalidArgument("pre_tokenizer Sequences nest deeper than " + std::to_string(kMaxSequenceDepth));
  if (!j.is_object() || !j.contains("type") || !j["type"].is_string())
    return Status::InvalidArgument("pre_tokenizer entry must be an object with a string \"type\"");
  const std::string type = j["type"].get<std::string>();
  if (type == "Sequence") {
    const auto it = j.find("pretokenizers");
    if (it == j.end() || !it->is_array())
      return Status::InvalidArgument("Sequence pre_tokenizer needs a \"pretokenizers\" array");
    std::vector<std::unique_ptr<PreTokenizer>> stages;
    for (const json& child : *it) {
      PDSERVE_ASSIGN_OR_RETURN(auto stage, Build(child, dialect, depth + 1));
      stages.push_back(std::move(stage));
    }
    return std::unique_ptr<PreTokenizer>(new SequenceStage(std::move(stages)));
  }
  if (type == "Split") {
    if (!j.contains("pattern")) return Status::InvalidArgument("Split pre_tokenizer needs \"pattern\"");
    PDSERVE_ASSIGN_OR_RETURN(Pattern pattern, Pattern::FromJson(j["pattern"], dialect));
    PDSERVE_ASSIGN_OR_RETURN(Behavior behavior,
                             ParseBehavior(j.contains("behavior") ? j["behavior"] : json()));
    return std::unique_ptr<PreTokenizer>(
        new SplitStage(std::move(pattern), behavior, BoolOr(j, "invert", false)));
  }
  if (type == "ByteLevel") {
    std::unique_ptr<PreTokenizer> regex_split;
    if (BoolOr(j, "use_regex", true)) {
      PDSERVE_ASSIGN_OR_RETURN(Pattern gpt2, Pattern::FromRegex(kGpt2Pattern, dialect));
      regex_split.reset(new SplitStage(std::move(gpt2), Behavior::kIsolated, false));
    }
    return std::unique_ptr<PreTokenizer>(
        new ByteLevelStage(BoolOr(j, "add_prefix_space", false), std::move(regex_split)));
  }
  if (type == "Digits") {
    const bool individual = BoolOr(j, "individual_digits", false);
    PDSERVE_ASSIGN_OR_RETURN(Pattern digits, Pattern::FromRegex(individual ? "\\d" : "\\d+", dialect));
    return std::unique_ptr<PreTokenizer>(new SplitStage(std::move(digits), Behavior::kIsolated, false));
  }
  return Status::Unimplemented("pre_tokenizer type '" + type + "' is not supported");
}

}  // namespace

Result<std::unique_ptr<PreTokenizer>> PreTokenizer::FromJson(const json& config,
                                                             RegexDialect dialect) {
  if (config.is_null()) return std::unique_ptr<PreTokenizer>();
  try {
    return Build(config, dialect);
  } catch (const json::exception& e) {
    return Status::InvalidArgument(std::string("malformed pre_tokenizer: ") + e.what());
  }
}

}  // namespace pdserve::tokenizer
