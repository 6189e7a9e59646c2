#include "tokenizer/tools.h"

#include <cstdio>

#include <nlohmann/json.hpp>

#include "tokenizer/deepseek_markers.h"

namespace pdserve::tokenizer {

namespace {

using Json = nlohmann::ordered_json;

bool ValidName(const std::string& name) {
  if (name.empty() || name.size() > 64) return false;
  for (char c : name)
    if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-'))
      return false;
  return true;
}

void AppendEscapedString(const std::string& s, std::string* out) {
  char buf[16];
  out->push_back('"');
  for (size_t i = 0; i < s.size();) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    if (c < 0x80) {
      switch (c) {
        case '"': *out += "\\\""; break;
        case '\\': *out += "\\\\"; break;
        case '\n': *out += "\\n"; break;
        case '\r': *out += "\\r"; break;
        case '\t': *out += "\\t"; break;
        case '\b': *out += "\\b"; break;
        case '\f': *out += "\\f"; break;
        default:
          if (c < 0x20) {
            std::snprintf(buf, sizeof(buf), "\\u%04x", c);
            *out += buf;
          } else {
            out->push_back(static_cast<char>(c));
          }
      }
      ++i;
      continue;
    }
    // Non-ASCII: \uXXXX, as a surrogate pair above the BMP (Python's ensure_ascii).
    uint32_t cp = 0;
    size_t n = 1;
    if (c >= 0xF0) cp = c & 0x07, n = 4;
    else if (c >= 0xE0) cp = c & 0x0F, n = 3;
    else cp = c & 0x1F, n = 2;
    for (size_t k = 1; k < n && i + k < s.size(); ++k) cp = (cp << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3F);
    i += n;
    if (cp >= 0x10000) {
      cp -= 0x10000;
      std::snprintf(buf, sizeof(buf), "\\u%04x\\u%04x", 0xD800 + (cp >> 10), 0xDC00 + (cp & 0x3FF));
    } else {
      std::snprintf(buf, sizeof(buf), "\\u%04x", cp);
    }
    *out += buf;
  }
  out->push_back('"');
}

void AppendPython(const Json& v, std::string* out) {
  switch (v.type()) {
    case Json::value_t::object: {
      out->push_back('{');
      bool first = true;
      for (const auto& [k, x] : v.items()) {
        if (!first) *out += ", ";
        first = false;
        AppendEscapedString(k, out);
        *out += ": ";
        AppendPython(x, out);
      }
      out->push_back('}');
      return;
    }
    case Json::value_t::array: {
      out->push_back('[');
      for (size_t i = 0; i < v.size(); ++i) {
        if (i) *out += ", ";
        AppendPython(v[i], out);
      }
      out->push_back(']');
      return;
    }
    case Json::value_t::string: AppendEscapedString(v.get<std::string>(), out); return;
    case Json::value_t::boolean: *out += v.get<bool>() ? "true" : "false"; return;
    case Json::value_t::null: *out += "null"; return;
    default: *out += v.dump(); return;  // numbers
  }
}

}  // namespace

Result<std::string> PythonJsonDumps(std::string_view json_text) {
  Json v;
  try {
    v = Json::parse(json_text);
  } catch (const nlohmann::json::exception& e) {
    return Status::InvalidArgument(std::string("not valid JSON: ") + e.what());
  }
  std::string out;
  AppendPython(v, &out);
  return out;
}

Result<std::vector<ToolFunction>> ParseTools(const nlohmann::ordered_json& tools) {
  std::vector<ToolFunction> out;
  if (tools.is_null()) return out;
  if (!tools.is_array()) return Status::InvalidArgument("\"tools\" must be a list");
  for (size_t i = 0; i < tools.size(); ++i) {
    const Json& t = tools[i];
    const std::string at = "tools[" + std::to_string(i) + "]";
    if (!t.is_object()) return Status::InvalidArgument(at + " must be an object");
    if (auto type = t.find("type"); type != t.end() && (!type->is_string() || *type != "function"))
      return Status::InvalidArgument(at + ".type must be \"function\"");
    auto f = t.find("function");
    if (f == t.end() || !f->is_object()) return Status::InvalidArgument(at + ".function must be an object");
    ToolFunction fn;
    auto name = f->find("name");
    if (name == f->end() || !name->is_string() || !ValidName(name->get<std::string>()))
      return Status::InvalidArgument(at + ".function.name must match [A-Za-z0-9_-]{1,64}");
    fn.name = name->get<std::string>();
    for (const ToolFunction& earlier : out)
      if (earlier.name == fn.name) return Status::InvalidArgument(at + ".function.name '" + fn.name + "' is repeated");
    if (auto d = f->find("description"); d != f->end() && !d->is_null()) {
      if (!d->is_string()) return Status::InvalidArgument(at + ".function.description must be a string");
      fn.description = d->get<std::string>();
    }
    if (auto p = f->find("parameters"); p != f->end() && !p->is_null()) {
      if (!p->is_object()) return Status::InvalidArgument(at + ".function.parameters must be a JSON Schema object");
      fn.parameters = p->dump();
    }
    out.push_back(std::move(fn));
  }
  return out;
}

Result<ToolChoice> ParseToolChoice(const nlohmann::ordered_json& choice, const std::vector<ToolFunction>& tools) {
  ToolChoice out;
  if (choice.is_null()) return out;
  if (choice.is_string()) {
    const std::string s = choice.get<std::string>();
    if (s == "auto") out.mode = ToolChoiceMode::kAuto;
    else if (s == "none") out.mode = ToolChoiceMode::kNone;
    else if (s == "required") out.mode = ToolChoiceMode::kRequired;
    else return Status::InvalidArgument("\"tool_choice\" must be \"auto\", \"none\", \"required\" or a function");
    if (out.mode == ToolChoiceMode::kRequired && tools.empty())
      return Status::InvalidArgument("\"tool_choice\": \"required\" needs \"tools\"");
    return out;
  }
  if (!choice.is_object() || !choice.contains("function") || !choice["function"].is_object() ||
      !choice["function"].contains("name") || !choice["function"]["name"].is_string())
    return Status::InvalidArgument("\"tool_choice\" must name a function as {\"type\": \"function\", \"function\": {\"name\": ...}}");
  out.mode = ToolChoiceMode::kFunction;
  out.function = choice["function"]["name"].get<std::string>();
  for (const ToolFunction& t : tools)
    if (t.name == out.function) return out;
  return Status::InvalidArgument("\"tool_choice\" names function '" + out.function + "', which is not in \"tools\"");
}

Result<std::string> RenderToolsPrompt(const std::vector<ToolFunction>& tools) {
  std::string out = "## Tools\nYou have access to the following tools:\n";
  for (size_t i = 0; i < tools.size(); ++i) {
    const ToolFunction& t = tools[i];
    auto params = PythonJsonDumps(t.parameters.empty() ? std::string_view("{}") : std::string_view(t.parameters));
    if (!params.ok()) return params.status().WithContext("tools[" + std::to_string(i) + "].function.parameters");
    out += "\n### " + t.name + "\nDescription: " + t.description + "\n\nParameters: " + *params + "\n";
  }
  out += "\nIMPORTANT: ALWAYS adhere to this exact format for tool use:\n";
  out.append(markers::kToolCallsBegin).append(markers::kToolCallBegin).append("tool_call_name");
  out.append(markers::kToolSep).append("tool_call_arguments").append(markers::kToolCallEnd);
  out.append("{{additional_tool_calls}}").append(markers::kToolCallsEnd).append("\n\n");
  out += "Where:\n\n"
         "- `tool_call_name` must be an exact match to one of the available tools\n"
         "- `tool_call_arguments` must be valid JSON that strictly follows the tool's Parameters Schema\n"
         "- For multiple tool calls, chain them directly without separators or spaces\n";
  return out;
}

}  // namespace pdserve::tokenizer
