// `pdserve chat-template`: renders chat requests into prompt text, one JSON object per line:
//   {"messages": [...], "add_generation_prompt": true, "thinking": false}
// prints the prompt as a JSON string (with --tokenize, as a JSON array of ids instead).
// Blank lines are skipped; the first bad line stops the command with exit code 1.
#include <cstdio>
#include <iostream>
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "common/mapped_file.h"
#include "services/cli/command.h"
#include "tokenizer/chat_request.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/tokenizer_paths.h"

namespace pdserve::cli {
namespace {

using tokenizer::ChatTemplate;
using tokenizer::Tokenizer;
using tokenizer::TokenizerConfig;

Result<TokenizerConfig> LoadConfig(const std::string& dir) {
  auto text = ReadFileToString(dir + "/tokenizer_config.json");
  if (!text.ok()) {
    return Status(text.status().code(),
                  "cannot read " + dir + "/tokenizer_config.json: " + text.status().message());
  }
  return TokenizerConfig::FromJsonText(*text);
}

int RunChatTemplate(const CommandLine& args) {
  const std::string dir = args.GetOr("tokenizer", tokenizer::DefaultTokenizerDir());
  // Rendering needs only tokenizer_config.json; the 8 MB tokenizer.json only for --tokenize.
  std::unique_ptr<Tokenizer> tok;
  TokenizerConfig config;
  if (args.Has("tokenize")) {
    auto loaded = Tokenizer::Load(dir);
    if (!loaded.ok()) return ReportStatus("chat-template", loaded.status());
    tok = std::move(loaded).value();
    config = tok->config();
  } else {
    auto loaded = LoadConfig(dir);
    if (!loaded.ok()) return ReportStatus("chat-template", loaded.status());
    config = std::move(loaded).value();
  }
  auto chat_template = ChatTemplate::FromConfig(config);
  if (!chat_template.ok()) return ReportStatus("chat-template", chat_template.status());

  std::ios::sync_with_stdio(false);
  std::string line, out;
  int64_t line_no = 0;
  while (std::getline(std::cin, line)) {
    ++line_no;
    if (line.find_first_not_of(" \t\r\n") == std::string::npos) continue;
    auto fail = [&](const Status& s) {
      return ReportStatus("chat-template", s.WithContext("line " + std::to_string(line_no)));
    };
    auto request = tokenizer::ParseChatRequest(line);
    if (!request.ok()) return fail(request.status());
    auto prompt = chat_template->Render(request->messages, request->options);
    if (!prompt.ok()) return fail(prompt.status());
    if (tok) {
      auto ids = tok->Encode(*prompt);
      if (!ids.ok()) return fail(ids.status());
      out = nlohmann::json(*ids).dump();
    } else {
      out = nlohmann::json(*prompt).dump();
    }
    out.push_back('\n');
    std::fwrite(out.data(), 1, out.size(), stdout);
    std::fflush(stdout);
  }
  return 0;
}

}  // namespace

PDSERVE_REGISTER_COMMAND(chat_template, "chat-template", "chat request JSON lines -> rendered prompt strings",
                         "[--tokenizer DIR] [--tokenize] < requests.jsonl",
                         "Reads one chat request per line from stdin, e.g.\n"
                         "  {\"messages\": [{\"role\": \"user\", \"content\": \"Hi\"}], \"add_generation_prompt\": true,\n"
                         "   \"thinking\": false}\n"
                         "and prints the rendered prompt as a JSON string (with --tokenize: a JSON array of ids).\n"
                         "add_generation_prompt (default true) ends the prompt with the assistant turn's opening;\n"
                         "thinking (default false) opens that turn in thinking mode (<think>).",
                         ({{"tokenizer", "DIR", "tokenizer_config.json (+ tokenizer.json for --tokenize)"},
                           {"tokenize", "", "print token ids instead of text"}}),
                         0, RunChatTemplate);

}  // namespace pdserve::cli
