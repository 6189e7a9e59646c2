// `pdserve generate --model DIR --prompt-ids 0,15,7 --max-new-tokens N [--dump-logits F.npy]
//  [--dump-dir DIR] [--force-topk topk.npy] [--threads N]`: greedy decoding on one process.
// Prints {"prompt_tokens":[...],"output_tokens":[...]} as one JSON line.
#include <chrono>
#include <cstdio>
#include <filesystem>

#include <nlohmann/json.hpp>

#include "common/npy.h"
#include "model/model.h"
#include "services/cli/command.h"

namespace pdserve::cli {
namespace {

Result<std::vector<int32_t>> ParseIds(const std::string& s) {
  std::vector<int32_t> ids;
  size_t i = 0;
  while (i < s.size()) {
    size_t j = s.find(',', i);
    if (j == std::string::npos) j = s.size();
    const std::string part = s.substr(i, j - i);
    char* end = nullptr;
    const long v = std::strtol(part.c_str(), &end, 10);
    if (part.empty() || *end != '\0' || v < 0 || v > INT32_MAX)
      return Status::InvalidArgument("--prompt-ids: '" + part + "' is not a token id");
    ids.push_back(static_cast<int32_t>(v));
    i = j + 1;
  }
  if (ids.empty()) return Status::InvalidArgument("--prompt-ids is empty");
  return ids;
}

int32_t Argmax(const std::vector<float>& v) {
  int32_t best = 0;
  for (size_t i = 1; i < v.size(); ++i)
    if (v[i] > v[static_cast<size_t>(best)]) best = static_cast<int32_t>(i);
  return best;
}

Status Generate(const Args& args) {
  PDSERVE_ASSIGN_OR_RETURN(std::string dir, args.Require("model"));
  PDSERVE_ASSIGN_OR_RETURN(std::string ids_text, args.Require("prompt-ids"));
  PDSERVE_ASSIGN_OR_RETURN(std::vector<int32_t> prompt, ParseIds(ids_text));
  PDSERVE_ASSIGN_OR_RETURN(int64_t max_new, args.GetInt("max-new-tokens", 16));
  PDSERVE_ASSIGN_OR_RETURN(int64_t threads, args.GetInt("threads", 0));
  if (max_new < 0) return Status::InvalidArgument("--max-new-tokens must be >= 0");
  ThreadPool own_pool(threads > 0 ? static_cast<int>(threads) : ThreadPool::Default().n_threads());
  PDSERVE_ASSIGN_OR_RETURN(auto model, model::Model::Load(dir, &own_pool));
  const auto& cfg = model->config();
  const int64_t S = static_cast<int64_t>(prompt.size()), L = cfg.num_hidden_layers, K = cfg.index_topk;

  std::vector<int32_t> forced;
  model::ForwardOptions opt;
  if (auto f = args.Get("force-topk")) {
    PDSERVE_ASSIGN_OR_RETURN(NpyArray arr, ReadNpy(*f));
    if (arr.descr != "<i4" || arr.shape != std::vector<int64_t>{L, S, K})
      return Status::InvalidArgument("--force-topk wants int32 [n_layers, prompt_len, index_topk]", *f);
    forced.assign(arr.i32(), arr.i32() + arr.numel());
    opt.forced_topk = &forced;
  }
  const auto dump_dir = args.Get("dump-dir");
  model::ForwardTrace trace;
  if (dump_dir) opt.trace = &trace;

  model::SequenceKvCache cache(cfg);
  std::vector<float> logits(static_cast<size_t>(cfg.vocab_size));
  std::vector<float> step_logits;
  std::vector<int32_t> topk_decode;
  const auto t0 = std::chrono::steady_clock::now();
  PDSERVE_RETURN_IF_ERROR(model->Forward(prompt.data(), S, &cache, logits.data(), opt));
  const auto t1 = std::chrono::steady_clock::now();
  if (auto f = args.Get("dump-logits"))
    PDSERVE_RETURN_IF_ERROR(WriteNpyF32(*f, logits.data(), {cfg.vocab_size}));
  if (dump_dir) {
    std::filesystem::create_directories(*dump_dir);
    PDSERVE_RETURN_IF_ERROR(WriteNpyF32(*dump_dir + "/hidden.npy", trace.hidden.data(), {L + 1, S, cfg.hidden_size}));
    PDSERVE_RETURN_IF_ERROR(WriteNpyF32(*dump_dir + "/index_scores.npy", trace.index_scores.data(), {L, S, S}));
    PDSERVE_RETURN_IF_ERROR(WriteNpyI32(*dump_dir + "/topk.npy", trace.topk.data(), {L, S, K}));
  }
  std::vector<int32_t> output;
  model::ForwardTrace step_trace;
  model::ForwardOptions step_opt;
  if (dump_dir) step_opt.trace = &step_trace;
  for (int64_t step = 0; step < max_new; ++step) {
    if (dump_dir) step_logits.insert(step_logits.end(), logits.begin(), logits.end());
    const int32_t next = Argmax(logits);
    output.push_back(next);
    if (step + 1 == max_new) break;
    PDSERVE_RETURN_IF_ERROR(model->Forward(&next, 1, &cache, logits.data(), step_opt));
    if (dump_dir) topk_decode.insert(topk_decode.end(), step_trace.topk.begin(), step_trace.topk.end());
  }
  const auto t2 = std::chrono::steady_clock::now();
  if (dump_dir) {
    const int64_t steps = static_cast<int64_t>(output.size());
    PDSERVE_RETURN_IF_ERROR(WriteNpyF32(*dump_dir + "/step_logits.npy", step_logits.data(), {steps, cfg.vocab_size}));
    PDSERVE_RETURN_IF_ERROR(WriteNpyI32(*dump_dir + "/topk_decode.npy", topk_decode.data(), {std::max<int64_t>(steps - 1, 0), L, K}));
    nlohmann::json index = {{"prompt_tokens", prompt}, {"output_tokens", output}, {"producer", "pdserve"}};
    PDSERVE_RETURN_IF_ERROR(WriteStringToFile(*dump_dir + "/index.json", index.dump(2)));
  }
  nlohmann::json j = {{"prompt_tokens", prompt}, {"output_tokens", output}};
  std::printf("%s\n", j.dump().c_str());
  const double prefill_s = std::chrono::duration<double>(t1 - t0).count();
  const double decode_s = std::chrono::duration<double>(t2 - t1).count();
  if (args.Has("timing"))
    std::fprintf(stderr, "prefill %.3f s (%lld tokens), decode %.3f s (%.2f ms/token)\n", prefill_s,
                 static_cast<long long>(S), decode_s,
                 output.size() > 1 ? decode_s * 1e3 / static_cast<double>(output.size() - 1) : 0.0);
  return Status::Ok();
}

int RunGenerate(const std::vector<std::string>& argv) {
  auto args = Args::Parse(argv, {"model", "prompt-ids", "max-new-tokens", "dump-logits", "dump-dir", "force-topk", "threads"},
                          {"timing"});
  if (!args.ok()) return ReportStatus("generate", args.status());
  return ReportStatus("generate", Generate(*args));
}

}  // namespace
PDSERVE_REGISTER_COMMAND(generate, "generate", "greedy generation on one process", RunGenerate);
}  // namespace pdserve::cli
