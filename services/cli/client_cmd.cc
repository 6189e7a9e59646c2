// `pdserve client --endpoint tcp://HOST:PORT (--prompt TEXT | --prompt-ids 1,2,3 | --chat TEXT)
//   [--model NAME] [--max-tokens N] [--temperature X] [--top-p X] [--top-k N] [--seed N]
//   [--stop STR] [--ignore-eos] [--json] [--timeout-ms N] [--api-key KEY | --api-key-file PATH]
//   [--curve-server-key-file ROUTER.public [--curve-secret-key-file CLIENT.secret]]`:
// sends one request to the router's ZeroMQ request API (docs/request-api.md) and streams the
// text to stdout as it arrives; usage and the finish reason go to stderr. With --json it prints
// one JSON line per event instead ({"tokens", "text", "finish_reason", "usage"}). Exit status 1
// with the router's error (type, code, param) when the request fails. --api-key(-file): the key
// for a router with api_keys_file (a file keeps it out of `ps` and shell history); the CURVE
// files: for a router with request_curve_secret_key_file (no secret key file: a fresh key pair).
#include <cstdio>
#include <cstdlib>

#include <nlohmann/json.hpp>

#include "services/cli/command.h"
#include "services/client/request_client.h"

namespace pdserve::cli {
namespace {

namespace api = services::api;

Result<double> ParseDouble(const Args& args, const std::string& key) {
  const std::string v = args.Get(key).value();
  char* end = nullptr;
  const double x = std::strtod(v.c_str(), &end);
  if (v.empty() || *end != '\0') return Status::InvalidArgument("--" + key + " wants a number, got '" + v + "'");
  return x;
}

Status Run(const std::vector<std::string>& argv) {
  PDSERVE_ASSIGN_OR_RETURN(
      Args args, Args::Parse(argv,
                             {"endpoint", "prompt", "prompt-ids", "chat", "model", "max-tokens", "temperature",
                              "top-p", "top-k", "seed", "stop", "timeout-ms", "api-key", "api-key-file",
                              "curve-server-key-file", "curve-secret-key-file"},
                             {"ignore-eos", "json"}));
  PDSERVE_ASSIGN_OR_RETURN(std::string endpoint, args.Require("endpoint"));
  api::Submit req;
  req.model = args.GetOr("model", "pdserve");
  const int given = args.Has("prompt") + args.Has("prompt-ids") + args.Has("chat");
  if (given != 1) return Status::InvalidArgument("give exactly one of --prompt, --prompt-ids, --chat");
  if (auto p = args.Get("prompt")) {
    req.kind = api::PromptKind::kText;
    req.prompt_text = *p;
  } else if (auto ids = args.Get("prompt-ids")) {
    req.kind = api::PromptKind::kTokenIds;
    PDSERVE_ASSIGN_OR_RETURN(req.prompt_ids, ParseTokenIds(*ids));
  } else {
    req.kind = api::PromptKind::kChat;
    req.messages.push_back({"user", args.Get("chat").value(), {}});
  }
  if (args.Has("max-tokens")) {
    PDSERVE_ASSIGN_OR_RETURN(int64_t n, args.GetInt("max-tokens", 0));
    req.sampling.max_tokens = n;
  }
  if (args.Has("temperature")) {
    PDSERVE_ASSIGN_OR_RETURN(req.sampling.temperature, ParseDouble(args, "temperature"));
  }
  if (args.Has("top-p")) {
    PDSERVE_ASSIGN_OR_RETURN(req.sampling.top_p, ParseDouble(args, "top-p"));
  }
  if (args.Has("top-k")) {
    PDSERVE_ASSIGN_OR_RETURN(req.sampling.top_k, args.GetInt("top-k", 0));
  }
  if (args.Has("seed")) {
    PDSERVE_ASSIGN_OR_RETURN(req.sampling.seed, args.GetInt("seed", 0));
  }
  if (auto s = args.Get("stop")) req.stop.push_back(*s);
  req.ignore_eos = args.Has("ignore-eos");
  const bool as_json = args.Has("json");
  client::ClientOptions options;
  PDSERVE_ASSIGN_OR_RETURN(int64_t timeout_ms, args.GetInt("timeout-ms", options.timeout.count()));
  if (timeout_ms <= 0) return Status::InvalidArgument("--timeout-ms must be > 0");
  options.timeout = std::chrono::milliseconds(timeout_ms);
  if (args.Has("api-key") && args.Has("api-key-file"))
    return Status::InvalidArgument("give --api-key or --api-key-file, not both");
  if (auto key = args.Get("api-key")) {
    if (key->empty()) return Status::InvalidArgument("--api-key is empty");
    options.api_key = *key;
  } else if (auto path = args.Get("api-key-file")) {
    PDSERVE_ASSIGN_OR_RETURN(options.api_key, client::ReadApiKeyFile(*path));
  }
  if (auto server_key = args.Get("curve-server-key-file")) {
    PDSERVE_ASSIGN_OR_RETURN(options.curve,
                             client::CurveClientOptions(*server_key, args.GetOr("curve-secret-key-file", "")));
  } else if (args.Has("curve-secret-key-file")) {
    return Status::InvalidArgument("--curve-secret-key-file needs --curve-server-key-file (the router's public key)");
  }

  PDSERVE_ASSIGN_OR_RETURN(auto client, client::RequestClient::Connect(endpoint, options));
  auto done = client->Generate(req, [&](const api::Output& o) {
    if (as_json) {
      nlohmann::json j = {{"tokens", o.tokens}, {"text", o.text}, {"finish_reason", api::FinishName(o.finish)}};
      if (o.finishing()) j["usage"] = {{"prompt_tokens", o.prompt_tokens}, {"completion_tokens", o.completion_tokens}};
      std::printf("%s\n", j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
    } else {
      std::fwrite(o.text.data(), 1, o.text.size(), stdout);
    }
    std::fflush(stdout);
    return true;
  });
  if (!done.ok()) return done.status();
  if (!as_json) {
    std::printf("\n");
    std::fprintf(stderr, "[%s] finish %s, %u prompt + %u completion tokens\n", done->tag.c_str(),
                 api::FinishName(done->finish), done->prompt_tokens, done->completion_tokens);
  }
  return Status::Ok();
}

}  // namespace

PDSERVE_REGISTER_COMMAND(client, "client", "stream one request through the router's ZeroMQ request API",
                         [](const std::vector<std::string>& args) { return ReportStatus("client", Run(args)); });

}  // namespace pdserve::cli
