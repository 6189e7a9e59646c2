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

Status Run(const CommandLine& args) {
  PDSERVE_ASSIGN_OR_RETURN(std::string endpoint, args.Require("endpoint"));
  api::Submit req;
  req.model = args.GetOr("model", "");  // empty: the model the router serves
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
    PDSERVE_ASSIGN_OR_RETURN(req.sampling.temperature, args.GetDouble("temperature", 1.0, 0.0, 100.0));
  }
  if (args.Has("top-p")) {
    PDSERVE_ASSIGN_OR_RETURN(req.sampling.top_p, args.GetDouble("top-p", 1.0, 0.0, 1.0));
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
  PDSERVE_ASSIGN_OR_RETURN(int64_t timeout_ms, args.GetInt("timeout-ms", options.timeout.count(), 1));
  options.timeout = std::chrono::milliseconds(timeout_ms);
  PDSERVE_ASSIGN_OR_RETURN(int64_t connect_ms, args.GetInt("connect-timeout-ms", options.connect_timeout.count(), 1));
  options.connect_timeout = std::chrono::milliseconds(connect_ms);
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
  // ZeroMQ queues a request for an endpoint nobody listens on; a ping shows at once whether a
  // router answers there, instead of a request waiting out --timeout-ms.
  if (Status ping = client->Ping(options.connect_timeout); !ping.ok()) {
    return Status::Unavailable("no answer from a router at " + endpoint + " within " + std::to_string(connect_ms) +
                               " ms (is it running, and is this its request_endpoint?)");
  }
  auto done = client->Generate(req, [&](const api::Output& o) {
    if (as_json) {
      nlohmann::json j = {{"tokens", o.tokens}, {"text", o.text}, {"finish_reason", FinishReasonName(o.finish)}};
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
                 FinishReasonName(done->finish), done->prompt_tokens, done->completion_tokens);
  }
  return Status::Ok();
}

}  // namespace

PDSERVE_REGISTER_COMMAND(client, "client", "stream one request through the router's ZeroMQ request API",
                         "--endpoint tcp://HOST:PORT (--chat TEXT | --prompt TEXT | --prompt-ids 1,2,3) [options]",
                         "Sends one request to the router's ZeroMQ request API (docs/request-api.md) and streams the\n"
                         "text to stdout; usage and the finish reason go to stderr. Exit 1 with the router's error.",
                         ({{"endpoint", "ENDPOINT", "the router's request_endpoint, e.g. tcp://127.0.0.1:8001", false, true},
                           {"chat", "TEXT", "one user message, rendered with the chat template"},
                           {"prompt", "TEXT", "plain text prompt"},
                           {"prompt-ids", "IDS", "prompt token ids, e.g. 1,2,3"},
                           {"model", "NAME", "model name (default: the one the router serves)"},
                           {"max-tokens", "N", "tokens to generate (default: the router's default)"},
                           {"temperature", "T", "sampling temperature (0: greedy)"},
                           {"top-p", "P", "nucleus sampling"},
                           {"top-k", "K", "top-k sampling"},
                           {"seed", "S", "sampling seed"},
                           {"stop", "STR", "a stop string"},
                           {"ignore-eos", "", "keep generating past EOS"},
                           {"json", "", "one JSON line per event instead of text"},
                           {"timeout-ms", "N", "longest silence from the router during a request (default 60000)"},
                           {"connect-timeout-ms", "N", "longest wait for a connection (default 5000)"},
                           {"api-key", "KEY", "API key (router.api_keys_file)"},
                           {"api-key-file", "F", "file holding the API key"},
                           {"curve-server-key-file", "F", "the router's CURVE public key"},
                           {"curve-secret-key-file", "F", "this client's CURVE secret key"}}),
                         0, [](const CommandLine& args) { return ReportStatus("client", Run(args)); });

}  // namespace pdserve::cli
