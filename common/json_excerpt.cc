#include "common/json_excerpt.h"

namespace pdserve {

namespace {

constexpr int kMaxDepth = 3;

void Render(const nlohmann::json& v, int depth, size_t max_chars, std::string* out) {
  if (out->size() > max_chars) return;
  if (v.is_array() || v.is_object()) {
    const bool array = v.is_array();
    if (depth >= kMaxDepth) {
      *out += array ? "[...]" : "{...}";
      return;
    }
    *out += array ? '[' : '{';
    bool first = true;
    for (auto it = v.begin(); it != v.end(); ++it) {
      if (!first) *out += ", ";
      first = false;
      if (out->size() > max_chars) {
        *out += "...";
        break;
      }
      if (!array) {
        Render(nlohmann::json(it.key()), kMaxDepth, max_chars, out);
        *out += ": ";
      }
      Render(*it, depth + 1, max_chars, out);
    }
    *out += array ? ']' : '}';
    return;
  }
  if (v.is_string()) {
    const std::string& s = v.get_ref<const std::string&>();
    if (s.size() > max_chars) {
      *out += nlohmann::json(s.substr(0, max_chars)).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
      *out += "...";
      return;
    }
  }
  // A scalar: dump() does not recurse.
  *out += v.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace

std::string JsonExcerpt(const nlohmann::json& value, size_t max_chars) {
  std::string out;
  Render(value, 0, max_chars, &out);
  return out;
}

}  // namespace pdserve
