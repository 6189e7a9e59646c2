#include "model/tools/dump_compare.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <set>
#include <iomanip>
#include <sstream>

#include <nlohmann/json.hpp>

#include "common/mapped_file.h"
#include "common/npy.h"

namespace pdserve::model {

namespace {

double Cosine(const float* a, const float* b, int64_t n, bool finite_only) {
  double ab = 0, aa = 0, bb = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (finite_only && (!std::isfinite(a[i]) || !std::isfinite(b[i]))) continue;
    ab += double(a[i]) * b[i];
    aa += double(a[i]) * a[i];
    bb += double(b[i]) * b[i];
  }
  if (aa == 0 && bb == 0) return 1.0;
  if (aa == 0 || bb == 0) return 0.0;
  return ab / std::sqrt(aa * bb);
}

// |A ∩ B| and max(|A|, |B|) of two -1 padded selection rows of K entries.
std::pair<int64_t, int64_t> SetOverlap(const int32_t* ra, const int32_t* rb, int64_t K) {
  std::set<int32_t> sa, sb;
  for (int64_t k = 0; k < K; ++k) {
    if (ra[k] >= 0) sa.insert(ra[k]);
    if (rb[k] >= 0) sb.insert(rb[k]);
  }
  int64_t same = 0;
  for (int32_t x : sa) same += static_cast<int64_t>(sb.count(x));
  return {same, static_cast<int64_t>(std::max(sa.size(), sb.size()))};
}

struct Dump {
  NpyArray hidden, index_scores, topk, step_logits;
  bool has_topk_decode = false;
  NpyArray topk_decode;
  NpyArray experts;  // optional: empty shape when the dump has none
  std::vector<int32_t> output;
};

Result<Dump> LoadDump(const std::string& dir) {
  Dump d;
  PDSERVE_ASSIGN_OR_RETURN(d.hidden, ReadNpy(dir + "/hidden.npy"));
  PDSERVE_ASSIGN_OR_RETURN(d.index_scores, ReadNpy(dir + "/index_scores.npy"));
  PDSERVE_ASSIGN_OR_RETURN(d.topk, ReadNpy(dir + "/topk.npy"));
  PDSERVE_ASSIGN_OR_RETURN(d.step_logits, ReadNpy(dir + "/step_logits.npy"));
  if (std::filesystem::exists(dir + "/topk_decode.npy")) {  // optional: older dumps lack it
    PDSERVE_ASSIGN_OR_RETURN(d.topk_decode, ReadNpy(dir + "/topk_decode.npy"));
    if (d.topk_decode.shape.size() != 3 || d.topk_decode.descr != "<i4")
      return Status::InvalidArgument("topk_decode.npy is not int32 [steps-1, layers, index_topk]", dir);
    d.has_topk_decode = true;
  }
  if (std::filesystem::exists(dir + "/experts.npy")) {
    PDSERVE_ASSIGN_OR_RETURN(d.experts, ReadNpy(dir + "/experts.npy"));
    if (d.experts.descr != "<i4" || d.experts.shape.size() != 3)
      return Status::InvalidArgument("experts.npy is not int32 [n_layers, prompt_len, top_k]", dir);
  }
  PDSERVE_ASSIGN_OR_RETURN(std::string text, ReadFileToString(dir + "/index.json"));
  auto j = nlohmann::json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.contains("output_tokens") || !j["output_tokens"].is_array())
    return Status::InvalidArgument("index.json lacks output_tokens", dir);
  for (const auto& t : j["output_tokens"]) {
    if (!t.is_number_integer()) return Status::InvalidArgument("output_tokens holds a non-integer", dir);
    d.output.push_back(t.get<int32_t>());
  }
  if (d.hidden.shape.size() != 3 || d.topk.shape.size() != 3 || d.step_logits.shape.size() != 2)
    return Status::InvalidArgument("dump arrays have unexpected ranks", dir);
  return d;
}

Status SameShape(const NpyArray& a, const NpyArray& b, const char* what) {
  if (a.shape != b.shape || a.descr != b.descr)
    return Status::InvalidArgument(std::string(what) + " shapes or dtypes differ between the dumps");
  return Status::Ok();
}

}  // namespace

Result<CompareReport> CompareDumps(const std::string& dir_a, const std::string& dir_b,
                                   const CompareThresholds& th) {
  PDSERVE_ASSIGN_OR_RETURN(Dump a, LoadDump(dir_a));
  PDSERVE_ASSIGN_OR_RETURN(Dump b, LoadDump(dir_b));
  PDSERVE_RETURN_IF_ERROR(SameShape(a.hidden, b.hidden, "hidden.npy"));
  PDSERVE_RETURN_IF_ERROR(SameShape(a.index_scores, b.index_scores, "index_scores.npy"));
  PDSERVE_RETURN_IF_ERROR(SameShape(a.topk, b.topk, "topk.npy"));
  if (a.step_logits.shape[1] != b.step_logits.shape[1])
    return Status::InvalidArgument("step_logits vocabularies differ between the dumps");

  CompareReport r;
  auto fail = [&r](const std::string& why) {
    if (r.passed) r.first_failure = why;
    r.passed = false;
  };
  const int64_t rows = a.hidden.shape[0], S = a.hidden.shape[1], D = a.hidden.shape[2];
  const int64_t K = a.topk.shape[2], T = a.index_scores.shape[2];
  r.rows.resize(static_cast<size_t>(rows));
  for (int64_t l = 0; l < rows; ++l) {
    LayerComparison& c = r.rows[static_cast<size_t>(l)];
    const float* ha = a.hidden.f32() + l * S * D;
    const float* hb = b.hidden.f32() + l * S * D;
    c.hidden_cos = Cosine(ha, hb, S * D, false);
    for (int64_t i = 0; i < S * D; ++i) c.hidden_max_abs = std::max(c.hidden_max_abs, double(std::fabs(ha[i] - hb[i])));
    const std::string name = l == 0 ? "embedding" : "layer " + std::to_string(l - 1);
    if (c.hidden_cos < th.hidden_cos) fail(name + " hidden cos " + std::to_string(c.hidden_cos));
    if (l == 0) continue;
    const int64_t layer = l - 1;
    c.index_cos = Cosine(a.index_scores.f32() + layer * S * T, b.index_scores.f32() + layer * S * T, S * T, true);
    if (c.index_cos < th.index_cos) fail(name + " index-score cos " + std::to_string(c.index_cos));
    int64_t same = 0, total = 0;
    for (int64_t i = 0; i < S; ++i) {
      const auto [n_same, n_total] =
          SetOverlap(a.topk.i32() + (layer * S + i) * K, b.topk.i32() + (layer * S + i) * K, K);
      same += n_same;
      total += n_total;
    }
    c.topk_overlap = total ? double(same) / double(total) : 1.0;
    if (c.topk_overlap < th.topk_overlap) fail(name + " top-k overlap " + std::to_string(c.topk_overlap));
    if (!a.experts.shape.empty() && a.experts.shape == b.experts.shape && a.experts.shape[0] == rows - 1 &&
        a.experts.shape[1] == S) {
      const int64_t top_k = a.experts.shape[2];
      int64_t both = 0, chosen = 0;
      for (int64_t i = 0; i < S; ++i) {
        const int32_t* ea = a.experts.i32() + (layer * S + i) * top_k;
        const int32_t* eb = b.experts.i32() + (layer * S + i) * top_k;
        for (int64_t k = 0; k < top_k; ++k) {
          if (ea[k] < 0) continue;
          ++chosen;
          both += std::find(eb, eb + top_k, ea[k]) != eb + top_k;
        }
      }
      if (chosen > 0) c.expert_overlap = double(both) / double(chosen);
    }
  }
  const int64_t V = a.step_logits.shape[1];
  r.steps_compared = std::min({a.step_logits.shape[0], b.step_logits.shape[0],
                               static_cast<int64_t>(a.output.size()), static_cast<int64_t>(b.output.size())});
  for (int64_t s = 0; s < r.steps_compared; ++s) {
    const double c = Cosine(a.step_logits.f32() + s * V, b.step_logits.f32() + s * V, V, false);
    r.step_logits_cos.push_back(c);
    if (r.first_token_mismatch < 0 && a.output[static_cast<size_t>(s)] != b.output[static_cast<size_t>(s)]) {
      r.first_token_mismatch = s;
      if (th.min_agreeing_steps < 0 || s < th.min_agreeing_steps)
        fail("greedy token differs at step " + std::to_string(s));
    }
    // Logits after a diverged token compare different sequences: only check up to it.
    if ((r.first_token_mismatch < 0 || s <= r.first_token_mismatch) && c < th.logits_cos)
      fail("step " + std::to_string(s) + " logits cos " + std::to_string(c));
  }
  if (a.has_topk_decode && b.has_topk_decode) {
    if (a.topk_decode.shape[1] != b.topk_decode.shape[1] || a.topk_decode.shape[2] != b.topk_decode.shape[2])
      return Status::InvalidArgument("topk_decode.npy layers or index_topk differ between the dumps");
    // Row j is the step that consumed output token j: the same input on both sides while
    // tokens 0..j agree.
    int64_t rows_ok = std::min(a.topk_decode.shape[0], b.topk_decode.shape[0]);
    rows_ok = std::min(rows_ok, r.steps_compared - 1);
    if (r.first_token_mismatch >= 0) rows_ok = std::min(rows_ok, r.first_token_mismatch);
    const int64_t per_row = a.topk_decode.shape[1] * a.topk_decode.shape[2], Kd = a.topk_decode.shape[2];
    int64_t same = 0, total = 0;
    for (int64_t j = 0; j < std::max<int64_t>(rows_ok, 0) * per_row; j += Kd) {
      const auto [n_same, n_total] = SetOverlap(a.topk_decode.i32() + j, b.topk_decode.i32() + j, Kd);
      same += n_same;
      total += n_total;
    }
    r.decode_steps_compared = std::max<int64_t>(rows_ok, 0);
    r.decode_topk_overlap = total ? double(same) / double(total) : 1.0;
    if (r.decode_topk_overlap < th.decode_topk_overlap)
      fail("decode top-k overlap " + std::to_string(r.decode_topk_overlap));
  }
  return r;
}

std::string CompareReport::ToString() const {
  std::ostringstream o;
  o.setf(std::ios::fixed);
  o.precision(7);
  o << "row        hidden_cos   max_abs    index_cos  topk_overlap  expert_overlap\n";
  for (size_t l = 0; l < rows.size(); ++l) {
    const auto& c = rows[l];
    o << (l == 0 ? std::string("embedding") : "layer " + std::to_string(l - 1));
    o << std::string(l == 0 ? 2 : (l - 1 < 10 ? 4 : 3), ' ') << c.hidden_cos << "  " << c.hidden_max_abs;
    if (l > 0) o << "  " << c.index_cos << "  " << c.topk_overlap;
    if (l > 0 && c.expert_overlap >= 0) o << "  " << c.expert_overlap;
    else if (l > 0) o << "  -";
    o << "\n";
  }
  o << "step logits cos:";
  for (double c : step_logits_cos) o << " " << std::setprecision(7) << c;
  o << "\n";
  if (decode_steps_compared > 0)
    o << "decode top-k overlap " << decode_topk_overlap << " over " << decode_steps_compared << " steps\n";
  if (first_token_mismatch >= 0) o << "first diverging greedy token: step " << first_token_mismatch << "\n";
  else o << "greedy tokens agree over " << steps_compared << " steps\n";
  o << (passed ? "PASS" : "FAIL: " + first_failure) << "\n";
  return o.str();
}

}  // namespace pdserve::model
