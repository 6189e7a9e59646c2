// `pdserve tokenize`: text <-> token ids with the pdserve tokenizer, one JSON value per line.
//   encode (default): stdin lines are JSON strings; stdout lines are JSON arrays of ids.
//   --decode:         stdin lines are JSON arrays of ids; stdout lines are JSON strings.
// Blank input lines are skipped. The first bad line stops the command with exit code 1 and a
// message naming the line.
#include <cstdio>
#include <iostream>
#include <string>

#include <nlohmann/json.hpp>

#include "services/cli/command.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/tokenizer_paths.h"

namespace pdserve::cli {
namespace {

using nlohmann::json;
using tokenizer::Tokenizer;

bool IsBlank(const std::string& line) {
  return line.find_first_not_of(" \t\r\n") == std::string::npos;
}

Status EncodeLine(const Tokenizer& tok, const std::string& line, const tokenizer::EncodeOptions& options,
                  std::string* out) {
  json value;
  try {
    value = json::parse(line);
  } catch (const json::exception& e) {
    return Status::InvalidArgument(std::string("not valid JSON: ") + e.what());
  }
  if (!value.is_string()) return Status::InvalidArgument("expected a JSON string");
  PDSERVE_ASSIGN_OR_RETURN(std::vector<int32_t> ids, tok.Encode(value.get_ref<const std::string&>(), options));
  out->push_back('[');
  for (size_t i = 0; i < ids.size(); ++i) {
    if (i) out->push_back(',');
    out->append(std::to_string(ids[i]));
  }
  out->append("]\n");
  return Status::Ok();
}

Status DecodeLine(const Tokenizer& tok, const std::string& line, const tokenizer::DecodeOptions& options,
                  std::string* out) {
  json value;
  try {
    value = json::parse(line);
  } catch (const json::exception& e) {
    return Status::InvalidArgument(std::string("not valid JSON: ") + e.what());
  }
  if (!value.is_array()) return Status::InvalidArgument("expected a JSON array of token ids");
  std::vector<int32_t> ids;
  ids.reserve(value.size());
  for (const json& v : value) {
    if (!v.is_number_integer() || v.get<int64_t>() < INT32_MIN || v.get<int64_t>() > INT32_MAX)
      return Status::InvalidArgument("token ids must be 32-bit integers, got " + v.dump());
    ids.push_back(static_cast<int32_t>(v.get<int64_t>()));
  }
  PDSERVE_ASSIGN_OR_RETURN(std::string text, tok.Decode(ids, options));
  out->append(json(text).dump());  // Decode output is valid UTF-8, so dump() cannot throw
  out->push_back('\n');
  return Status::Ok();
}

int RunTokenize(const CommandLine& args) {
  const std::string dir = args.GetOr("tokenizer", tokenizer::DefaultTokenizerDir());
  auto tok = Tokenizer::Load(dir);
  if (!tok.ok()) return ReportStatus("tokenize", tok.status());
  const bool decode = args.Has("decode");
  tokenizer::EncodeOptions encode_options;
  encode_options.add_bos = args.Has("add-bos");
  encode_options.parse_special_tokens = !args.Has("no-special");
  tokenizer::DecodeOptions decode_options;
  decode_options.skip_special_tokens = args.Has("skip-special-tokens");

  std::ios::sync_with_stdio(false);
  std::string line, out;
  int64_t line_no = 0;
  while (std::getline(std::cin, line)) {
    ++line_no;
    if (IsBlank(line)) continue;
    out.clear();
    Status s = decode ? DecodeLine(**tok, line, decode_options, &out)
                      : EncodeLine(**tok, line, encode_options, &out);
    if (!s.ok()) return ReportStatus("tokenize", s.WithContext("line " + std::to_string(line_no)));
    std::fwrite(out.data(), 1, out.size(), stdout);
    std::fflush(stdout);  // callers may drive this interactively, one line at a time
  }
  return 0;
}

}  // namespace

PDSERVE_REGISTER_COMMAND(tokenize, "tokenize", "JSON strings -> id arrays per line (--decode: the reverse)",
                         "[--tokenizer DIR] [--decode] [options] < lines",
                         "Encodes one JSON string per stdin line into a JSON array of token ids, or with --decode\n"
                         "decodes one JSON array of ids per line into a JSON string.",
                         ({{"tokenizer", "DIR", "tokenizer.json + tokenizer_config.json (default: the bundled DeepSeek-V3 one)"},
                           {"decode", "", "ids -> text"},
                           {"add-bos", "", "encode: prepend the BOS token"},
                           {"skip-special-tokens", "", "decode: drop special tokens"},
                           {"no-special", "", "encode: treat special-token text as plain text"}}),
                         0, RunTokenize);

}  // namespace pdserve::cli
