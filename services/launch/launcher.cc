#include "services/launch/launcher.h"

#include <signal.h>
#include <sys/signalfd.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <map>

#include <fmt/format.h>
#include <httplib.h>
#include <nlohmann/json.hpp>

#include "services/common/process_util.h"

namespace pdserve::launch {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

namespace {
void Say(const std::string& line) {
  std::printf("[launch] %s\n", line.c_str());
  std::fflush(stdout);
}

std::string SelfDir() {
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  return ec ? std::string(".") : exe.parent_path().string();
}

}  // namespace

Launcher::Launcher(ClusterConfig config, std::string config_path, std::string ready_file)
    : config_(std::move(config)),
      config_path_(std::move(config_path)),
      ready_file_(std::move(ready_file)),
      supervisor_(config_.log_dir) {}

Status Launcher::CheckBinaries() {
  std::vector<std::string> missing;
  auto check = [&](const std::string& name) {
    if (access(Bin(name).c_str(), X_OK) != 0) missing.push_back(Bin(name));
  };
  check("pdserve-router");
  bool engine = false;
  for (const auto& g : config_.workers) {
    check(ClusterConfig::BinaryName(g));
    engine = engine || g.type == "engine";
    if ((g.mpi_ranks > 1 || g.plan) && services::FindInPath("mpirun").empty()) missing.push_back("mpirun (in PATH)");
  }
  if (engine && config_.generate_model.enabled) check("pdserve");
  if (missing.empty()) return Status::Ok();
  std::string list;
  for (const auto& m : missing) list += "\n  " + m;
  return Status::NotFound("missing executables (not built yet, or a wrong cluster.bin_dir?):" + list);
}

bool Launcher::PollOnce(std::chrono::milliseconds timeout) {
  bool sig_ready = false;
  for (const auto& e : supervisor_.Poll(timeout, signal_fd_, &sig_ready)) {
    if (failure_.empty()) failure_ = fmt::format("{} (pid {}) exited with status {}", e.name, e.pid, e.status);
  }
  if (sig_ready) {
    signalfd_siginfo info;
    if (read(signal_fd_, &info, sizeof(info)) == sizeof(info)) signal_ = static_cast<int>(info.ssi_signo);
  }
  return failure_.empty() && signal_ == 0;
}

Status Launcher::EnsureModel() {
  bool engine = false;
  for (const auto& g : config_.workers) engine = engine || g.type == "engine";
  if (!engine || fs::exists(fs::path(config_.model_dir) / "config.json")) return Status::Ok();
  if (!config_.generate_model.enabled)
    return Status::NotFound("no model in '" + config_.model_dir + "' and cluster.generate_model.enabled is false");
  Say(fmt::format("generating the '{}' model in {}", config_.generate_model.preset, config_.model_dir));
  PDSERVE_RETURN_IF_ERROR(supervisor_
                              .Start({"make-model",
                                      {Bin("pdserve"), "make-model", "--preset", config_.generate_model.preset, "--out",
                                       config_.model_dir, "--seed", std::to_string(config_.generate_model.seed)},
                                      {}})
                              .status());
  while (supervisor_.Running("make-model")) {
    bool sig = false;
    for (const auto& e : supervisor_.Poll(std::chrono::milliseconds(200), signal_fd_, &sig))
      if (e.status != 0) return Status::Internal(fmt::format("pdserve make-model failed (status {})", e.status));
    if (sig) return Status::Cancelled("interrupted while generating the model");
  }
  return Status::Ok();
}

Status Launcher::StartRouter() {
  const std::string ready = run_dir_ + "/router.ready";
  PDSERVE_RETURN_IF_ERROR(
      supervisor_.Start({"router", {Bin("pdserve-router"), "--config", config_path_, "--ready-file", ready}, {}}).status());
  const auto deadline = Clock::now() + config_.ready_timeout;
  while (Clock::now() < deadline) {
    if (!PollOnce(std::chrono::milliseconds(50))) return Status::Aborted("while waiting for the router");
    auto text = services::ReadFile(ready);
    if (!text.ok()) continue;
    try {
      auto j = nlohmann::json::parse(text.value());
      http_port_ = j["http_port"].get<int>();
      control_endpoint_ = j["control_endpoint"].get<std::string>();
      return Status::Ok();
    } catch (const std::exception&) {
    }
  }
  return Status::DeadlineExceeded("the router did not start in time");
}

Status Launcher::StartWorkers() {
  for (const auto& g : config_.workers) {
    for (uint32_t i = 0; i < g.count; ++i) {
      const std::string id = fmt::format("{}-{}", g.name, i);
      std::vector<std::string> argv;
      // One machine: more ranks than cores is expected, and root may run them.
      if (g.mpi_ranks > 1 || g.plan) {
        argv = {services::FindInPath("mpirun"), "-n", std::to_string(g.mpi_ranks), "--oversubscribe"};
        if (getuid() == 0) argv.push_back("--allow-run-as-root");
      }
      argv.insert(argv.end(), {Bin(ClusterConfig::BinaryName(g)), "--router", control_endpoint_, "--worker-id", id,
                               "--role", services::WorkerRoleName(g.role), "--model-name", config_.router.model_name,
                               "--metrics-port", std::to_string(g.metrics_port == 0 ? 0 : g.metrics_port + i * g.registrations())});
      if (g.type == "engine") argv.insert(argv.end(), {"--model", config_.model_dir});
      if (g.plan)
        argv.insert(argv.end(), {"--plan", fmt::format("cp={},dp={},ep={},tp={}", g.plan->cp, g.plan->dp, g.plan->ep,
                                                       g.plan->tp)});
      argv.insert(argv.end(), g.args.begin(), g.args.end());
      PDSERVE_RETURN_IF_ERROR(supervisor_.Start({id, argv, g.env}).status());
      worker_names_.push_back(id);
    }
  }
  return Status::Ok();
}

Status Launcher::WaitReady() {
  const auto deadline = Clock::now() + config_.ready_timeout;
  httplib::Client cli("127.0.0.1", http_port_);
  cli.set_connection_timeout(std::chrono::seconds(2));
  cli.set_read_timeout(std::chrono::seconds(2));
  // Ready means every configured worker registered, not only the router's minimum (one prefill
  // and one decode): whoever waits on the ready file may count on the whole topology.
  std::map<std::string, int64_t> expected;
  for (const WorkerGroupConfig& g : config_.workers)
    expected[services::WorkerRoleName(g.role)] += g.count * g.registrations();
  std::string last_seen = "no answer";
  while (Clock::now() < deadline) {
    if (!PollOnce(std::chrono::milliseconds(100))) return Status::Aborted("while waiting for the cluster");
    auto r = cli.Get("/health");
    if (!r) continue;
    last_seen = r->body;
    if (r->status != 200) continue;
    const nlohmann::json health = nlohmann::json::parse(r->body, nullptr, /*allow_exceptions=*/false);
    bool all = health.is_object() && health.contains("workers") && health["workers"].is_object();
    for (const auto& [role, count] : expected) {
      if (!all) break;
      const auto& n = health["workers"][role];
      all = n.is_number_integer() && n.get<int64_t>() >= count;
    }
    if (all) return Status::Ok();
  }
  return Status::DeadlineExceeded(fmt::format(
      "the cluster was not ready within {} ms: GET /health did not list every configured worker (last answer: {})",
      config_.ready_timeout.count(), last_seen));
}

int Launcher::Shutdown(int code) {
  Say(code == 0 ? "stopping the cluster" : "stopping the cluster after a failure");
  // Workers first (they drain and deregister while the router still listens), then the router.
  supervisor_.Stop(worker_names_, config_.stop_grace);
  supervisor_.Stop({"router", "make-model"}, config_.stop_grace);
  Say(code == 0 ? "all processes stopped" : "all processes stopped; exit 1");
  if (!ready_file_.empty()) std::remove(ready_file_.c_str());
  std::error_code ec;
  fs::remove_all(run_dir_, ec);
  return code;
}

int Launcher::Run() {
  bin_dir_ = config_.bin_dir.empty() ? SelfDir() : config_.bin_dir;
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGHUP);
  signal_fd_ = signalfd(-1, &set, SFD_CLOEXEC | SFD_NONBLOCK);
  if (signal_fd_ < 0) {
    Say("cannot create a signalfd");
    return 1;
  }
  run_dir_ = fs::temp_directory_path().string() + fmt::format("/pdserve-launch-{}", getpid());
  std::error_code ec;
  fs::create_directories(run_dir_, ec);
  if (!config_.log_dir.empty()) fs::create_directories(config_.log_dir, ec);

  auto fail = [&](const Status& s) {
    Say("error: " + s.ToString() + (failure_.empty() ? "" : " -- " + failure_));
    return Shutdown(signal_ != 0 && failure_.empty() ? 0 : 1);
  };
  if (Status s = CheckBinaries(); !s.ok()) return fail(s);
  if (Status s = EnsureModel(); !s.ok()) return fail(s);
  if (Status s = StartRouter(); !s.ok()) return fail(s);
  if (Status s = StartWorkers(); !s.ok()) return fail(s);
  if (Status s = WaitReady(); !s.ok()) return fail(s);

  const std::string host = config_.router.host == "0.0.0.0" ? "127.0.0.1" : config_.router.host;
  Say(fmt::format("cluster '{}' ready: OpenAI API at http://{}:{}/v1 (model '{}'), router metrics at "
                  "http://{}:{}/metrics, workers at http://{}:{}/admin/workers; Ctrl-C stops it",
                  config_.name, host, http_port_, config_.router.model_name, host, http_port_, host, http_port_));
  if (!ready_file_.empty()) {
    nlohmann::json pids = nlohmann::json::object();
    for (const auto& n : supervisor_.RunningNames()) pids[n] = *supervisor_.Pid(n);
    nlohmann::json ready = {{"http_port", http_port_}, {"control_endpoint", control_endpoint_}, {"pids", pids}};
    if (Status s = services::WriteFileAtomically(ready_file_, ready.dump()); !s.ok()) return fail(s);
  }
  while (PollOnce(std::chrono::milliseconds(500))) {
  }
  if (!failure_.empty()) {
    Say("error: " + failure_ + " (pdserve-launch restarts nothing)");
    return Shutdown(1);
  }
  Say(fmt::format("signal {}", signal_));
  return Shutdown(0);
}

}  // namespace pdserve::launch
