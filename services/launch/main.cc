// pdserve-launch: starts a whole cluster topology on this machine and stays in the foreground,
// supervising it, until SIGINT / SIGTERM (launcher.h, docs/deploy.md). Options: --help.
#include <cstdio>
#include <string>

#include "common/cpu_features.h"
#include "common/logging.h"
#include "services/common/command_line.h"
#include "services/common/process_util.h"
#include "services/launch/launcher.h"

namespace {
const pdserve::services::CommandSpec kSpec{
    "pdserve-launch",
    "CONFIG.yaml [--ready-file PATH]",
    "Starts the router and every worker group of CONFIG.yaml (docs/deploy.md, docs/configuration.md),\n"
    "makes the model first when cluster.generate_model asks for it, restarts workers by each group's\n"
    "`restart` policy, and stops everything on Ctrl-C (exit 0; 130 when interrupted during start-up;\n"
    "1 after a failure).",
    {{"ready-file", "PATH", "write {http_port, control_endpoint, pids} here once the cluster is ready"}},
    /*max_positionals=*/1};
}  // namespace

int main(int argc, char** argv) {
  pdserve::RequireCpuFeatures();
  pdserve::services::BlockTerminationSignals();
  pdserve::services::CommandLine cl;
  if (auto exit_code = pdserve::services::ParseCommandLineOrExit(argc, argv, kSpec, &cl)) return *exit_code;
  if (pdserve::Status s = pdserve::InitLogLevelFromEnv(); !s.ok()) return pdserve::services::ReportCommandError(kSpec, s);
  if (cl.positionals().empty()) {
    return pdserve::services::ReportCommandError(kSpec,
                                                 pdserve::Status::InvalidArgument("missing the cluster file CONFIG.yaml"));
  }
  const std::string config_path = cl.positionals().front();
  auto config = pdserve::launch::ClusterConfig::LoadFile(config_path);
  if (!config.ok()) return pdserve::services::ReportCommandError(kSpec, config.status());
  pdserve::launch::Launcher launcher(std::move(config).value(), config_path, cl.GetOr("ready-file", ""));
  return launcher.Run();
}
