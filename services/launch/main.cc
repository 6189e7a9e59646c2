// pdserve-launch CONFIG.yaml [--ready-file PATH]: starts a whole cluster topology on this
// machine and stays in the foreground until SIGINT / SIGTERM (launcher.h, docs/deploy.md).
#include <cstdio>
#include <string>

#include "common/cpu_features.h"
#include "services/common/process_util.h"
#include "services/launch/launcher.h"

int main(int argc, char** argv) {
  pdserve::RequireCpuFeatures();
  pdserve::services::BlockTerminationSignals();
  std::string config_path, ready_file;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--ready-file" && i + 1 < argc) {
      ready_file = argv[++i];
    } else if (a == "--help" || a == "-h") {
      std::printf("usage: pdserve-launch CONFIG.yaml [--ready-file PATH]\n");
      return 0;
    } else if (config_path.empty() && a.rfind("--", 0) != 0) {
      config_path = a;
    } else {
      std::fprintf(stderr, "pdserve-launch: unexpected argument '%s'\n", a.c_str());
      return 2;
    }
  }
  if (config_path.empty()) {
    std::fprintf(stderr, "usage: pdserve-launch CONFIG.yaml [--ready-file PATH]\n");
    return 2;
  }
  auto config = pdserve::launch::ClusterConfig::LoadFile(config_path);
  if (!config.ok()) {
    std::fprintf(stderr, "pdserve-launch: %s\n", config.status().ToString().c_str());
    return 2;
  }
  pdserve::launch::Launcher launcher(std::move(config).value(), config_path, ready_file);
  return launcher.Run();
}
