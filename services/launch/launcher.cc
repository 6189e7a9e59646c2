#include "services/launch/launcher.h"

#include <signal.h>
#include <poll.h>
#include <sys/signalfd.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <map>

#include <fmt/format.h>
#include <httplib.h>
#include <nlohmann/json.hpp>

#include "common/mapped_file.h"
#include "services/common/net_util.h"
#include "services/common/process_util.h"
#include "services/launch/host_command.h"

namespace pdserve::launch {

namespace fs = std::filesystem;

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

// "exited with status 3" / "was killed by signal 9".
std::string DescribeExit(int status) {
  if (status > 128 && status < 128 + 65) return fmt::format("was killed by signal {}", status - 128);
  return fmt::format("exited with status {}", status);
}

std::string Millis(std::chrono::milliseconds d) { return fmt::format("{:.1f} s", d.count() / 1000.0); }

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
  // How each inventory host is reached: its command prefix or ssh, here.
  for (const HostConfig& h : config_.hosts) {
    const std::string tool = h.run == HostConfig::Run::kPrefix ? h.prefix.front()
                             : h.run == HostConfig::Run::kSsh  ? std::string("ssh")
                                                               : std::string();
    if (tool.empty()) continue;
    const bool found = tool.find('/') != std::string::npos ? access(tool.c_str(), X_OK) == 0
                                                           : !services::FindInPath(tool).empty();
    if (!found) missing.push_back(tool + " (to reach host '" + h.name + "')");
  }
  if (missing.empty()) return Status::Ok();
  std::string list;
  for (const auto& m : missing) list += "\n  " + m;
  return Status::NotFound("missing executables (not built yet, or a wrong cluster.bin_dir?):" + list);
}

Status Launcher::WriteLaunchAgent() {
  bool spread = false;
  for (const auto& g : config_.workers) spread = spread || SpreadOverHosts(g);
  if (!spread) return Status::Ok();
  const std::string path = run_dir_ + "/launch-agent.sh";
  PDSERVE_RETURN_IF_ERROR(WriteStringToFile(path, MpiLaunchAgentScript(config_.hosts)));
  std::error_code ec;
  fs::permissions(path, fs::perms::owner_all, fs::perm_options::add, ec);
  if (ec) return Status::Internal("cannot make " + path + " executable: " + ec.message());
  return Status::Ok();
}

Launcher::Instance* Launcher::Find(const std::string& name) {
  for (Instance& i : instances_)
    if (i.name == name) return &i;
  return nullptr;
}

const RestartConfig& Launcher::RestartOf(const Instance& instance) const {
  return instance.group < 0 ? config_.router_restart : config_.workers[instance.group].restart;
}

bool Launcher::PollOnce(std::chrono::milliseconds timeout) {
  bool sig_ready = false;
  for (const auto& e : supervisor_.Poll(timeout, signal_fd_, &sig_ready)) {
    if (!ready_) {
      if (failure_.empty()) failure_ = fmt::format("{} (pid {}) {}", e.name, e.pid, DescribeExit(e.status));
    } else {
      OnExit(e);
    }
  }
  if (sig_ready) {
    signalfd_siginfo info;
    if (read(signal_fd_, &info, sizeof(info)) == sizeof(info)) signal_ = static_cast<int>(info.ssi_signo);
  }
  if (ready_) StartDueRestarts();
  return failure_.empty() && signal_ == 0;
}

void Launcher::OnExit(const ProcessExit& e) {
  Instance* in = Find(e.name);
  if (in == nullptr) return;  // make-model or an unknown child: nothing to supervise
  const auto now = Clock::now();
  const auto ran = std::chrono::duration_cast<std::chrono::milliseconds>(now - in->started);
  const RestartConfig& rc = RestartOf(*in);
  const bool clean = e.status == 0;
  // Said after the ready file holds the new state, so whoever reads the log line finds it there.
  std::string message;
  if (in->state == InstanceState::kDraining) {
    message = fmt::format("{} left the pool (it {} after a scale-down)", in->name, DescribeExit(e.status));
    in->state = InstanceState::kLeft;
  } else if (rc.policy == RestartPolicy::kNever || (clean && rc.policy == RestartPolicy::kOnFailure)) {
    message = fmt::format("{} (pid {}) {} after {}; restart policy '{}': it stays down{}", in->name, e.pid,
                          DescribeExit(e.status), Millis(ran), RestartPolicyName(rc.policy),
                          clean ? " (drained: it left the pool)" : "");
    in->state = InstanceState::kLeft;
  } else {
    // A run that lasted reset_after was healthy: this exit starts a new count.
    if (ran >= rc.reset_after) in->consecutive_failures = 0;
    if (!clean) ++in->consecutive_failures;
    if (rc.max_restarts > 0 && in->consecutive_failures > rc.max_restarts) {
      message = fmt::format("error: {} (pid {}) {} after {}: {} failed runs in a row, the cap "
                      "(max_restarts {}); giving up on it, the rest of the cluster keeps serving",
                      in->name, e.pid, DescribeExit(e.status), Millis(ran), in->consecutive_failures,
                      rc.max_restarts);
      in->state = InstanceState::kGaveUp;
      if (in->group < 0) failure_ = "the router failed " + std::to_string(in->consecutive_failures) + " times in a row";
    } else {
      auto delay = rc.backoff;
      for (uint32_t k = 1; k < std::max<uint32_t>(1, in->consecutive_failures) && delay < rc.max_backoff; ++k) delay *= 2;
      delay = std::min(delay, rc.max_backoff);
      message = fmt::format("{} (pid {}) {} after {}; restarting in {} (policy '{}', failure {} in a row{})",
                      in->name, e.pid, DescribeExit(e.status), Millis(ran), Millis(delay),
                      RestartPolicyName(rc.policy), in->consecutive_failures,
                      rc.max_restarts > 0 ? fmt::format(" of at most {}", rc.max_restarts) : std::string());
      in->state = InstanceState::kRestartPending;
      in->restart_at = now + delay;
    }
  }
  if (Status s = WriteReadyFile(); !s.ok()) Say("warning: " + s.ToString());
  Say(message);
}

void Launcher::StartDueRestarts() {
  const auto now = Clock::now();
  bool changed = false;
  for (Instance& in : instances_) {
    if (in.state != InstanceState::kRestartPending || now < in.restart_at) continue;
    ++in.restarts;
    if (Status s = StartInstance(in); !s.ok()) {
      Say(fmt::format("error: restarting {}: {}", in.name, s.ToString()));
      in.state = InstanceState::kGaveUp;
    }
    changed = true;
  }
  if (changed) {
    if (Status s = WriteReadyFile(); !s.ok()) Say("warning: " + s.ToString());
  }
}

Status Launcher::EnsureModel() {
  bool engine = false;
  for (const auto& g : config_.workers) engine = engine || g.type == "engine";
  if (!engine || fs::exists(fs::path(config_.model_dir) / "config.json")) return Status::Ok();
  if (!config_.generate_model.enabled)
    return Status::NotFound("no model in '" + config_.model_dir + "' and cluster.generate_model.enabled is false");
  const GenerateModelConfig& gm = config_.generate_model;
  Say(fmt::format("generating the '{}' model in {} ({} vocabulary)", gm.preset, config_.model_dir,
                  gm.vocab > 0 ? fmt::format("{}-token", gm.vocab) : std::string("the preset's")));
  std::vector<std::string> argv = {Bin("pdserve"), "make-model", "--preset", gm.preset, "--out", config_.model_dir,
                                   "--seed", std::to_string(gm.seed)};
  if (gm.vocab > 0) argv.insert(argv.end(), {"--vocab", std::to_string(gm.vocab)});
  PDSERVE_RETURN_IF_ERROR(supervisor_.Start({"make-model", argv, {}}).status());
  while (supervisor_.Running("make-model")) {
    bool sig = false;
    for (const auto& e : supervisor_.Poll(std::chrono::milliseconds(200), signal_fd_, &sig))
      if (e.status != 0) return Status::Internal(fmt::format("pdserve make-model failed (it {})", DescribeExit(e.status)));
    if (sig) {
      signalfd_siginfo info;
      if (read(signal_fd_, &info, sizeof(info)) == sizeof(info)) signal_ = static_cast<int>(info.ssi_signo);
      return Status::Cancelled("interrupted while generating the model");
    }
  }
  return Status::Ok();
}

bool Launcher::SpreadOverHosts(const WorkerGroupConfig& g) { return (g.mpi_ranks > 1 || g.plan) && !g.hosts.empty(); }

std::vector<std::string> Launcher::WorkerArgv(const WorkerGroupConfig& g, uint32_t i) const {
  std::vector<std::string> argv;
  // More ranks than cores is expected (one machine, or small test hosts), and root may run them.
  if (g.mpi_ranks > 1 || g.plan) {
    argv = {services::FindInPath("mpirun"), "-n", std::to_string(g.mpi_ranks), "--oversubscribe"};
    if (getuid() == 0) argv.push_back("--allow-run-as-root");
  }
  if (SpreadOverHosts(g)) {
    // mpirun runs here and starts its daemons on the group's hosts through the launch agent,
    // which reaches each host the way the launcher does; ranks talk TCP on the hosts' network.
    const std::string network = config_.NetworkOf(*config_.FindHost(g.hosts.front()));
    argv.insert(argv.end(), {"--hostfile", HostfilePath(g, i), "--mca", "plm_rsh_agent", run_dir_ + "/launch-agent.sh",
                             "--mca", "plm_rsh_no_tree_spawn", "1"});
    if (!network.empty())
      argv.insert(argv.end(), {"--mca", "btl_tcp_if_include", network, "--mca", "oob_tcp_if_include", network});
    // The group's environment reaches the remote ranks only when named.
    for (const auto& [k, v] : g.env) argv.insert(argv.end(), {"-x", k});
  }
  argv.insert(argv.end(), {Bin(ClusterConfig::BinaryName(g)), "--router", control_endpoint_, "--worker-id",
                           fmt::format("{}-{}", g.name, i), "--role", services::WorkerRoleName(g.role), "--model-name",
                           config_.router.model_name, "--metrics-port",
                           std::to_string(g.metrics_port == 0 ? 0 : g.metrics_port + i * g.registrations())});
  // The drain must end before the launcher's SIGKILL (cluster.stop_grace_ms), unless the group
  // sets its own.
  if (std::find(g.args.begin(), g.args.end(), "--drain-timeout-ms") == g.args.end())
    argv.insert(argv.end(), {"--drain-timeout-ms", std::to_string(config_.drain_timeout().count())});
  if (g.type == "engine") argv.insert(argv.end(), {"--model", config_.model_dir});
  if (g.plan)
    argv.insert(argv.end(),
                {"--plan", fmt::format("cp={},dp={},ep={},tp={}", g.plan->cp, g.plan->dp, g.plan->ep, g.plan->tp)});
  if (!g.hosts.empty()) {
    // On an inventory host: metrics on every interface, registered with the host's address on
    // its network (each rank resolves --network on its own host), unless the group says.
    auto given = [&g](const char* flag) { return std::find(g.args.begin(), g.args.end(), flag) != g.args.end(); };
    const HostConfig* host = config_.HostOf(g, i);
    const std::string network = config_.NetworkOf(*host);
    if (!given("--metrics-host")) argv.insert(argv.end(), {"--metrics-host", "0.0.0.0"});
    if (!network.empty() && !given("--network")) {
      argv.insert(argv.end(), {"--network", network});
    } else if (network.empty() && g.hosts.size() == 1 && !given("--advertise-host")) {
      argv.insert(argv.end(), {"--advertise-host", host->address});
    }
  }
  argv.insert(argv.end(), g.args.begin(), g.args.end());
  return argv;
}

std::string Launcher::HostfilePath(const WorkerGroupConfig& g, uint32_t i) const {
  return fmt::format("{}/{}-{}.hostfile", run_dir_, g.name, i);
}

Status Launcher::StartInstance(Instance& in) {
  ProcessSpec spec;
  spec.name = in.name;
  if (in.group < 0) {
    const std::string ready = run_dir_ + "/router.ready";
    std::error_code ec;
    fs::remove(ready, ec);
    const HostConfig* host = config_.FindHost(config_.router_host);
    std::vector<std::string> argv = {Bin("pdserve-router"), "--config", fs::absolute(config_path_, ec).string()};
    if (host == nullptr || host->shared_files) argv.insert(argv.end(), {"--ready-file", ready});
    if (host != nullptr && config_.router.advertise_host.empty())
      argv.insert(argv.end(), {"--advertise-host", host->address});
    LocalCommand lc = CommandOnHost(host, argv, {}, cwd_);
    spec.argv = std::move(lc.argv);
    spec.env = std::move(lc.env);
  } else {
    const WorkerGroupConfig& g = config_.workers[in.group];
    if (SpreadOverHosts(g)) {
      // mpirun here, its ranks on the group's hosts (WorkerArgv). Stopping: SIGUSR1 to mpirun,
      // which forwards it to every rank as is (they drain and exit 0, and so does mpirun); its
      // SIGTERM would become SIGCONT, SIGTERM and SIGKILL a second apart, cutting the drain.
      std::vector<const HostConfig*> hosts;
      for (const std::string& h : g.hosts) hosts.push_back(config_.FindHost(h));
      PDSERVE_RETURN_IF_ERROR(WriteStringToFile(HostfilePath(g, in.index), MpiHostfile(hosts, g.mpi_ranks)));
      spec.argv = WorkerArgv(g, in.index);
      spec.env = g.env;
      spec.stop_signal = SIGUSR1;
    } else {
      LocalCommand lc = CommandOnHost(config_.HostOf(g, in.index), WorkerArgv(g, in.index), g.env, cwd_);
      spec.argv = std::move(lc.argv);
      spec.env = std::move(lc.env);
      spec.stop_through_children = g.mpi_ranks > 1 || g.plan.has_value();
    }
  }
  PDSERVE_RETURN_IF_ERROR(supervisor_.Start(spec).status());
  in.state = InstanceState::kRunning;
  in.started = Clock::now();
  return Status::Ok();
}

Status Launcher::StartRouter() {
  instances_.push_back(Instance{"router", -1, 0});
  PDSERVE_RETURN_IF_ERROR(StartInstance(instances_.back()));
  const std::string ready = run_dir_ + "/router.ready";
  const auto deadline = Clock::now() + config_.ready_timeout;
  const HostConfig* host = config_.FindHost(config_.router_host);
  if (host != nullptr && !host->shared_files) {
    // No ready file comes back from this host: the router's fixed ports (checked by the config)
    // at its advertised address, and its /health answering (200 or 503), say it is up.
    const std::string& advertise = config_.router.advertise_host.empty() ? host->address : config_.router.advertise_host;
    http_host_ = advertise;
    http_port_ = config_.router.port;
    const std::string control_host = services::EndpointHost(config_.router.control_endpoint);
    control_endpoint_ = services::IsWildcardHost(control_host) || !config_.router.advertise_host.empty()
                            ? services::EndpointWithHost(config_.router.control_endpoint, advertise)
                            : config_.router.control_endpoint;
    httplib::Client cli(http_host_, http_port_);
    cli.set_connection_timeout(std::chrono::seconds(1));
    cli.set_read_timeout(std::chrono::seconds(2));
    while (Clock::now() < deadline) {
      if (!PollOnce(std::chrono::milliseconds(200))) return Status::Aborted("while waiting for the router");
      if (cli.Get("/health")) return Status::Ok();
    }
    return Status::DeadlineExceeded(fmt::format("the router on host '{}' did not answer at http://{}:{}/health in time",
                                                host->name, http_host_, http_port_));
  }
  while (Clock::now() < deadline) {
    if (!PollOnce(std::chrono::milliseconds(50))) return Status::Aborted("while waiting for the router");
    auto text = ReadFileToString(ready);
    if (!text.ok()) continue;
    try {
      auto j = nlohmann::json::parse(text.value());
      http_port_ = j["http_port"].get<int>();
      control_endpoint_ = j["control_endpoint"].get<std::string>();
      // The advertised HTTP host (docs/configuration.md "Addresses"); an older router's file
      // has none.
      http_host_ = j.contains("host") ? j["host"].get<std::string>()
                                      : services::AdvertisedHost(config_.router.host, config_.router.advertise_host);
      return Status::Ok();
    } catch (const std::exception&) {
    }
  }
  return Status::DeadlineExceeded("the router did not start in time");
}

Status Launcher::StartWorkers() {
  for (size_t gi = 0; gi < config_.workers.size(); ++gi) {
    const WorkerGroupConfig& g = config_.workers[gi];
    for (uint32_t i = 0; i < g.count; ++i) {
      instances_.push_back(Instance{fmt::format("{}-{}", g.name, i), static_cast<int>(gi), i});
      PDSERVE_RETURN_IF_ERROR(StartInstance(instances_.back()));
    }
  }
  return Status::Ok();
}

Status Launcher::ScaleGroup(const std::string& group, uint32_t count) {
  int gi = -1;
  for (size_t i = 0; i < config_.workers.size(); ++i)
    if (config_.workers[i].name == group) gi = static_cast<int>(i);
  if (gi < 0) return Status::NotFound("no worker group '" + group + "'");
  if (count == 0) return Status::InvalidArgument("a group keeps at least one process");
  std::vector<Instance*> live;  // counted towards the group's size, by index
  uint32_t next_index = 0;
  for (Instance& in : instances_) {
    if (in.group != gi) continue;
    next_index = std::max(next_index, in.index + 1);
    if (in.state == InstanceState::kRunning || in.state == InstanceState::kRestartPending) live.push_back(&in);
  }
  std::sort(live.begin(), live.end(), [](const Instance* a, const Instance* b) { return a->index < b->index; });
  while (live.size() > count) {
    Instance* in = live.back();
    live.pop_back();
    if (in->state == InstanceState::kRestartPending) {
      in->state = InstanceState::kLeft;
    } else {
      Say(fmt::format("scaling group '{}' down: draining {}", group, in->name));
      in->state = InstanceState::kDraining;
      supervisor_.RequestStop(in->name);
    }
  }
  for (uint32_t k = static_cast<uint32_t>(live.size()); k < count; ++k) {
    // Reuse a departed slot first (its worker id and metrics port), else a new index.
    Instance* slot = nullptr;
    for (Instance& in : instances_)
      if (in.group == gi && (in.state == InstanceState::kLeft || in.state == InstanceState::kGaveUp)) {
        slot = &in;
        break;
      }
    if (slot == nullptr) {
      instances_.push_back(Instance{fmt::format("{}-{}", group, next_index), gi, next_index});
      ++next_index;
      slot = &instances_.back();
    }
    slot->consecutive_failures = 0;
    Say(fmt::format("scaling group '{}' up: starting {}", group, slot->name));
    PDSERVE_RETURN_IF_ERROR(StartInstance(*slot));
  }
  return WriteReadyFile();
}

uint32_t Launcher::LiveCount(const std::string& group) const {
  uint32_t n = 0;
  for (const Instance& in : instances_)
    if (in.group >= 0 && config_.workers[static_cast<size_t>(in.group)].name == group &&
        (in.state == InstanceState::kRunning || in.state == InstanceState::kRestartPending))
      ++n;
  return n;
}

Status Launcher::StartAutoscaler() {
  if (!config_.autoscaler.enabled) return Status::Ok();
  AutoscalerLoop::Hooks hooks;
  hooks.live = [this](const std::string& group) { return LiveCount(group); };
  hooks.scale_to = [this](const std::string& group, uint32_t count) { return ScaleGroup(group, count); };
  hooks.draining = [this](const std::string& id) {
    Instance* in = Find(id);
    if (in != nullptr && in->state == InstanceState::kRunning) in->state = InstanceState::kDraining;
    if (Status s = WriteReadyFile(); !s.ok()) Say("warning: " + s.ToString());
  };
  hooks.say = [](const std::string& line) { Say(line); };
  if (config_.autoscaler.metrics_host.empty()) {
    // Next to a router on this machine, as exposed as it is; else on every interface here.
    const HostConfig* rh = config_.FindHost(config_.router_host);
    config_.autoscaler.metrics_host =
        rh == nullptr || rh->run == HostConfig::Run::kLocal ? config_.router.host : std::string("0.0.0.0");
  }
  PDSERVE_ASSIGN_OR_RETURN(autoscaler_, AutoscalerLoop::Create(config_, http_host_, http_port_, std::move(hooks)));
  const auto& p = config_.autoscaler.policy;
  std::string pools;
  for (const auto& pool : p.pools)
    pools += fmt::format("{}{} '{}' [{}, {}]", pools.empty() ? "" : ", ", planner::PoolKindName(pool.kind), pool.group,
                         pool.min, pool.max);
  Say(fmt::format("autoscaler on: {}; SLO TTFT {:.0f} ms, TPOT {:.1f} ms at p{:.0f}, every {} ms over {} ms; metrics "
                  "on port {}",
                  pools, p.slo_ttft_s * 1e3, p.slo_tpot_s * 1e3, p.percentile * 100, config_.autoscaler.interval.count(),
                  config_.autoscaler.window.count(), autoscaler_->metrics_port()));
  return Status::Ok();
}

Status Launcher::WaitReady() {
  const auto deadline = Clock::now() + config_.ready_timeout;
  httplib::Client cli(http_host_, http_port_);
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

Status Launcher::WriteReadyFile() {
  if (ready_file_.empty() || !ready_) return Status::Ok();
  nlohmann::json pids = nlohmann::json::object();
  for (const auto& n : supervisor_.RunningNames()) {
    if (auto pid = supervisor_.Pid(n)) pids[n] = *pid;
  }
  nlohmann::json instances = nlohmann::json::object();
  for (const Instance& in : instances_) {
    static const char* kStates[] = {"running", "restart_pending", "draining", "left", "gave_up"};
    instances[in.name] = {{"state", kStates[static_cast<int>(in.state)]}, {"restarts", in.restarts}};
    // Where it runs (an inventory host; its ranks' hosts for an MPI instance spread over some).
    if (in.group < 0 && !config_.router_host.empty()) instances[in.name]["hosts"] = {config_.router_host};
    if (in.group >= 0) {
      const WorkerGroupConfig& g = config_.workers[static_cast<size_t>(in.group)];
      if (SpreadOverHosts(g)) {
        instances[in.name]["hosts"] = g.hosts;
      } else if (const HostConfig* h = config_.HostOf(g, in.index)) {
        instances[in.name]["hosts"] = {h->name};
      }
    }
  }
  nlohmann::json ready = {{"http_port", http_port_},
                          {"http_host", http_host_},
                          {"control_endpoint", control_endpoint_},
                          {"pids", pids},
                          {"instances", instances}};
  if (autoscaler_) ready["planner_metrics_port"] = autoscaler_->metrics_port();
  return WriteStringToFile(ready_file_, ready.dump());
}

int Launcher::Shutdown(int code) {
  Say(code == 0 ? "stopping the cluster" : "stopping the cluster");
  // Workers first (they drain and deregister while the router still listens), then the router.
  // A process's own exit status here is not a failure: it was asked to stop.
  std::vector<std::string> workers;
  for (const Instance& in : instances_)
    if (in.group >= 0) workers.push_back(in.name);
  std::vector<ProcessExit> exits = supervisor_.Stop(workers, config_.stop_grace);
  for (ProcessExit& e : supervisor_.Stop({"router", "make-model"}, config_.stop_grace)) exits.push_back(std::move(e));
  // A clean stop ends every process with status 0 (a worker drains, then exits): say so when one
  // did not, e.g. a drain cut short by the SIGKILL after cluster.stop_grace_ms.
  for (const ProcessExit& e : exits) {
    if (e.status != 0) Say(fmt::format("warning: {} (pid {}) {} while stopping", e.name, e.pid, DescribeExit(e.status)));
  }
  Say(code == 0 ? "all processes stopped" : fmt::format("all processes stopped; exit {}", code));
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
  cwd_ = fs::current_path(ec).string();
  if (!config_.log_dir.empty()) fs::create_directories(config_.log_dir, ec);

  auto fail = [&](const Status& s) {
    // A signal sent to the whole process group (a terminal's Ctrl-C, `kill -- -PGID`) may stop
    // a child first: its death is then part of the same request, not a failure. Give the
    // launcher's own copy of the signal a moment to arrive before calling it one.
    if (signal_ == 0 && !failure_.empty()) {
      pollfd pfd{signal_fd_, POLLIN, 0};
      if (poll(&pfd, 1, 250) == 1) {
        signalfd_siginfo info;
        if (read(signal_fd_, &info, sizeof(info)) == sizeof(info)) signal_ = static_cast<int>(info.ssi_signo);
      }
    }
    if (signal_ != 0) {
      // Ctrl-C while starting is a request, not an error; the exit code still says the cluster
      // never served.
      Say(fmt::format("start-up interrupted by signal {}", signal_));
      return Shutdown(128 + signal_);
    }
    Say("error: " + s.ToString() + (failure_.empty() ? "" : " -- " + failure_));
    return Shutdown(1);
  };
  if (Status s = CheckBinaries(); !s.ok()) return fail(s);
  if (Status s = WriteLaunchAgent(); !s.ok()) return fail(s);
  if (Status s = EnsureModel(); !s.ok()) return fail(s);
  if (Status s = StartRouter(); !s.ok()) return fail(s);
  if (Status s = StartWorkers(); !s.ok()) return fail(s);
  if (Status s = WaitReady(); !s.ok()) return fail(s);
  ready_ = true;
  if (Status s = StartAutoscaler(); !s.ok()) return fail(s);

  const std::string& host = http_host_;
  Say(fmt::format("cluster '{}' ready: OpenAI API at http://{}:{}/v1 (model '{}'), router metrics at "
                  "http://{}:{}/metrics, workers at http://{}:{}/admin/workers; Ctrl-C stops it",
                  config_.name, host, http_port_, config_.router.model_name, host, http_port_, host, http_port_));
  if (Status s = WriteReadyFile(); !s.ok()) return fail(s);
  const auto poll = autoscaler_ ? std::min(std::chrono::milliseconds(200), config_.autoscaler.interval)
                                : std::chrono::milliseconds(200);
  while (PollOnce(poll)) {
    if (autoscaler_) autoscaler_->Poll(Clock::now());
  }
  if (!failure_.empty()) {
    Say("error: " + failure_);
    return Shutdown(1);
  }
  Say(fmt::format("signal {}", signal_));
  return Shutdown(0);
}

}  // namespace pdserve::launch
