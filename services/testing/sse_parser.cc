#include "services/testing/sse_parser.h"

#include <nlohmann/json.hpp>

namespace pdserve::services::testing {

void SseParser::Feed(std::string_view bytes, const EventFn& on_event) {
  buffer_.append(bytes);
  size_t start = 0;
  for (;;) {
    const size_t nl = buffer_.find('\n', start);
    if (nl == std::string::npos) break;
    std::string_view line(buffer_.data() + start, nl - start);
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    DispatchLine(line, on_event);
    start = nl + 1;
  }
  buffer_.erase(0, start);
}

void SseParser::DispatchLine(std::string_view line, const EventFn& on_event) {
  if (line.empty()) {  // end of an event
    if (has_data_) on_event(data_);
    data_.clear();
    has_data_ = false;
    return;
  }
  if (line.front() == ':') return;  // comment (keep-alive)
  const size_t colon = line.find(':');
  const std::string_view field = line.substr(0, colon);
  if (field != "data") return;
  std::string_view value = colon == std::string_view::npos ? std::string_view{} : line.substr(colon + 1);
  if (!value.empty() && value.front() == ' ') value.remove_prefix(1);
  if (has_data_) data_ += '\n';
  data_.append(value);
  has_data_ = true;
}

namespace {
std::optional<int64_t> OptionalInt(const nlohmann::json& j, const char* key) {
  if (!j.contains(key) || !j[key].is_number_integer()) return std::nullopt;
  return j[key].get<int64_t>();
}
}  // namespace

Result<StreamChunk> ParseStreamChunk(std::string_view data) {
  StreamChunk c;
  if (data == "[DONE]") {
    c.done = true;
    return c;
  }
  const nlohmann::json j = nlohmann::json::parse(data, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object())
    return Status::InvalidArgument("stream event is not a JSON object: '" + std::string(data.substr(0, 80)) + "'");
  if (j.contains("error")) {
    const auto& e = j["error"];
    c.error = e.is_object() && e.contains("message") && e["message"].is_string() ? e["message"].get<std::string>()
                                                                                 : e.dump();
    return c;
  }
  if (j.contains("choices")) {
    const auto& choices = j["choices"];
    if (!choices.is_array()) return Status::InvalidArgument("stream event: 'choices' is not an array");
    if (!choices.empty()) {
      const auto& ch = choices[0];
      if (!ch.is_object()) return Status::InvalidArgument("stream event: choices[0] is not an object");
      if (ch.contains("text") && ch["text"].is_string()) c.text = ch["text"].get<std::string>();
      if (ch.contains("delta") && ch["delta"].is_object() && ch["delta"].contains("content") &&
          ch["delta"]["content"].is_string())
        c.text = ch["delta"]["content"].get<std::string>();
      if (ch.contains("finish_reason") && ch["finish_reason"].is_string())
        c.finish_reason = ch["finish_reason"].get<std::string>();
      if (ch.contains("token_ids")) {
        const auto& ids = ch["token_ids"];
        if (!ids.is_array()) return Status::InvalidArgument("stream event: choices[0].token_ids is not an array");
        for (const auto& id : ids) {
          if (!id.is_number_integer())
            return Status::InvalidArgument("stream event: choices[0].token_ids holds a non-integer");
          c.token_ids.push_back(id.get<int32_t>());
        }
      }
    }
  }
  if (j.contains("usage") && j["usage"].is_object()) {
    c.prompt_tokens = OptionalInt(j["usage"], "prompt_tokens");
    c.completion_tokens = OptionalInt(j["usage"], "completion_tokens");
    if (j["usage"].contains("prompt_tokens_details") && j["usage"]["prompt_tokens_details"].is_object())
      c.cached_tokens = OptionalInt(j["usage"]["prompt_tokens_details"], "cached_tokens");
  }
  return c;
}

}  // namespace pdserve::services::testing
