// `pdserve plan --model CONFIG_OR_DIR [--hardware PROFILE] [--kv-format fp8|bf16|int8] [...]
//  [--json] [--plot F.png]`: the capacity planner (docs/planner.md). Prints the markdown report,
// or the JSON one with --json; --plot writes goodput against the prefill:decode split as a PNG
// (tools/planner/plot_goodput.py, compiled in; needs python3-matplotlib).
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "comm/parallel_plan.h"
#include "planner/plan.h"
#include "planner/plot_script.h"
#include "services/cli/command.h"

namespace pdserve::cli {
namespace {

Status SetInt(const CommandLine& a, const std::string& key, int64_t* out, int64_t min = 0, int64_t max = 1000000000) {
  if (!a.Has(key)) return Status::Ok();
  PDSERVE_ASSIGN_OR_RETURN(*out, a.GetInt(key, *out, min, max));
  return Status::Ok();
}

Status SetPlan(const CommandLine& a, const std::string& key, bool* set, comm::ParallelPlan* plan) {
  if (!a.Has(key)) return Status::Ok();
  PDSERVE_ASSIGN_OR_RETURN(*plan, comm::ParallelPlan::FromString(*a.Get(key), "--" + key));
  *set = true;
  return Status::Ok();
}

Status FillSpec(const CommandLine& a, planner::PlanSpec* s) {
  if (auto f = a.Get("spec")) PDSERVE_RETURN_IF_ERROR(s->MergeYamlFile(*f));
  if (auto v = a.Get("model")) s->model = *v;
  if (auto v = a.Get("hardware")) s->hardware = *v;
  if (auto v = a.Get("weights")) s->weights = *v;
  if (auto v = a.Get("kv-format")) s->kv_format = *v;
  if (auto v = a.Get("index-format")) s->index_format = *v;
  if (auto v = a.Get("mode")) {
    if (*v != "disaggregated" && *v != "colocated")
      return Status::InvalidArgument("--mode wants disaggregated or colocated, got '" + *v + "'");
    s->colocated = *v == "colocated";
  }
  for (const auto& [key, out] : std::vector<std::pair<std::string, int64_t*>>{
           {"prefill-nodes", &s->prefill_nodes}, {"decode-nodes", &s->decode_nodes},
           {"colocated-nodes", &s->colocated_nodes}, {"prefill-instances", &s->prefill_instances},
           {"decode-instances", &s->decode_instances}, {"colocated-instances", &s->colocated_instances},
           {"input-len", &s->workload.input_len}, {"output-len", &s->workload.output_len},
           {"num-requests", &s->workload.num_requests}, {"warmup", &s->workload.warmup},
           {"max-num-seqs", &s->limits.max_num_seqs}, {"max-step-tokens", &s->limits.max_step_tokens},
           {"prefill-chunk", &s->limits.prefill_chunk}, {"search-instances", &s->search_instances}})
    PDSERVE_RETURN_IF_ERROR(SetInt(a, key, out));
  if (a.Has("seed")) {
    PDSERVE_ASSIGN_OR_RETURN(int64_t seed, a.GetInt("seed", 1, 0));
    s->workload.seed = static_cast<uint64_t>(seed);
  }
  PDSERVE_RETURN_IF_ERROR(SetPlan(a, "prefill-plan", &s->prefill_plan_set, &s->prefill_plan));
  PDSERVE_RETURN_IF_ERROR(SetPlan(a, "decode-plan", &s->decode_plan_set, &s->decode_plan));
  PDSERVE_RETURN_IF_ERROR(SetPlan(a, "colocated-plan", &s->colocated_plan_set, &s->colocated_plan));
  PDSERVE_ASSIGN_OR_RETURN(s->workload.range_ratio, a.GetDouble("range-ratio", s->workload.range_ratio));
  PDSERVE_ASSIGN_OR_RETURN(s->workload.rate_rps, a.GetDouble("rate", s->workload.rate_rps));
  PDSERVE_ASSIGN_OR_RETURN(double ttft_ms, a.GetDouble("slo-ttft-ms", s->slo.ttft_s * 1e3));
  PDSERVE_ASSIGN_OR_RETURN(double tpot_ms, a.GetDouble("slo-tpot-ms", s->slo.tpot_s * 1e3));
  s->slo.ttft_s = ttft_ms * 1e-3;
  s->slo.tpot_s = tpot_ms * 1e-3;
  PDSERVE_ASSIGN_OR_RETURN(s->slo.attainment, a.GetDouble("slo-attainment", s->slo.attainment));
  if (a.Has("no-search")) s->search = false;
  return Status::Ok();
}

// Writes the report and the plot script to a temporary directory and runs python3 on them.
Status Plot(const planner::PlanReport& report, const std::string& png) {
  if (report.sweep.empty())
    return Status::InvalidArgument("--plot draws goodput against the prefill:decode split: it needs a disaggregated "
                                   "plan with the search on (not --mode colocated or --no-search)");
  const char* tmp = std::getenv("TMPDIR");
  std::string tmpl = std::string(tmp && *tmp ? tmp : "/tmp") + "/pdserve-plan.XXXXXX";
  if (!mkdtemp(tmpl.data())) return Status::Internal("cannot create a temporary directory for the plot");
  const std::string dir = tmpl;
  std::ofstream(dir + "/report.json") << report.ToJson().dump(2);
  std::ofstream(dir + "/plot_goodput.py") << planner::GoodputPlotScript();
  // Debian's interpreter has python3-matplotlib (scripts/setup.sh); a python3 earlier on PATH
  // (pyenv, venv) may not.
  const std::string python = access("/usr/bin/python3", X_OK) == 0 ? "/usr/bin/python3" : "python3";
  const std::string cmd = python + " '" + dir + "/plot_goodput.py' '" + dir + "/report.json' '" + png + "' 2>'" + dir +
                          "/plot.log'";
  const int rc = std::system(cmd.c_str());
  std::string log;
  if (rc != 0) {
    std::ifstream in(dir + "/plot.log");
    std::getline(in, log, '\0');
  }
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
  if (rc != 0)
    return Status::Unavailable("the plot script failed (python3 with matplotlib is needed: scripts/setup.sh): " + log);
  return Status::Ok();
}

int RunPlan(const CommandLine& args) {
  if (args.Has("list-hardware")) {
    for (const auto& n : planner::BuiltinProfileNames()) {
      auto p = planner::HardwareProfile::Load(n);
      std::printf("%-14s %s\n", n.c_str(), p.ok() ? p->description.c_str() : p.status().ToString().c_str());
    }
    return 0;
  }
  planner::PlanSpec spec;
  Status s = FillSpec(args, &spec);
  if (!s.ok()) return ReportStatus("plan", s);
  auto report = planner::MakePlan(spec);
  if (!report.ok()) return ReportStatus("plan", report.status());
  if (args.Has("json")) {
    std::printf("%s\n", report->ToJson().dump(2).c_str());
  } else {
    std::printf("%s", report->ToMarkdown().c_str());
  }
  if (auto png = args.Get("plot")) {
    Status p = Plot(*report, *png);
    if (!p.ok()) return ReportStatus("plan", p);
    std::fprintf(stderr, "wrote %s\n", png->c_str());
  }
  return 0;
}

}  // namespace
PDSERVE_REGISTER_COMMAND(
    plan, "plan", "capacity planner: size prefill / decode pools for a workload and SLO",
    "--model CONFIG_OR_DIR [--hardware PROFILE] [--kv-format fp8|bf16|int8] [options] [--json] [--plot F.png]",
    "Predicts, for a DeepSeek-V3.2-family model on a hardware profile, the memory of every rank, the step\n"
    "costs, TTFT / TPOT percentiles, throughput and goodput of the given pools (a simulation of the\n"
    "cluster with every engine step timed by a cost model), and searches the prefill:decode split.\n"
    "With only --model: this machine's profile (local), one prefill + one decode node. docs/planner.md.",
    ({{"model", "PATH", "config.json or a model directory (required unless --spec names it)"},
      {"hardware", "NAME|FILE", "built-in profile (--list-hardware) or a YAML profile (default local)"},
      {"spec", "FILE", "a YAML spec with any of these settings (flags override it)"},
      {"weights", "F", "bf16 | w8a8 | fp8 (default: the checkpoint's format)"},
      {"kv-format", "F", "MLA latent cache: fp8 (default) | bf16 | int8 (C8)"},
      {"index-format", "F", "indexer key cache: fp8 | int8 (A8C8) | bf16 (default: int8 with an int8 latent, else fp8)"},
      {"mode", "M", "disaggregated (default) | colocated"},
      {"prefill-nodes", "N", "nodes of the prefill pool (default 1)"},
      {"decode-nodes", "N", "nodes of the decode pool (default 1)"},
      {"colocated-nodes", "N", "nodes of the colocated pool (default 1)"},
      {"prefill-instances", "N", "prefill instances (overrides --prefill-nodes)"},
      {"decode-instances", "N", "decode instances (overrides --decode-nodes)"},
      {"colocated-instances", "N", "colocated instances (overrides --colocated-nodes)"},
      {"prefill-plan", "PLAN", "cp=..,ep=.. per prefill instance (default: one node, cp = ep = devices per node)"},
      {"decode-plan", "PLAN", "dp=..,ep=..,tp=.. per decode instance (default: one node, dp = ep = devices per node)"},
      {"colocated-plan", "PLAN", "plan of a colocated instance (default as decode)"},
      {"input-len", "N", "prompt tokens (default 1024)"},
      {"output-len", "N", "output tokens (default 128)"},
      {"range-ratio", "R", "lengths uniform in len * (1 +- R), as pdserve-loadgen (default 0)"},
      {"rate", "RPS", "Poisson arrival rate, requests/s (default 1)"},
      {"num-requests", "N", "simulated requests (default 400)"},
      {"warmup", "N", "first simulated requests left out of the percentiles (default 0)"},
      {"seed", "N", "simulation seed; arrivals are drawn as pdserve-loadgen --seed N draws them (default 1)"},
      {"slo-ttft-ms", "MS", "TTFT SLO (default 2000)"},
      {"slo-tpot-ms", "MS", "TPOT SLO (default 50)"},
      {"slo-attainment", "F", "share of requests that must meet both (default 0.9)"},
      {"max-num-seqs", "N", "engine sequences per step (default 64)"},
      {"max-step-tokens", "N", "engine token budget per step (default 512)"},
      {"prefill-chunk", "N", "engine prompt chunk (default 256)"},
      {"search-instances", "N", "P:D sweep and best-plan search over M + N <= this many instances (default max(4, M + N))"},
      {"no-search", "", "skip the sweep and the search"},
      {"json", "", "print the JSON report instead of markdown"},
      {"plot", "F.png", "write goodput vs the P:D split (python3-matplotlib)"},
      {"list-hardware", "", "list the built-in hardware profiles"}}),
    0, RunPlan);
}  // namespace pdserve::cli
