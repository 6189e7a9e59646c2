#include "tokenizer/normalizer.h"

#include <vector>

#include <nlohmann/json.hpp>

#include "tokenizer/utf8.h"

namespace pdserve::tokenizer {

namespace {

using nlohmann::json;

class SequenceNormalizer final : public Normalizer {
 public:
  explicit SequenceNormalizer(std::vector<std::unique_ptr<Normalizer>> children)
      : children_(std::move(children)) {}
  Status Apply(std::string* text) const override {
    for (const auto& c : children_) PDSERVE_RETURN_IF_ERROR(c->Apply(text));
    return Status::Ok();
  }

 private:
  std::vector<std::unique_ptr<Normalizer>> children_;
};

class ReplaceNormalizer final : public Normalizer {
 public:
  ReplaceNormalizer(std::unique_ptr<Regex> regex, std::string literal, std::string content)
      : regex_(std::move(regex)), literal_(std::move(literal)), content_(std::move(content)) {}

  Status Apply(std::string* text) const override {
    std::string out;
    size_t pos = 0, prev = 0;
    while (pos <= text->size()) {
      size_t b = 0, e = 0;
      if (regex_) {
        Status error;
        if (!regex_->Find(*text, pos, &b, &e, &error)) {
          if (!error.ok()) return error;
          break;
        }
      } else {
        b = text->find(literal_, pos);
        if (b == std::string::npos) break;
        e = b + literal_.size();
      }
      out.append(*text, prev, b - prev);
      out += content_;
      prev = e;
      if (e == b) {
        if (e >= text->size()) break;
        const size_t len = Utf8CharLength(*text, e);
        out.append(*text, e, len);
        prev = pos = e + len;
      } else {
        pos = e;
      }
    }
    out.append(*text, prev, std::string::npos);
    *text = std::move(out);
    return Status::Ok();
  }

 private:
  std::unique_ptr<Regex> regex_;
  std::string literal_;
  std::string content_;
};

class PrependNormalizer final : public Normalizer {
 public:
  explicit PrependNormalizer(std::string prefix) : prefix_(std::move(prefix)) {}
  Status Apply(std::string* text) const override {
    if (!text->empty()) text->insert(0, prefix_);
    return Status::Ok();
  }

 private:
  std::string prefix_;
};

class StripNormalizer final : public Normalizer {
 public:
  StripNormalizer(bool left, bool right) : left_(left), right_(right) {}
  Status Apply(std::string* text) const override {
    size_t begin = 0, end = text->size();
    if (left_) {
      while (begin < end) {
        size_t next = begin;
        if (!IsEcmaScriptSpace(DecodeUtf8Char(*text, &next))) break;
        begin = next;
      }
    }
    if (right_) {
      while (end > begin) {
        size_t start = end - 1;
        while (start > begin && (static_cast<uint8_t>((*text)[start]) & 0xC0) == 0x80) --start;
        size_t probe = start;
        if (!IsEcmaScriptSpace(DecodeUtf8Char(*text, &probe))) break;
        end = start;
      }
    }
    *text = text->substr(begin, end - begin);
    return Status::Ok();
  }

 private:
  bool left_, right_;
};

// Sequences nest at most this deep (real files use one level; an unbounded depth would let a
// crafted file overflow the stack here and at every Normalize call).
constexpr int kMaxSequenceDepth = 8;

Result<std::unique_ptr<Normalizer>> Build(const json& j, RegexDialect dialect, int depth = 0) {
  if (depth > kMaxSequenceDepth)
    return Status::InvalidArgument("normalizer Sequences nest deeper than " + std::to_string(kMaxSequenceDepth));
  if (!j.is_object() || !j.contains("type") || !j["type"].is_string())
    return Status::InvalidArgument("normalizer must be an object with a string \"type\"");
  const std::string type = j["type"].get<std::string>();
  if (type == "Sequence") {
    const auto it = j.find("normalizers");
    if (it == j.end() || !it->is_array())
      return Status::InvalidArgument("Sequence normalizer needs a \"normalizers\" array");
    std::vector<std::unique_ptr<Normalizer>> children;
    for (const json& child : *it) {
      PDSERVE_ASSIGN_OR_RETURN(auto n, Build(child, dialect, depth + 1));
      if (n) children.push_back(std::move(n));
    }
    if (children.empty()) return std::unique_ptr<Normalizer>();
    if (children.size() == 1) return std::move(children.front());
    return std::unique_ptr<Normalizer>(new SequenceNormalizer(std::move(children)));
  }
  if (type == "Replace") {
    const json& pattern = j.at("pattern");
    const std::string content = j.at("content").get<std::string>();
    PDSERVE_RETURN_IF_ERROR(ValidateUtf8(content));
    if (pattern.contains("Regex")) {
      PDSERVE_ASSIGN_OR_RETURN(auto regex, Regex::Compile(pattern["Regex"].get<std::string>(), dialect));
      return std::unique_ptr<Normalizer>(new ReplaceNormalizer(std::move(regex), "", content));
    }
    std::string literal = pattern.at("String").get<std::string>();
    if (literal.empty()) return Status::InvalidArgument("Replace normalizer pattern is empty");
    return std::unique_ptr<Normalizer>(new ReplaceNormalizer(nullptr, std::move(literal), content));
  }
  if (type == "Prepend") {
    std::string prefix = j.at("prepend").get<std::string>();
    PDSERVE_RETURN_IF_ERROR(ValidateUtf8(prefix));
    return std::unique_ptr<Normalizer>(new PrependNormalizer(std::move(prefix)));
  }
  if (type == "Strip") {
    const bool left = j.value("strip_left", true);
    const bool right = j.value("strip_right", true);
    return std::unique_ptr<Normalizer>(new StripNormalizer(left, right));
  }
  return Status::Unimplemented("normalizer type '" + type + "' is not supported");
}

}  // namespace

Result<std::unique_ptr<Normalizer>> Normalizer::FromJson(const json& config, RegexDialect dialect) {
  if (config.is_null()) return std::unique_ptr<Normalizer>();
  try {
    return Build(config, dialect);
  } catch (const json::exception& e) {
    return Status::InvalidArgument(std::string("malformed normalizer: ") + e.what());
  }
}

}  // namespace pdserve::tokenizer
