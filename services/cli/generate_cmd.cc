// `pdserve generate --model DIR (--prompt-ids 0,15,7 | --prompt TEXT [--tokenizer DIR])
//  --max-new-tokens N [--dump-logits F.npy]
//  [--dump-dir DIR] [--force-topk topk.npy] [--threads N] [--plan cp=2,ep=2 | --plan-file F]
//  [--kv-format fp8|bf16|int8] [--index-format fp8|int8]`:
// greedy decoding. Prints {"prompt_tokens":[...],"output_tokens":[...]} as one JSON line.
//
// Under mpirun with a parallel plan (docs/parallel.md) the model runs across the ranks; rank 0
// prints the JSON. --prompt-ids may then list several prompts separated by ';' (prompt i goes to
// DP unit i % dp), one JSON line each. MPI is initialized only with a plan or under mpirun, so
// the single-process command needs no MPI launcher. A bad plan stops every rank at start with
// "rank r/n: generate: ..." and exit status 1. --dump-dir works under a plan too: the dumps are
// gathered to rank 0, which writes DIR (one prompt) or DIR/prompt-<i> (several), in the
// single-process layout (model/greedy_run.h); --dump-logits and --force-topk are single-process.
// --kv-format / --index-format pick the KV cache's latent and indexer-key storage (int8 = the
// C8 latent cache / the A8C8 indexer, docs/quantization.md). The accuracy tests' deliberately
// broken forward is not reachable from here: the test-only pdserve-numerics-fault binary
// (services/testing/numerics_fault/) switches it on.
// --profile (or PDSERVE_PROFILE=1 in the environment) prints to stderr the share of step time
// per op for the prefill and the decode steps (model/profile_ops.h; rank 0's under a plan).
#include <cstdio>
#include <cstdlib>

#include <nlohmann/json.hpp>

#include "comm/mpi_environment.h"
#include "comm/mpi_status.h"
#include "common/npy.h"
#include "model/greedy_run.h"
#include "model/kv_layout.h"
#include "model/parallel_launch.h"
#include "model/profile_ops.h"
#include "services/cli/command.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/tokenizer_paths.h"

namespace pdserve::cli {
namespace {

// Launched by mpirun (Open MPI, or a PMI-based launcher) even without --plan.
bool UnderMpiLauncher() {
  return std::getenv("OMPI_COMM_WORLD_SIZE") != nullptr || std::getenv("PMI_SIZE") != nullptr;
}

bool WantProfile(const CommandLine& args) {
  const char* env = std::getenv("PDSERVE_PROFILE");
  return args.Has("profile") || (env != nullptr && *env != '\0' && std::string(env) != "0");
}

Result<model::KvCacheFormats> ParseKvFormats(const CommandLine& args) {
  model::KvCacheFormats kv;
  PDSERVE_ASSIGN_OR_RETURN(kv.latent, model::ParseLatentFormat(args.GetOr("kv-format", "fp8")));
  PDSERVE_ASSIGN_OR_RETURN(kv.index, model::ParseIndexFormat(args.GetOr("index-format", "fp8")));
  return kv;
}

Status GenerateParallel(const CommandLine& args, const std::string& dir, const std::vector<std::vector<int32_t>>& prompts,
                        tokenizer::Tokenizer* tok) {
  for (const char* unsupported : {"dump-logits", "force-topk"})
    if (args.Has(unsupported))
      return Status::InvalidArgument(std::string("--") + unsupported + " is single-process only (no --plan)");
  model::ParallelGenerateOptions o;
  o.model_dir = dir;
  o.prompts = prompts;
  o.dumps = args.Has("dump-dir");
  PDSERVE_ASSIGN_OR_RETURN(o.kv, ParseKvFormats(args));
  int world_rank = 0;
  PDSERVE_MPI_RETURN_IF_ERROR(MPI_Comm_rank(MPI_COMM_WORLD, &world_rank), "MPI_Comm_rank");
  if (auto file = args.Get("plan-file")) {
    PDSERVE_ASSIGN_OR_RETURN(o.plan, comm::ParallelPlan::LoadFile(*file));
  } else if (auto text = args.Get("plan")) {
    PDSERVE_ASSIGN_OR_RETURN(o.plan, comm::ParallelPlan::FromString(*text));
  }
  PDSERVE_ASSIGN_OR_RETURN(o.max_new, args.GetInt("max-new-tokens", 16));
  PDSERVE_ASSIGN_OR_RETURN(int64_t threads, args.GetInt("threads", 1));
  if (o.max_new < 0) return Status::InvalidArgument("--max-new-tokens must be >= 0");
  o.threads = static_cast<int>(std::max<int64_t>(1, threads));
  o.profile = WantProfile(args);
  PDSERVE_ASSIGN_OR_RETURN(model::ParallelGenerateResult r, model::ParallelGenerate(o));
  if (r.world_rank != 0) return Status::Ok();
  if (o.profile) {
    std::fprintf(stderr, "op profile, rank 0 (%s):\n%s", r.describe.c_str(), r.profile_table.c_str());
    const comm::EpOverlap& e = r.ep_overlap;
    if (e.exchanges > 0)
      std::fprintf(stderr,
                   "EP exchanges on rank 0: %lld (%lld seen complete during the shared expert), in flight %.3f ms, "
                   "waited for %.3f ms (%.0f%% of their time in flight overlapped compute)\n",
                   static_cast<long long>(e.exchanges), static_cast<long long>(e.completed_in_progress),
                   e.in_flight_seconds * 1e3, e.exposed_seconds * 1e3,
                   e.in_flight_seconds > 0 ? 100.0 * (1.0 - e.exposed_seconds / e.in_flight_seconds) : 0.0);
  }
  if (auto dump = args.Get("dump-dir")) {
    PDSERVE_ASSIGN_OR_RETURN(model::ModelConfig cfg, model::ModelConfig::Load(dir + "/config.json"));
    for (size_t i = 0; i < prompts.size(); ++i)
      PDSERVE_RETURN_IF_ERROR(model::WriteDump(prompts.size() == 1 ? *dump : *dump + "/prompt-" + std::to_string(i),
                                               cfg, r.runs[i]));
  }
  for (size_t i = 0; i < prompts.size(); ++i) {
    nlohmann::json j = {{"prompt_tokens", prompts[i]}, {"output_tokens", r.outputs[i]}};
    if (tok) {
      std::vector<int32_t> known;
      for (int32_t id : r.outputs[i])
        if (id < tok->id_limit()) known.push_back(id);
      PDSERVE_ASSIGN_OR_RETURN(std::string text, tok->Decode(known));
      j["output_text"] = text;
    }
    std::printf("%s\n", j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
  }
  if (args.Has("timing"))
    std::fprintf(stderr, "plan %s: load %.3f s, run %.3f s (%lld steps, decode %.3f s over %lld steps), comm %.3f s on rank 0\n",
                 o.plan.ToString().c_str(), r.load_seconds, r.stats.seconds, static_cast<long long>(r.stats.steps),
                 r.stats.decode_seconds, static_cast<long long>(r.stats.decode_steps), r.comm_seconds);
  return Status::Ok();
}

Status Generate(const CommandLine& args) {
  PDSERVE_ASSIGN_OR_RETURN(std::string dir, args.Require("model"));
  std::vector<int32_t> prompt;
  std::unique_ptr<tokenizer::Tokenizer> tok;
  if (args.Has("prompt") == args.Has("prompt-ids"))
    return Status::InvalidArgument("give exactly one of --prompt TEXT or --prompt-ids 0,15,7,...");
  if (auto text = args.Get("prompt")) {
    // The text is encoded as is (no BOS added, like the tokenizer package's encode()).
    PDSERVE_ASSIGN_OR_RETURN(tok, tokenizer::Tokenizer::Load(args.GetOr("tokenizer", tokenizer::DefaultTokenizerDir())));
    PDSERVE_ASSIGN_OR_RETURN(prompt, tok->Encode(*text));
    if (prompt.empty()) return Status::InvalidArgument("--prompt encodes to no tokens");
  } else if (const std::string ids = *args.Get("prompt-ids"); ids.find(';') != std::string::npos) {
    // Several prompts: parallel runs only (each DP unit takes its share).
    if (!args.Has("plan") && !args.Has("plan-file"))
      return Status::InvalidArgument("several ';'-separated prompts need --plan");
    std::vector<std::vector<int32_t>> prompts;
    size_t i = 0;
    while (i <= ids.size()) {
      size_t j = ids.find(';', i);
      if (j == std::string::npos) j = ids.size();
      PDSERVE_ASSIGN_OR_RETURN(auto p, ParseTokenIds(ids.substr(i, j - i)));
      prompts.push_back(std::move(p));
      i = j + 1;
    }
    return GenerateParallel(args, dir, prompts, nullptr);
  } else {
    PDSERVE_ASSIGN_OR_RETURN(prompt, ParseTokenIds(ids));
  }
  if (args.Has("plan") || args.Has("plan-file") || UnderMpiLauncher()) return GenerateParallel(args, dir, {prompt}, tok.get());
  PDSERVE_ASSIGN_OR_RETURN(int64_t max_new, args.GetInt("max-new-tokens", 16));
  PDSERVE_ASSIGN_OR_RETURN(int64_t threads, args.GetInt("threads", 0));
  if (max_new < 0) return Status::InvalidArgument("--max-new-tokens must be >= 0");
  ThreadPool own_pool(threads > 0 ? static_cast<int>(threads) : ThreadPool::Default().n_threads());
  PDSERVE_ASSIGN_OR_RETURN(auto model, model::Model::Load(dir, &own_pool));
  const auto& cfg = model->config();
  const int64_t S = static_cast<int64_t>(prompt.size()), L = cfg.num_hidden_layers, K = cfg.index_topk;

  std::vector<int32_t> forced;
  const std::vector<int32_t>* forced_topk = nullptr;
  PDSERVE_ASSIGN_OR_RETURN(model::KvCacheFormats kv, ParseKvFormats(args));
  if (auto f = args.Get("force-topk")) {
    PDSERVE_ASSIGN_OR_RETURN(NpyArray arr, ReadNpy(*f));
    if (arr.descr != "<i4" || arr.shape != std::vector<int64_t>{L, S, K})
      return Status::InvalidArgument("--force-topk wants int32 [n_layers, prompt_len, index_topk]", *f);
    forced.assign(arr.i32(), arr.i32() + arr.numel());
    forced_topk = &forced;
  }
  OpProfile profile = model::MakeForwardProfile();
  const bool want_profile = WantProfile(args);
  PDSERVE_ASSIGN_OR_RETURN(model::GreedyRun run, model::RunGreedy(*model, prompt, max_new, forced_topk, kv,
                                                                  want_profile ? &profile : nullptr));
  if (want_profile) std::fprintf(stderr, "op profile (%d threads):\n%s", own_pool.n_threads(), profile.Table().c_str());
  if (auto f = args.Get("dump-logits"))
    PDSERVE_RETURN_IF_ERROR(WriteNpyF32(*f, run.prefill_logits.data(), {cfg.vocab_size}));
  if (auto dir = args.Get("dump-dir")) PDSERVE_RETURN_IF_ERROR(model::WriteDump(*dir, cfg, run));
  nlohmann::json j = {{"prompt_tokens", prompt}, {"output_tokens", run.output}};
  if (tok) {
    // Ids past the tokenizer's vocabulary (the embedding is padded) decode as nothing.
    std::vector<int32_t> known;
    for (int32_t id : run.output)
      if (id < tok->id_limit()) known.push_back(id);
    PDSERVE_ASSIGN_OR_RETURN(std::string text, tok->Decode(known));
    j["output_text"] = text;
  }
  std::printf("%s\n", j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
  if (args.Has("timing"))
    std::fprintf(stderr, "prefill %.3f s (%lld tokens), decode %.3f s (%.2f ms/token)\n", run.prefill_seconds,
                 static_cast<long long>(S), run.decode_seconds,
                 run.output.size() > 1 ? run.decode_seconds * 1e3 / static_cast<double>(run.output.size() - 1) : 0.0);
  return Status::Ok();
}

int RunGenerate(const CommandLine& args) {
  if (!args.Has("plan") && !args.Has("plan-file") && !UnderMpiLauncher())
    return ReportStatus("generate", Generate(args));
  // Multi-rank: every rank reports its own outcome with its rank, and MPI_Finalize (collective)
  // runs before anyone exits, so each rank's reason is printed before mpirun tears the job down.
  auto env = comm::MpiEnvironment::Init(nullptr, nullptr);
  if (!env.ok()) return ReportStatus("generate", env.status());
  const Status s = Generate(args);
  if (!s.ok()) std::fprintf(stderr, "%s: pdserve generate: %s\n", comm::RankTag().c_str(), s.ToString().c_str());
  std::fflush(stdout);
  std::fflush(stderr);
  env->reset();
  return s.ok() ? 0 : 1;
}

}  // namespace
PDSERVE_REGISTER_COMMAND(generate, "generate", "greedy generation on one process (or under mpirun with a plan)",
                         "--model DIR (--prompt-ids 0,15,7 | --prompt TEXT) --max-new-tokens N [options]",
                         "Greedy decoding; prints {\"prompt_tokens\":[...],\"output_tokens\":[...]} as one JSON line.\n"
                         "Under mpirun with --plan the model runs across the ranks (docs/parallel.md); --prompt-ids\n"
                         "may then list several prompts separated by ';'. --prompt needs a model whose vocabulary\n"
                         "covers the tokenizer (make-model --vocab 129280).",
                         ({{"model", "DIR", "checkpoint directory", false, true},
                           {"prompt", "TEXT", "prompt text (tokenized with --tokenizer)"},
                           {"prompt-ids", "IDS", "prompt token ids, e.g. 0,15,7 (';' between prompts under a plan)"},
                           {"tokenizer", "DIR", "tokenizer directory (default: the bundled DeepSeek-V3 one)"},
                           {"max-new-tokens", "N", "tokens to generate"},
                           {"dump-logits", "F.npy", "write the prefill logits (single process)"},
                           {"dump-dir", "DIR", "write the layer-by-layer accuracy dump (pdserve compare)"},
                           {"force-topk", "F.npy", "use these indexer top-k sets (accuracy tests)"},
                           {"threads", "N", "compute threads (0: all cores)"},
                           {"plan", "PLAN", "parallel plan, e.g. cp=2,ep=2 (under mpirun)"},
                           {"plan-file", "F", "parallel plan from a YAML file"},
                           {"kv-format", "F", "KV latent storage: fp8 (default) | bf16 | int8"},
                           {"index-format", "F", "indexer key storage: fp8 (default) | int8"},
                           {"timing", "", "print prefill/decode timings on stderr"},
                           {"profile", "", "print the share of step time per op on stderr (also PDSERVE_PROFILE=1)"}}),
                         0, RunGenerate);
}  // namespace pdserve::cli
