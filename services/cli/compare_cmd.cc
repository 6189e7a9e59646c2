// `pdserve compare DIR_A DIR_B [--hidden-cos X] [--logits-cos X] [--topk-overlap X] [--index-cos X]
//  [--decode-topk-overlap X] [--min-agreeing-steps N]`
// Layer-by-layer comparison of two dumps (pdserve generate --dump-dir, or the Python
// reference); exits 1 when a figure is past its threshold, naming the first bad layer/step.
// Tokens must agree at every step unless --min-agreeing-steps N allows a divergence after
// step N (the logits are then compared up to it). Tolerances per use: docs/reference.md.
#include <cstdio>
#include <cstdlib>

#include "model/dump_compare.h"
#include "services/cli/command.h"

namespace pdserve::cli {
namespace {

Result<double> GetDouble(const Args& args, const std::string& key, double fallback) {
  auto v = args.Get(key);
  if (!v) return fallback;
  char* end = nullptr;
  const double x = std::strtod(v->c_str(), &end);
  if (v->empty() || *end != '\0') return Status::InvalidArgument("--" + key + " wants a number, got '" + *v + "'");
  return x;
}

int RunCompare(const std::vector<std::string>& argv) {
  if (argv.size() < 2 || argv[0].rfind("--", 0) == 0 || argv[1].rfind("--", 0) == 0)
    return ReportStatus("compare", Status::InvalidArgument("usage: pdserve compare DIR_A DIR_B [--hidden-cos X] "
                                                           "[--logits-cos X] [--topk-overlap X] [--index-cos X] "
                                                           "[--decode-topk-overlap X] [--min-agreeing-steps N]"));
  auto args = Args::Parse({argv.begin() + 2, argv.end()},
                          {"hidden-cos", "logits-cos", "topk-overlap", "index-cos", "decode-topk-overlap",
                           "min-agreeing-steps"},
                          {});
  if (!args.ok()) return ReportStatus("compare", args.status());
  model::CompareThresholds th;
  for (auto [key, field] : {std::pair<const char*, double*>{"hidden-cos", &th.hidden_cos},
                            {"logits-cos", &th.logits_cos}, {"topk-overlap", &th.topk_overlap},
                            {"index-cos", &th.index_cos}, {"decode-topk-overlap", &th.decode_topk_overlap}}) {
    auto v = GetDouble(*args, key, *field);
    if (!v.ok()) return ReportStatus("compare", v.status());
    *field = *v;
  }
  auto min_steps = args->GetInt("min-agreeing-steps", -1);
  if (!min_steps.ok()) return ReportStatus("compare", min_steps.status());
  th.min_agreeing_steps = *min_steps;
  auto report = model::CompareDumps(argv[0], argv[1], th);
  if (!report.ok()) return ReportStatus("compare", report.status());
  std::printf("%s", report->ToString().c_str());
  return report->passed ? 0 : 1;
}

}  // namespace
PDSERVE_REGISTER_COMMAND(compare, "compare", "compare two accuracy dumps layer by layer", RunCompare);
}  // namespace pdserve::cli
