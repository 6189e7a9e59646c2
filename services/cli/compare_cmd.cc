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

int RunCompare(const CommandLine& args) {
  if (args.positionals().size() != 2)
    return ReportStatus("compare", Status::InvalidArgument("missing argument: wants two dump directories, DIR_A and DIR_B"));
  const std::string& dir_a = args.positionals()[0];
  const std::string& dir_b = args.positionals()[1];
  model::CompareThresholds th;
  for (auto [key, field] : {std::pair<const char*, double*>{"hidden-cos", &th.hidden_cos},
                            {"logits-cos", &th.logits_cos}, {"topk-overlap", &th.topk_overlap},
                            {"index-cos", &th.index_cos}, {"decode-topk-overlap", &th.decode_topk_overlap}}) {
    auto v = args.GetDouble(key, *field);
    if (!v.ok()) return ReportStatus("compare", v.status());
    *field = *v;
  }
  auto min_steps = args.GetInt("min-agreeing-steps", -1);
  if (!min_steps.ok()) return ReportStatus("compare", min_steps.status());
  th.min_agreeing_steps = *min_steps;
  auto report = model::CompareDumps(dir_a, dir_b, th);
  if (!report.ok()) return ReportStatus("compare", report.status());
  std::printf("%s", report->ToString().c_str());
  return report->passed ? 0 : 1;
}

}  // namespace
PDSERVE_REGISTER_COMMAND(compare, "compare", "compare two accuracy dumps layer by layer", "DIR_A DIR_B [options]",
                         "Layer-by-layer comparison of two dumps (pdserve generate --dump-dir, or the Python\n"
                         "reference); exits 1 when a figure is past its threshold, naming the first bad layer/step.\n"
                         "Tolerances per use: docs/reference.md.",
                         ({{"hidden-cos", "X", "min cosine of each layer's hidden state"},
                           {"logits-cos", "X", "min cosine of the logits"},
                           {"topk-overlap", "X", "min overlap of the indexer's top-k"},
                           {"index-cos", "X", "min cosine of the indexer scores"},
                           {"decode-topk-overlap", "X", "min top-k overlap during decode"},
                           {"min-agreeing-steps", "N", "tokens may diverge after step N (-1: must agree)"}}),
                         2, RunCompare);
}  // namespace pdserve::cli
