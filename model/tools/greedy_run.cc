#include "model/tools/greedy_run.h"

#include <algorithm>
#include <chrono>
#include <filesystem>

#include <nlohmann/json.hpp>

#include "common/mapped_file.h"
#include "common/npy.h"
#include "model/profile_ops.h"

namespace pdserve::model {

int32_t GreedyToken(const std::vector<float>& logits) {
  int32_t best = 0;
  for (size_t i = 1; i < logits.size(); ++i)
    if (logits[i] > logits[static_cast<size_t>(best)]) best = static_cast<int32_t>(i);
  return best;
}

Result<GreedyRun> RunGreedy(const Model& model, const std::vector<int32_t>& prompt, int64_t max_new,
                            const std::vector<int32_t>* forced_topk, const KvCacheFormats& kv, OpProfile* profile) {
  const ModelConfig& cfg = model.config();
  GreedyRun run;
  run.prompt = prompt;
  SequenceKvCache cache(cfg, 64, kv.latent, kv.index);
  std::vector<float> logits(static_cast<size_t>(cfg.vocab_size));
  ForwardOptions opt;
  opt.trace = &run.prefill;
  opt.forced_topk = forced_topk;
  const auto t0 = std::chrono::steady_clock::now();
  {
    OpProfileStep profile_step(profile, kPhasePrefill);
    PDSERVE_RETURN_IF_ERROR(model.Forward(prompt.data(), static_cast<int64_t>(prompt.size()), &cache, logits.data(), opt));
  }
  const auto t1 = std::chrono::steady_clock::now();
  run.prefill_logits = logits;
  ForwardTrace step_trace;
  ForwardOptions step_opt;
  step_opt.trace = &step_trace;
  for (int64_t step = 0; step < max_new; ++step) {
    // A decode step's profile: the argmax of the previous logits, then the forward.
    OpProfileStep profile_step(step + 1 < max_new ? profile : nullptr, kPhaseDecode);
    OpScope op_scope(kOpSampling);
    run.step_logits.insert(run.step_logits.end(), logits.begin(), logits.end());
    const int32_t next = GreedyToken(logits);
    run.output.push_back(next);
    if (step + 1 == max_new) break;
    op_scope.Switch(kOpOther);
    PDSERVE_RETURN_IF_ERROR(model.Forward(&next, 1, &cache, logits.data(), step_opt));
    run.topk_decode.insert(run.topk_decode.end(), step_trace.topk.begin(), step_trace.topk.end());
  }
  const auto t2 = std::chrono::steady_clock::now();
  run.prefill_seconds = std::chrono::duration<double>(t1 - t0).count();
  run.decode_seconds = std::chrono::duration<double>(t2 - t1).count();
  return run;
}

Status WriteDump(const std::string& dir, const ModelConfig& cfg, const GreedyRun& run) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return Status::Internal("cannot create dump directory: " + ec.message(), dir);
  const int64_t L = cfg.num_hidden_layers, S = static_cast<int64_t>(run.prompt.size()), K = cfg.index_topk;
  const int64_t steps = static_cast<int64_t>(run.output.size());
  PDSERVE_RETURN_IF_ERROR(WriteNpyF32(dir + "/hidden.npy", run.prefill.hidden.data(), {L + 1, S, cfg.hidden_size}));
  PDSERVE_RETURN_IF_ERROR(WriteNpyF32(dir + "/index_scores.npy", run.prefill.index_scores.data(), {L, S, S}));
  PDSERVE_RETURN_IF_ERROR(WriteNpyI32(dir + "/topk.npy", run.prefill.topk.data(), {L, S, K}));
  PDSERVE_RETURN_IF_ERROR(WriteNpyF32(dir + "/step_logits.npy", run.step_logits.data(), {steps, cfg.vocab_size}));
  PDSERVE_RETURN_IF_ERROR(
      WriteNpyI32(dir + "/topk_decode.npy", run.topk_decode.data(), {std::max<int64_t>(steps - 1, 0), L, K}));
  // Routed experts per prompt row, ascending as the reference writes them (-1 rows: dense).
  const int64_t top_k = cfg.num_experts_per_tok;
  std::vector<int32_t> experts = run.prefill.experts;
  experts.resize(static_cast<size_t>(L * S * top_k), -1);
  for (int64_t r = 0; r < L * S; ++r) std::sort(experts.begin() + r * top_k, experts.begin() + (r + 1) * top_k);
  for (int64_t r = 0; r < L * S; ++r)  // sorting put -1 first; the reference pads at the end
    std::rotate(experts.begin() + r * top_k,
                std::find_if(experts.begin() + r * top_k, experts.begin() + (r + 1) * top_k, [](int32_t e) { return e >= 0; }),
                experts.begin() + (r + 1) * top_k);
  PDSERVE_RETURN_IF_ERROR(WriteNpyI32(dir + "/experts.npy", experts.data(), {L, S, top_k}));
  nlohmann::json index = {{"prompt_tokens", run.prompt}, {"output_tokens", run.output}, {"producer", "pdserve"}};
  return WriteStringToFile(dir + "/index.json", index.dump(1));
}

}  // namespace pdserve::model
