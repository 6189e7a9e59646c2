#include "tokenizer/tokenizer_config.h"

#include <nlohmann/json.hpp>

namespace pdserve::tokenizer {

namespace {
using nlohmann::json;

Result<std::string> TokenContent(const json& config, const char* key) {
  auto it = config.find(key);
  if (it == config.end() || it->is_null()) return std::string();
  if (it->is_string()) return it->get<std::string>();
  if (it->is_object() && it->contains("content") && (*it)["content"].is_string())
    return (*it)["content"].get<std::string>();
  return Status::InvalidArgument(std::string("tokenizer_config.json: \"") + key +
                                 "\" must be a string or an object with \"content\"");
}
}  // namespace

Result<TokenizerConfig> TokenizerConfig::FromJsonText(std::string_view text) {
  try {
    return Parse(text);
  } catch (const json::exception& e) {
    return Status::InvalidArgument(std::string("malformed tokenizer_config.json: ") + e.what());
  }
}

Result<TokenizerConfig> TokenizerConfig::Parse(std::string_view text) {
  json config;
  try {
    config = json::parse(text);
  } catch (const json::exception& e) {
    return Status::InvalidArgument(std::string("tokenizer_config.json is not valid JSON: ") + e.what());
  }
  if (!config.is_object()) return Status::InvalidArgument("tokenizer_config.json must hold an object");
  TokenizerConfig out;
  PDSERVE_ASSIGN_OR_RETURN(out.bos_token, TokenContent(config, "bos_token"));
  PDSERVE_ASSIGN_OR_RETURN(out.eos_token, TokenContent(config, "eos_token"));
  PDSERVE_ASSIGN_OR_RETURN(out.pad_token, TokenContent(config, "pad_token"));
  if (auto it = config.find("add_bos_token"); it != config.end() && it->is_boolean())
    out.add_bos_token = it->get<bool>();
  if (auto it = config.find("chat_template"); it != config.end() && !it->is_null()) {
    if (it->is_string()) {
      out.chat_template = it->get<std::string>();
    } else if (it->is_array()) {
      for (const json& entry : *it) {
        if (entry.is_object() && entry.value("name", std::string()) == "default" &&
            entry.contains("template") && entry["template"].is_string())
          out.chat_template = entry["template"].get<std::string>();
      }
    } else {
      return Status::InvalidArgument("tokenizer_config.json: \"chat_template\" must be a string or a list");
    }
  }
  return out;
}

}  // namespace pdserve::tokenizer
