// `pdserve make-model --preset tiny|tiny2|small|v32-slice --out DIR [--seed N] [--vocab N] [--dtype bf16|fp8]`
#include <cstdio>

#include "model/tools/make_model.h"
#include "services/cli/command.h"

namespace pdserve::cli {
namespace {
int RunMakeModel(const CommandLine& args) {
  model::MakeModelOptions opt;
  opt.preset = args.GetOr("preset", "tiny");
  auto out = args.Require("out");
  if (!out.ok()) return ReportStatus("make-model", out.status());
  opt.out_dir = *out;
  auto seed = args.GetInt("seed", 1);
  auto vocab = args.GetInt("vocab", 0, 0, int64_t{1} << 24);
  auto shard = args.GetInt("max-shard-mb", 0);
  for (const Status& s : {seed.status(), vocab.status(), shard.status()})
    if (!s.ok()) return ReportStatus("make-model", s);
  opt.seed = static_cast<uint64_t>(*seed);
  opt.vocab = *vocab;
  opt.max_shard_bytes = *shard << 20;
  opt.dtype = args.GetOr("dtype", "bf16");
  Status s = model::MakeModel(opt);
  if (s.ok()) std::fprintf(stderr, "wrote %s model '%s' to %s\n", opt.dtype.c_str(), opt.preset.c_str(), opt.out_dir.c_str());
  return ReportStatus("make-model", s);
}
}  // namespace
PDSERVE_REGISTER_COMMAND(make_model, "make-model", "write a random checkpoint of a preset (HF format)",
                         "--preset tiny|tiny2|small|v32-slice --out DIR [--vocab N] [options]",
                         "Writes a random checkpoint in the Hugging Face format DeepSeek-V3.2 is published in\n"
                         "(config.json + safetensors). Chat prompts need a vocabulary covering the DeepSeek-V3\n"
                         "tokenizer: --vocab 129280 (the presets' own vocabularies are small).",
                         ({{"preset", "NAME", "tiny (default) | tiny2 | small | v32-slice (docs/engine.md)"},
                           {"out", "DIR", "output directory", false, true},
                           {"seed", "N", "random seed (default 1)"},
                           {"vocab", "N", "vocabulary size (0: the preset's)"},
                           {"dtype", "T", "bf16 (default) | fp8 (128x128 block scales, like the official weights)"},
                           {"max-shard-mb", "N", "largest safetensors shard (0: one file)"}}),
                         0, RunMakeModel);
}  // namespace pdserve::cli
