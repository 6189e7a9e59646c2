#include "model/tools/convert_accuracy.h"

#include <algorithm>
#include <cmath>

#include "model/model.h"
#include "model/tools/greedy_run.h"

namespace pdserve::model {

namespace {

double Cosine(const float* a, const float* b, int64_t n) {
  double ab = 0, aa = 0, bb = 0;
  for (int64_t i = 0; i < n; ++i) {
    ab += double(a[i]) * b[i];
    aa += double(a[i]) * a[i];
    bb += double(b[i]) * b[i];
  }
  return aa == 0 || bb == 0 ? (aa == bb ? 1.0 : 0.0) : ab / std::sqrt(aa * bb);
}


}  // namespace

Result<AccuracyReport> CompareW8A8(const std::string& reference_dir, const std::string& w8a8_dir,
                                   const std::vector<int32_t>& prompt, int64_t steps, ThreadPool* pool) {
  PDSERVE_ASSIGN_OR_RETURN(auto ref, Model::Load(reference_dir, pool));
  PDSERVE_ASSIGN_OR_RETURN(auto w8, Model::Load(w8a8_dir, pool));
  const ModelConfig& c = ref->config();
  const int64_t S = static_cast<int64_t>(prompt.size()), D = c.hidden_size, L = c.num_hidden_layers;
  AccuracyReport r;
  std::vector<float> la(static_cast<size_t>(c.vocab_size)), lb(la.size());
  SequenceKvCache ca(c), cb(w8->config());
  ForwardTrace ta, tb;
  ForwardOptions oa, ob;
  oa.trace = &ta;
  ob.trace = &tb;
  PDSERVE_RETURN_IF_ERROR(ref->Forward(prompt.data(), S, &ca, la.data(), oa));
  PDSERVE_RETURN_IF_ERROR(w8->Forward(prompt.data(), S, &cb, lb.data(), ob));
  for (int64_t l = 1; l <= L; ++l) {
    const double cs = Cosine(&ta.hidden[static_cast<size_t>(l * S * D)], &tb.hidden[static_cast<size_t>(l * S * D)], S * D);
    r.layer_cos.push_back(cs);
    r.min_layer_cos = std::min(r.min_layer_cos, cs);
  }
  r.logits_cos = Cosine(la.data(), lb.data(), c.vocab_size);
  const int64_t top_k = c.num_experts_per_tok;
  for (int64_t l = 0; l < L; ++l)
    for (int64_t t = 0; t < S; ++t) {
      const int32_t* ea = &ta.experts[static_cast<size_t>((l * S + t) * top_k)];
      const int32_t* eb = &tb.experts[static_cast<size_t>((l * S + t) * top_k)];
      for (int64_t j = 0; j < top_k; ++j) {
        if (ea[j] < 0) continue;  // dense layer
        ++r.expert_slots;
        r.expert_flips += std::find(ea, ea + top_k, eb[j]) == ea + top_k;
      }
    }
  {
    SequenceKvCache ci(w8->config());
    ForwardTrace ti;
    ForwardOptions oi;
    oi.trace = &ti;
    oi.forced_layer_inputs = &ta.hidden;
    std::vector<float> li(la.size());
    PDSERVE_RETURN_IF_ERROR(w8->Forward(prompt.data(), S, &ci, li.data(), oi));
    for (int64_t l = 1; l <= L; ++l) {
      const double cs = Cosine(&ta.hidden[static_cast<size_t>(l * S * D)], &ti.hidden[static_cast<size_t>(l * S * D)], S * D);
      r.isolated_layer_cos.push_back(cs);
      r.isolated_min_layer_cos = std::min(r.isolated_min_layer_cos, cs);
    }
  }
  {
    SequenceKvCache cp(w8->config());
    ForwardTrace tp;
    ForwardOptions op;
    op.trace = &tp;
    op.forced_topk = &ta.topk;
    op.forced_experts = &ta.experts;
    std::vector<float> lp(la.size());
    PDSERVE_RETURN_IF_ERROR(w8->Forward(prompt.data(), S, &cp, lp.data(), op));
    for (int64_t l = 1; l <= L; ++l) {
      const double cs = Cosine(&ta.hidden[static_cast<size_t>(l * S * D)], &tp.hidden[static_cast<size_t>(l * S * D)], S * D);
      r.pinned_layer_cos.push_back(cs);
      r.pinned_min_layer_cos = std::min(r.pinned_min_layer_cos, cs);
    }
    r.pinned_logits_cos = Cosine(la.data(), lp.data(), c.vocab_size);
  }

  // Teacher-forced greedy steps on the reference's tokens.
  std::vector<int32_t> ref_tokens;
  double sum_cos = 0;
  for (int64_t step = 0; step < steps; ++step) {
    const int32_t ta_tok = GreedyToken(la), tb_tok = GreedyToken(lb);
    r.top1_agree += ta_tok == tb_tok;
    const double cs = Cosine(la.data(), lb.data(), c.vocab_size);
    r.min_step_logits_cos = std::min(r.min_step_logits_cos, cs);
    sum_cos += cs;
    ref_tokens.push_back(ta_tok);
    PDSERVE_RETURN_IF_ERROR(ref->Forward(&ta_tok, 1, &ca, la.data()));
    PDSERVE_RETURN_IF_ERROR(w8->Forward(&ta_tok, 1, &cb, lb.data()));
  }
  r.steps = steps;
  r.mean_step_logits_cos = steps > 0 ? sum_cos / static_cast<double>(steps) : 1.0;

  // Free-running W8A8 greedy decoding from the same prompt.
  SequenceKvCache cf(w8->config());
  PDSERVE_RETURN_IF_ERROR(w8->Forward(prompt.data(), S, &cf, lb.data()));
  for (int64_t step = 0; step < steps; ++step) {
    const int32_t t = GreedyToken(lb);
    if (t != ref_tokens[static_cast<size_t>(step)]) break;
    ++r.free_run_prefix;
    PDSERVE_RETURN_IF_ERROR(w8->Forward(&t, 1, &cf, lb.data()));
  }
  return r;
}

}  // namespace pdserve::model
