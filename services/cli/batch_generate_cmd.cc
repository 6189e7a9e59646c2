// `pdserve batch-generate --model DIR --prompts "1,2,3;4,5,6" [--copies N] [--max-tokens N]
//  [--temperature T] [--top-k K] [--top-p P] [--min-p P] [--seed S] [--kv-gib G]
//  [--block-tokens B] [--kv-format fp8|bf16|int8] [--max-seqs N] [--step-tokens N]
//  [--chunk N] [--threads N] [--profile]`
// Runs every prompt (each `copies` times) concurrently through one colocated Engine
// (continuous batching, paged KV) and prints one JSON line per request, then the engine stats
// (with tokens/s) and, with --profile or PDSERVE_PROFILE=1, the op profile of its steps.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>

#include <nlohmann/json.hpp>

#include "engine/engine.h"
#include "model/profile_ops.h"
#include "services/cli/command.h"

namespace pdserve::cli {
namespace {

Result<std::vector<std::vector<int32_t>>> ParsePrompts(const std::string& s) {
  std::vector<std::vector<int32_t>> out(1);
  std::string num;
  auto flush = [&]() -> Status {
    if (num.empty()) return Status::Ok();
    char* end = nullptr;
    const long v = std::strtol(num.c_str(), &end, 10);
    if (*end != '\0' || v < 0 || v > INT32_MAX) return Status::InvalidArgument("--prompts: '" + num + "' is not a token id");
    out.back().push_back(static_cast<int32_t>(v));
    num.clear();
    return Status::Ok();
  };
  for (char ch : s) {
    if (ch == ',' || ch == ';') {
      PDSERVE_RETURN_IF_ERROR(flush());
      if (ch == ';') out.emplace_back();
    } else {
      num.push_back(ch);
    }
  }
  PDSERVE_RETURN_IF_ERROR(flush());
  for (const auto& p : out)
    if (p.empty()) return Status::InvalidArgument("--prompts has an empty prompt");
  return out;
}

Status BatchGenerate(const CommandLine& args) {
  engine::EngineOptions eo;
  PDSERVE_ASSIGN_OR_RETURN(eo.model_dir, args.Require("model"));
  PDSERVE_ASSIGN_OR_RETURN(std::string prompts_text, args.Require("prompts"));
  PDSERVE_ASSIGN_OR_RETURN(auto prompts, ParsePrompts(prompts_text));
  PDSERVE_ASSIGN_OR_RETURN(int64_t copies, args.GetInt("copies", 1));
  PDSERVE_ASSIGN_OR_RETURN(int64_t max_tokens, args.GetInt("max-tokens", 16));
  PDSERVE_ASSIGN_OR_RETURN(int64_t top_k, args.GetInt("top-k", 0));
  PDSERVE_ASSIGN_OR_RETURN(int64_t seed, args.GetInt("seed", -1));
  PDSERVE_ASSIGN_OR_RETURN(double temperature, args.GetDouble("temperature", 0.0));
  PDSERVE_ASSIGN_OR_RETURN(double top_p, args.GetDouble("top-p", 1.0));
  PDSERVE_ASSIGN_OR_RETURN(double min_p, args.GetDouble("min-p", 0.0));
  PDSERVE_ASSIGN_OR_RETURN(eo.kv_cache_gib, args.GetDouble("kv-gib", 1.0));
  PDSERVE_ASSIGN_OR_RETURN(eo.block_tokens, args.GetInt("block-tokens", 64));
  PDSERVE_ASSIGN_OR_RETURN(eo.scheduler.max_num_seqs, args.GetInt("max-seqs", 64));
  PDSERVE_ASSIGN_OR_RETURN(eo.scheduler.max_step_tokens, args.GetInt("step-tokens", 512));
  PDSERVE_ASSIGN_OR_RETURN(eo.scheduler.prefill_chunk, args.GetInt("chunk", 256));
  PDSERVE_ASSIGN_OR_RETURN(int64_t threads, args.GetInt("threads", 0));
  PDSERVE_ASSIGN_OR_RETURN(eo.latent_format, model::ParseLatentFormat(args.GetOr("kv-format", "fp8")));
  if (copies < 1) return Status::InvalidArgument("--copies must be >= 1");
  eo.threads = static_cast<int>(threads);
  const char* profile_env = std::getenv("PDSERVE_PROFILE");
  OpProfile profile = model::MakeForwardProfile();
  const bool want_profile =
      args.Has("profile") || (profile_env != nullptr && *profile_env != '\0' && std::string(profile_env) != "0");
  if (want_profile) eo.profile = &profile;
  PDSERVE_ASSIGN_OR_RETURN(auto eng, engine::Engine::Create(eo));

  std::mutex mu;
  std::map<engine::RequestId, nlohmann::json> results;
  std::vector<engine::RequestId> order;
  const auto t0 = std::chrono::steady_clock::now();
  for (int64_t c = 0; c < copies; ++c)
    for (size_t i = 0; i < prompts.size(); ++i) {
      engine::RequestOptions ro;
      ro.sampling.max_tokens = static_cast<int32_t>(max_tokens);
      ro.sampling.temperature = static_cast<float>(temperature);
      ro.sampling.top_k = static_cast<int32_t>(top_k);
      ro.sampling.top_p = static_cast<float>(top_p);
      ro.sampling.min_p = static_cast<float>(min_p);
      if (seed >= 0) ro.sampling.seed = static_cast<uint64_t>(seed) + static_cast<uint64_t>(c * 1000003 + i);
      ro.on_event = [&mu, &results](const engine::TokenEvent& ev) {
        std::lock_guard<std::mutex> lock(mu);
        nlohmann::json& j = results[ev.id];
        if (ev.token >= 0) j["output_tokens"].push_back(ev.token);
        if (ev.finished) j["finish_reason"] = engine::FinishReasonName(ev.reason);
      };
      PDSERVE_ASSIGN_OR_RETURN(engine::RequestId id, eng->AddRequest(prompts[i], ro));
      std::lock_guard<std::mutex> lock(mu);
      results[id]["prompt"] = i;
      order.push_back(id);
    }
  while (!eng->Idle()) eng->Step();
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  for (engine::RequestId id : order) std::printf("%s\n", results[id].dump().c_str());
  const engine::EngineStats s = eng->Stats();
  nlohmann::json st = {{"seconds", secs},           {"steps", s.steps},
                       {"generated_tokens", s.generated_tokens}, {"prompt_rows", s.prompt_rows},
                       {"preemptions", s.preemptions}, {"overhead_share", s.OverheadShare()},
                       {"blocks_total", s.blocks_total},
                       {"tokens_per_s", secs > 0 ? static_cast<double>(s.generated_tokens) / secs : 0.0}};
  std::fprintf(stderr, "%s\n", st.dump().c_str());
  if (want_profile) std::fprintf(stderr, "op profile:\n%s", profile.Table().c_str());
  return Status::Ok();
}

int RunBatchGenerate(const CommandLine& args) { return ReportStatus("batch-generate", BatchGenerate(args)); }

}  // namespace
PDSERVE_REGISTER_COMMAND(batch_generate, "batch-generate", "run prompts concurrently through the batching engine",
                         "--model DIR --prompts \"1,2,3;4,5,6\" [--copies N] [options]",
                         "Runs every prompt (each --copies times) concurrently through one colocated engine\n"
                         "(continuous batching, paged KV) and prints one JSON line per request, then the engine stats\n"
                         "(with tokens/s) and, with --profile or PDSERVE_PROFILE=1, the op profile of its steps.",
                         ({{"model", "DIR", "checkpoint directory", false, true},
                           {"prompts", "IDS", "prompts as token ids, ';' between prompts", false, true},
                           {"copies", "N", "run each prompt N times (default 1)"},
                           {"max-tokens", "N", "tokens to generate per request (default 16)"},
                           {"temperature", "T", "sampling temperature (default 0: greedy)"},
                           {"top-k", "K", "top-k sampling (0: off)"},
                           {"top-p", "P", "nucleus sampling (default 1)"},
                           {"min-p", "P", "min-p sampling (default 0)"},
                           {"seed", "S", "sampling seed (-1: random)"},
                           {"kv-gib", "G", "KV pool size in GiB (default 1)"},
                           {"block-tokens", "B", "tokens per KV block (default 64)"},
                           {"kv-format", "F", "fp8 (default) | bf16 | int8"},
                           {"max-seqs", "N", "batch limit (default 64)"},
                           {"step-tokens", "N", "token budget of one step (default 512)"},
                           {"chunk", "N", "prefill chunk (default 256)"},
                           {"threads", "N", "compute threads (0: all cores)"},
                           {"profile", "", "print the share of step time per op on stderr (also PDSERVE_PROFILE=1)"}}),
                         0, RunBatchGenerate);
}  // namespace pdserve::cli
