#include "services/launch/cluster_config.h"

#include <algorithm>
#include <set>

#include "services/common/net_util.h"

namespace pdserve::launch {

const char* RestartPolicyName(RestartPolicy p) {
  switch (p) {
    case RestartPolicy::kOnFailure: return "on-failure";
    case RestartPolicy::kAlways: return "always";
    case RestartPolicy::kNever: return "never";
  }
  return "?";
}

namespace {

// restart, restart_backoff_ms, restart_max_backoff_ms, max_restarts, restart_reset_ms of a
// section (`prefix` "" for a worker group, "router_" in the cluster section).
Status ReadRestart(const services::YamlSection& s, const std::string& prefix, RestartConfig* r) {
  std::string policy = RestartPolicyName(r->policy);
  PDSERVE_RETURN_IF_ERROR(s.GetEnum(prefix + "restart", {"on-failure", "always", "never"}, &policy));
  r->policy = policy == "always" ? RestartPolicy::kAlways : policy == "never" ? RestartPolicy::kNever
                                                                              : RestartPolicy::kOnFailure;
  PDSERVE_RETURN_IF_ERROR(s.Get(prefix + "restart_backoff_ms", &r->backoff));
  PDSERVE_RETURN_IF_ERROR(s.Get(prefix + "restart_max_backoff_ms", &r->max_backoff));
  PDSERVE_RETURN_IF_ERROR(s.Get(prefix + "max_restarts", &r->max_restarts));
  PDSERVE_RETURN_IF_ERROR(s.Get(prefix + "restart_reset_ms", &r->reset_after));
  if (r->backoff.count() <= 0 || r->max_backoff < r->backoff)
    return Status::InvalidArgument(s.path() + "." + prefix +
                                   "restart_backoff_ms must be > 0 and <= " + prefix + "restart_max_backoff_ms");
  if (r->reset_after.count() <= 0) return Status::InvalidArgument(s.path() + "." + prefix + "restart_reset_ms must be > 0");
  return Status::Ok();
}

// The `autoscaler` section; its pools must name groups of the matching role, whose count lies
// within the pool's bounds.
Status ReadAutoscaler(const services::YamlSection& root, ClusterConfig* c) {
  PDSERVE_ASSIGN_OR_RETURN(services::YamlSection a, root.Section("autoscaler"));
  if (!root.Has("autoscaler")) return Status::Ok();
  PDSERVE_RETURN_IF_ERROR(a.CheckKeys({"enabled", "interval_ms", "window_ms", "percentile", "slo", "scale_up_after",
                                       "scale_down_after", "low_water", "cooldown_ms", "min_requests",
                                       "drain_timeout_ms", "metrics_port", "metrics_host", "pools"}));
  AutoscalerSettings& s = c->autoscaler;
  planner::AutoscalerConfig& p = s.policy;
  s.enabled = true;
  PDSERVE_RETURN_IF_ERROR(a.Get("enabled", &s.enabled));
  PDSERVE_RETURN_IF_ERROR(a.Get("interval_ms", &s.interval));
  PDSERVE_RETURN_IF_ERROR(a.Get("window_ms", &s.window));
  PDSERVE_RETURN_IF_ERROR(a.Get("drain_timeout_ms", &s.drain_timeout));
  PDSERVE_RETURN_IF_ERROR(a.Get("percentile", &p.percentile));
  int64_t up = p.scale_up_after, down = p.scale_down_after, port = 0;
  PDSERVE_RETURN_IF_ERROR(a.Get("scale_up_after", &up));
  PDSERVE_RETURN_IF_ERROR(a.Get("scale_down_after", &down));
  p.scale_up_after = static_cast<int>(std::clamp<int64_t>(up, 0, 1000));
  p.scale_down_after = static_cast<int>(std::clamp<int64_t>(down, 0, 1000));
  PDSERVE_RETURN_IF_ERROR(a.Get("low_water", &p.low_water));
  PDSERVE_RETURN_IF_ERROR(a.Get("cooldown_ms", &p.cooldown));
  PDSERVE_RETURN_IF_ERROR(a.Get("min_requests", &p.min_requests));
  PDSERVE_RETURN_IF_ERROR(a.Get("metrics_port", &port));
  PDSERVE_RETURN_IF_ERROR(a.Get("metrics_host", &s.metrics_host));
  if (port < 0 || port > 65535) return Status::InvalidArgument(a.path() + ".metrics_port must be in [0, 65535]");
  s.metrics_port = static_cast<int>(port);
  if (s.interval.count() < 10 || s.window < s.interval)
    return Status::InvalidArgument(a.path() + ": interval_ms must be >= 10 and window_ms >= interval_ms");
  if (s.drain_timeout.count() <= 0) return Status::InvalidArgument(a.path() + ".drain_timeout_ms must be > 0");
  PDSERVE_ASSIGN_OR_RETURN(services::YamlSection slo, a.Section("slo"));
  PDSERVE_RETURN_IF_ERROR(slo.CheckKeys({"ttft_ms", "tpot_ms", "queue_ms"}));
  double ttft = p.slo_ttft_s * 1e3, tpot = p.slo_tpot_s * 1e3, queue = p.slo_queue_s * 1e3;
  PDSERVE_RETURN_IF_ERROR(slo.Get("ttft_ms", &ttft));
  PDSERVE_RETURN_IF_ERROR(slo.Get("tpot_ms", &tpot));
  PDSERVE_RETURN_IF_ERROR(slo.Get("queue_ms", &queue));
  p.slo_ttft_s = ttft * 1e-3;
  p.slo_tpot_s = tpot * 1e-3;
  p.slo_queue_s = queue * 1e-3;
  PDSERVE_ASSIGN_OR_RETURN(services::YamlSection pools, a.Section("pools"));
  PDSERVE_RETURN_IF_ERROR(pools.CheckKeys({"prefill", "decode", "colocated"}));
  for (const char* kind : {"prefill", "decode", "colocated"}) {
    if (!pools.Has(kind)) continue;
    PDSERVE_ASSIGN_OR_RETURN(services::YamlSection ps, pools.Section(kind));
    PDSERVE_RETURN_IF_ERROR(ps.CheckKeys({"group", "min", "max"}));
    planner::AutoscalerConfig::Pool pool;
    pool.kind = std::string(kind) == "prefill" ? planner::PoolKind::kPrefill
                : std::string(kind) == "decode" ? planner::PoolKind::kDecode
                                                : planner::PoolKind::kColocated;
    pool.group = kind;
    PDSERVE_RETURN_IF_ERROR(ps.Get("group", &pool.group));
    PDSERVE_RETURN_IF_ERROR(ps.Get("min", &pool.min));
    PDSERVE_RETURN_IF_ERROR(ps.Get("max", &pool.max));
    const WorkerGroupConfig* g = nullptr;
    for (const auto& w : c->workers)
      if (w.name == pool.group) g = &w;
    if (g == nullptr) return Status::InvalidArgument(ps.path() + ".group: no worker group '" + pool.group + "'");
    if (services::WorkerRoleName(g->role) != std::string(kind))
      return Status::InvalidArgument(ps.path() + ".group: group '" + pool.group + "' has role " +
                                     services::WorkerRoleName(g->role) + ", not " + kind);
    if (g->count < pool.min || g->count > pool.max)
      return Status::InvalidArgument(ps.path() + ": group '" + pool.group + "' starts with count " +
                                     std::to_string(g->count) + ", outside [min, max]");
    p.pools.push_back(pool);
  }
  if (s.enabled && !c->router.admin_api)
    return Status::InvalidArgument(a.path() + ": needs router.admin_api (a scale-down drains through POST /admin/drain)");
  if (s.enabled) PDSERVE_RETURN_IF_ERROR(p.Validate());
  return Status::Ok();
}

// The `hosts:` inventory.
Status ReadHosts(const services::YamlSection& root, ClusterConfig* c) {
  PDSERVE_ASSIGN_OR_RETURN(std::vector<services::YamlSection> hosts, root.SectionList("hosts"));
  std::set<std::string> names;
  for (const auto& h : hosts) {
    PDSERVE_RETURN_IF_ERROR(
        h.CheckKeys({"name", "address", "network", "run", "ssh_target", "ssh_options", "shared_files"}));
    HostConfig hc;
    PDSERVE_RETURN_IF_ERROR(h.Get("name", &hc.name));
    PDSERVE_RETURN_IF_ERROR(h.Get("address", &hc.address));
    PDSERVE_RETURN_IF_ERROR(h.Get("network", &hc.network));
    PDSERVE_RETURN_IF_ERROR(h.Get("ssh_target", &hc.ssh_target));
    PDSERVE_RETURN_IF_ERROR(h.Get("ssh_options", &hc.ssh_options));
    if (h.Has("run")) {
      std::vector<std::string> prefix;
      if (h.Get("run", &prefix).ok()) {
        if (prefix.empty() || prefix[0].empty())
          return Status::InvalidArgument(h.path() + ".run: a command prefix needs at least a command");
        hc.run = HostConfig::Run::kPrefix;
        hc.prefix = std::move(prefix);
      } else {
        std::string mode;
        if (!h.GetEnum("run", {"ssh", "local"}, &mode).ok())
          return Status::InvalidArgument(h.path() + ".run must be ssh, local or a command prefix list such as "
                                                    "[ip, netns, exec, NAME]");
        hc.run = mode == "local" ? HostConfig::Run::kLocal : HostConfig::Run::kSsh;
      }
    }
    hc.shared_files = hc.run != HostConfig::Run::kSsh;
    PDSERVE_RETURN_IF_ERROR(h.Get("shared_files", &hc.shared_files));
    if (hc.name.empty() || hc.name.find_first_of(" /\t,") != std::string::npos)
      return Status::InvalidArgument(h.path() + ".name must be a non-empty word");
    if (!names.insert(hc.name).second) return Status::InvalidArgument(h.path() + ".name '" + hc.name + "' is used twice");
    if (hc.address.empty() || hc.address.find_first_of(" /\t") != std::string::npos)
      return Status::InvalidArgument(h.path() + ".address must be the host's address (how the others reach it)");
    c->hosts.push_back(std::move(hc));
  }
  return Status::Ok();
}

// Placement (cluster.router_host, workers[].hosts) against the inventory, and addresses the
// other hosts can reach.
Status CheckPlacement(ClusterConfig* c) {
  bool remote_router = false, remote_workers = false;
  if (!c->router_host.empty()) {
    const HostConfig* h = c->FindHost(c->router_host);
    if (h == nullptr) return Status::InvalidArgument("cluster.router_host: no host '" + c->router_host + "' in `hosts`");
    remote_router = h->run != HostConfig::Run::kLocal;
    if (!h->shared_files && c->router.port == 0)
      return Status::InvalidArgument("router.port must be fixed: the router runs on host '" + h->name +
                                     "', which does not share the launcher's files (its ready file)");
  }
  for (size_t gi = 0; gi < c->workers.size(); ++gi) {
    const WorkerGroupConfig& g = c->workers[gi];
    const std::string path = "workers[" + std::to_string(gi) + "].hosts";
    std::set<std::string> networks;
    for (const std::string& name : g.hosts) {
      const HostConfig* h = c->FindHost(name);
      if (h == nullptr) return Status::InvalidArgument(path + ": no host '" + name + "' in `hosts`");
      remote_workers = remote_workers || h->run != HostConfig::Run::kLocal;
      networks.insert(c->NetworkOf(*h));
    }
    const bool mpi = g.mpi_ranks > 1 || g.plan.has_value();
    if (mpi && g.hosts.size() > 1) {
      if (g.mpi_ranks % g.hosts.size() != 0)
        return Status::InvalidArgument(path + ": " + std::to_string(g.mpi_ranks) + " MPI ranks do not spread evenly over " +
                                       std::to_string(g.hosts.size()) + " hosts");
      if (networks.size() != 1 || networks.begin()->empty())
        return Status::InvalidArgument(path + ": the hosts of an MPI instance need one `network` (set cluster.network "
                                       "or each host's network to the same interface or subnet): MPI's TCP traffic and "
                                       "each rank's address are found on it");
    }
  }
  const std::string control_host = services::EndpointHost(c->router.control_endpoint);
  if ((remote_router || remote_workers) && services::IsLoopbackHost(control_host))
    return Status::InvalidArgument("router.control_endpoint " + c->router.control_endpoint +
                                   " is a loopback address, which workers on other hosts cannot reach: bind "
                                   "tcp://0.0.0.0:PORT (or the router host's address)");
  if (remote_router && services::IsLoopbackHost(c->router.host))
    return Status::InvalidArgument("router.host " + c->router.host + " is a loopback address, which nobody off host '" +
                                   c->router_host + "' reaches: listen on 0.0.0.0 (or the host's address)");
  return Status::Ok();
}

Result<ClusterConfig> FromRoot(const services::YamlSection& root, const std::string& origin) {
  ClusterConfig c;
  PDSERVE_RETURN_IF_ERROR(root.CheckKeys({"cluster", "router", "workers", "autoscaler", "hosts"}));
  PDSERVE_ASSIGN_OR_RETURN(services::YamlSection cl, root.Section("cluster"));
  PDSERVE_RETURN_IF_ERROR(cl.CheckKeys({"name", "bin_dir", "model_dir", "generate_model", "log_dir", "stop_grace_ms",
                                        "ready_timeout_ms", "router_restart", "router_restart_backoff_ms",
                                        "router_restart_max_backoff_ms", "router_max_restarts",
                                        "router_restart_reset_ms", "router_host", "network"}));
  PDSERVE_RETURN_IF_ERROR(cl.Get("name", &c.name));
  PDSERVE_RETURN_IF_ERROR(cl.Get("router_host", &c.router_host));
  PDSERVE_RETURN_IF_ERROR(cl.Get("network", &c.network));
  PDSERVE_RETURN_IF_ERROR(cl.Get("bin_dir", &c.bin_dir));
  PDSERVE_RETURN_IF_ERROR(cl.Get("model_dir", &c.model_dir));
  PDSERVE_RETURN_IF_ERROR(cl.Get("log_dir", &c.log_dir));
  PDSERVE_RETURN_IF_ERROR(cl.Get("stop_grace_ms", &c.stop_grace));
  PDSERVE_RETURN_IF_ERROR(cl.Get("ready_timeout_ms", &c.ready_timeout));
  if (c.stop_grace.count() < 1000) return Status::InvalidArgument(cl.path() + ".stop_grace_ms must be >= 1000");
  if (c.ready_timeout.count() <= 0) return Status::InvalidArgument(cl.path() + ".ready_timeout_ms must be > 0");
  PDSERVE_RETURN_IF_ERROR(ReadRestart(cl, "router_", &c.router_restart));
  PDSERVE_ASSIGN_OR_RETURN(services::YamlSection gm, cl.Section("generate_model"));
  PDSERVE_RETURN_IF_ERROR(gm.CheckKeys({"enabled", "preset", "seed", "vocab"}));
  PDSERVE_RETURN_IF_ERROR(gm.Get("enabled", &c.generate_model.enabled));
  PDSERVE_RETURN_IF_ERROR(gm.Get("preset", &c.generate_model.preset));
  PDSERVE_RETURN_IF_ERROR(gm.Get("seed", &c.generate_model.seed));
  PDSERVE_RETURN_IF_ERROR(gm.Get("vocab", &c.generate_model.vocab));
  if (c.generate_model.vocab < 0 || c.generate_model.vocab > (int64_t{1} << 24))
    return Status::InvalidArgument(gm.path() + ".vocab must be in [0, 16777216] (0: the preset's own)");

  PDSERVE_ASSIGN_OR_RETURN(services::YamlSection rs, root.Section("router"));
  PDSERVE_ASSIGN_OR_RETURN(c.router, router::RouterConfig::FromYaml(rs));
  if (c.router.control_endpoint.find('*') != std::string::npos)
    return Status::InvalidArgument("router.control_endpoint: the launcher needs a fixed port (workers dial it)");

  PDSERVE_ASSIGN_OR_RETURN(std::vector<services::YamlSection> groups, root.SectionList("workers"));
  std::set<std::string> names;
  for (const auto& g : groups) {
    PDSERVE_RETURN_IF_ERROR(g.CheckKeys({"name", "role", "type", "count", "binary", "metrics_port", "mpi_ranks", "plan",
                                         "args", "env", "restart", "restart_backoff_ms", "restart_max_backoff_ms",
                                         "max_restarts", "restart_reset_ms", "host", "hosts"}));
    WorkerGroupConfig w;
    if (g.Has("host") && g.Has("hosts")) return Status::InvalidArgument(g.path() + ": give `host` or `hosts`, not both");
    std::string host;
    PDSERVE_RETURN_IF_ERROR(g.Get("host", &host));
    if (!host.empty()) w.hosts = {host};
    PDSERVE_RETURN_IF_ERROR(g.Get("hosts", &w.hosts));
    std::string role = "colocated";
    PDSERVE_RETURN_IF_ERROR(g.GetEnum("role", {"prefill", "decode", "colocated"}, &role));
    w.role = services::ParseWorkerRole(role).value();
    w.name = role;
    PDSERVE_RETURN_IF_ERROR(g.Get("name", &w.name));
    PDSERVE_RETURN_IF_ERROR(g.GetEnum("type", {"engine", "custom"}, &w.type));
    PDSERVE_RETURN_IF_ERROR(g.Get("count", &w.count));
    if (w.count == 0)
      return Status::InvalidArgument(g.path() + ".count must be >= 1 (leave the group out to run none)");
    PDSERVE_RETURN_IF_ERROR(ReadRestart(g, "", &w.restart));
    PDSERVE_RETURN_IF_ERROR(g.Get("binary", &w.binary));
    if (w.type == "custom" && w.binary.empty())
      return Status::InvalidArgument(g.path() + ".binary is required with type: custom (the worker executable)");
    int64_t port = 0;
    PDSERVE_RETURN_IF_ERROR(g.Get("metrics_port", &port));
    PDSERVE_RETURN_IF_ERROR(g.Get("mpi_ranks", &w.mpi_ranks));
    if (w.mpi_ranks == 0) return Status::InvalidArgument(g.path() + ".mpi_ranks must be >= 1");
    std::string plan;
    PDSERVE_RETURN_IF_ERROR(g.Get("plan", &plan));
    if (!plan.empty()) {
      if (w.type != "engine") return Status::InvalidArgument(g.path() + ".plan: only engine workers run a plan");
      PDSERVE_ASSIGN_OR_RETURN(w.plan, comm::ParallelPlan::FromString(plan, g.path() + ".plan"));
      const int64_t ranks = w.plan->attention_ranks();
      if (!g.Has("mpi_ranks")) w.mpi_ranks = static_cast<uint32_t>(ranks);
      if (w.mpi_ranks != ranks)
        return Status::InvalidArgument(g.path() + ".mpi_ranks (" + std::to_string(w.mpi_ranks) + ") must be cp * dp * tp = " +
                                       std::to_string(ranks) + " of its plan");
    }
    // Process i's DP ranks use metrics_port + i * dp + k.
    if (port < 0 || port + int64_t{w.count} * w.registrations() > 65536)
      return Status::InvalidArgument(g.path() + ".metrics_port: out of range");
    w.metrics_port = static_cast<int>(port);
    PDSERVE_RETURN_IF_ERROR(g.Get("args", &w.args));
    PDSERVE_RETURN_IF_ERROR(g.Get("env", &w.env));
    if (w.name.empty() || w.name.find_first_of(" /\t") != std::string::npos)
      return Status::InvalidArgument(g.path() + ".name must be a non-empty word");
    if (!names.insert(w.name).second) return Status::InvalidArgument(g.path() + ".name '" + w.name + "' is used twice");
    c.workers.push_back(std::move(w));
  }
  if (c.workers.empty()) return Status::InvalidArgument(origin + ": `workers` lists no worker group");
  PDSERVE_RETURN_IF_ERROR(ReadAutoscaler(root, &c));
  PDSERVE_RETURN_IF_ERROR(ReadHosts(root, &c));
  PDSERVE_RETURN_IF_ERROR(CheckPlacement(&c));
  return c;
}
}  // namespace

Result<ClusterConfig> ClusterConfig::LoadFile(const std::string& path) {
  PDSERVE_ASSIGN_OR_RETURN(services::YamlSection root, services::YamlSection::LoadFile(path));
  auto c = FromRoot(root, path);
  if (!c.ok()) return c.status().WithContext(path);
  return c;
}

Result<ClusterConfig> ClusterConfig::Parse(std::string_view yaml, const std::string& origin) {
  PDSERVE_ASSIGN_OR_RETURN(services::YamlSection root, services::YamlSection::Parse(yaml, origin));
  return FromRoot(root, origin);
}

const HostConfig* ClusterConfig::FindHost(const std::string& name) const {
  for (const HostConfig& h : hosts)
    if (h.name == name) return &h;
  return nullptr;
}

const HostConfig* ClusterConfig::HostOf(const WorkerGroupConfig& group, uint32_t index) const {
  if (group.hosts.empty()) return nullptr;
  const bool mpi = group.mpi_ranks > 1 || group.plan.has_value();
  return FindHost(group.hosts[mpi ? 0 : index % group.hosts.size()]);
}

std::string ClusterConfig::BinaryName(const WorkerGroupConfig& g) {
  if (!g.binary.empty()) return g.binary;
  return std::string("pdserve-") + services::WorkerRoleName(g.role);
}

}  // namespace pdserve::launch
