// `pdserve keygen --out DIR --name NAME [--name NAME2 ...]`: writes ZeroMQ CURVE key pairs for
// the control plane (docs/operations.md, "Security"): DIR/NAME.secret (mode 0600) and
// DIR/NAME.public for each name. Existing files are never overwritten. Prints one JSON line per
// pair: {"name": ..., "public_key": ..., "secret_file": ..., "public_file": ...}.
#include <sys/stat.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include <nlohmann/json.hpp>

#include "services/cli/command.h"
#include "services/common/curve_keys.h"

namespace pdserve::cli {
namespace {

int RunKeygen(const CommandLine& args) {
  const std::vector<std::string> names = args.GetAll("name");
  auto out = args.Require("out");
  if (!out.ok()) return ReportStatus("keygen", out.status());
  if (names.empty()) return ReportStatus("keygen", Status::InvalidArgument("--name NAME is required (may repeat)"));
  for (const auto& n : names)
    if (n.empty() || n.find('/') != std::string::npos || n[0] == '.')
      return ReportStatus("keygen", Status::InvalidArgument("bad key name '" + n + "' (a file name, no '/')"));
  if (!services::CurveAvailable())
    return ReportStatus("keygen", Status::Unimplemented("this libzmq was built without CURVE"));
  if (mkdir(out->c_str(), 0700) != 0 && errno != EEXIST)
    return ReportStatus("keygen", Status::Internal(std::string("cannot create ") + *out + ": " + std::strerror(errno)));
  for (const auto& n : names) {
    auto keys = services::WriteCurveKeyPairFiles(*out, n);
    if (!keys.ok()) return ReportStatus("keygen", keys.status());
    nlohmann::json line = {{"name", n},
                           {"public_key", keys->public_key},
                           {"secret_file", *out + "/" + n + ".secret"},
                           {"public_file", *out + "/" + n + ".public"}};
    std::printf("%s\n", line.dump().c_str());
  }
  return 0;
}

}  // namespace
PDSERVE_REGISTER_COMMAND(keygen, "keygen", "write ZeroMQ CURVE key pairs for the control plane",
                         "--out DIR --name NAME [--name NAME2 ...]",
                         "Writes DIR/NAME.secret (mode 0600) and DIR/NAME.public for each name (docs/operations.md,\n"
                         "\"Security\"); existing files are never overwritten.",
                         ({{"out", "DIR", "directory for the key files (created)", false, true},
                           {"name", "NAME", "a key pair's name (repeat for several)", true, true}}),
                         0, RunKeygen);
}  // namespace pdserve::cli
