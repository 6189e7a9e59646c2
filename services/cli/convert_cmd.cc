// `pdserve convert --in HF_DIR --out DIR [--quant w8a8|w8a8_all|bf16] [--ep-size N] [--max-shard-mb N]
//                  [--threads N]`
// Streams a BF16 or FP8 (block-scaled) Hugging Face checkpoint into pdserve's W8A8 INT8 format
// or plain BF16 (docs/quantization.md), optionally split per expert-parallel rank.
#include <sys/resource.h>

#include <cstdio>

#include "common/thread_pool.h"
#include "model/tools/convert.h"
#include "services/cli/command.h"

namespace pdserve::cli {
namespace {
int RunConvert(const CommandLine& args) {
  model::ConvertOptions opt;
  auto in = args.Require("in");
  if (!in.ok()) return ReportStatus("convert", in.status());
  auto out = args.Require("out");
  if (!out.ok()) return ReportStatus("convert", out.status());
  opt.in_dir = *in;
  opt.out_dir = *out;
  opt.quant = args.GetOr("quant", "w8a8");
  auto ep = args.GetInt("ep-size", 1);
  auto shard = args.GetInt("max-shard-mb", 4096);
  auto threads = args.GetInt("threads", 0);
  for (const Status& s : {ep.status(), shard.status(), threads.status()})
    if (!s.ok()) return ReportStatus("convert", s);
  opt.ep_size = *ep;
  opt.max_shard_bytes = *shard << 20;
  ThreadPool own(*threads > 0 ? static_cast<int>(*threads) : 1);
  opt.pool = *threads > 0 ? &own : &ThreadPool::Default();
  auto stats = model::Convert(opt);
  if (!stats.ok()) return ReportStatus("convert", stats.status());
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  std::fprintf(stderr,
               "converted %s -> %s (%s, ep-size %lld): %lld tensors in, %lld out (%lld quantized, %lld MTP dropped), "
               "%lld shards, %.1f MB in, %.1f MB out, %.2f s (%.2f GB/s in), peak RSS %.1f MB\n",
               opt.in_dir.c_str(), opt.out_dir.c_str(), opt.quant.c_str(), static_cast<long long>(opt.ep_size),
               static_cast<long long>(stats->tensors_in), static_cast<long long>(stats->tensors_out),
               static_cast<long long>(stats->quantized), static_cast<long long>(stats->dropped_mtp),
               static_cast<long long>(stats->shards), stats->bytes_in / 1e6, stats->bytes_out / 1e6, stats->seconds,
               stats->bytes_in / 1e9 / std::max(stats->seconds, 1e-9), ru.ru_maxrss / 1024.0);
  return 0;
}
}  // namespace
PDSERVE_REGISTER_COMMAND(convert, "convert", "convert a BF16/FP8 HF checkpoint to W8A8 INT8 or BF16 (streaming)",
                         "--in HF_DIR --out DIR [--quant w8a8|w8a8_all|bf16] [options]",
                         "Streams a BF16 or FP8 (128x128 block-scaled) Hugging Face checkpoint into pdserve's W8A8\n"
                         "INT8 format or plain BF16 (docs/quantization.md), optionally split per EP rank.",
                         ({{"in", "DIR", "the Hugging Face checkpoint", false, true},
                           {"out", "DIR", "where to write the converted checkpoint", false, true},
                           {"quant", "Q", "w8a8 (default) | w8a8_all | bf16"},
                           {"ep-size", "N", "write one expert shard per EP rank (default 1)"},
                           {"max-shard-mb", "N", "largest output shard (default 4096)"},
                           {"threads", "N", "conversion threads (0: all cores)"}}),
                         0, RunConvert);
}  // namespace pdserve::cli
