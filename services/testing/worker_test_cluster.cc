#include "services/testing/worker_test_cluster.h"

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <mutex>
#include <tuple>

#include <gtest/gtest.h>

#include "engine/engine.h"
#include "services/common/process_util.h"
#include "tokenizer/tokenizer_paths.h"

namespace pdserve::services::worker::e2e {

using namespace std::chrono_literals;
using nlohmann::json;
using router::testing::MetricValue;
using services::testing::ChildProcess;
using services::testing::HttpGet;
using services::testing::WaitFor;
using services::testing::WaitForReadyFile;

namespace {
const std::string kBin = PDSERVE_BIN_DIR;
}

const tokenizer::Tokenizer& Tok() {
  static const auto* tok = tokenizer::Tokenizer::Load(tokenizer::DefaultTokenizerDir()).value().release();
  return *tok;
}

const std::string& ModelDir() {
  static const std::string dir = [] {
    const std::string d = services::testing::CachedTestModel(kBin, "tiny", 128815, 3);
    EXPECT_FALSE(d.empty());
    return d;
  }();
  return dir;
}

std::vector<int32_t> Prompt(int k) {
  static const char* kWords[] = {"alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel"};
  std::string text;
  for (int i = 0; i < 6 + k % 9; ++i) text += std::string(i ? " " : "") + kWords[(k * 5 + i * 3) % 8] + std::to_string(k);
  return Tok().Encode(text, {false, true}).value();
}

std::vector<int32_t> LongPrompt(int k, size_t n) {
  std::vector<int32_t> p;
  for (int i = 0; p.size() < n; ++i) {
    const auto part = Prompt(k * 31 + i);
    p.insert(p.end(), part.begin(), part.end());
  }
  p.resize(n);
  return p;
}

std::vector<int32_t> Reference(const std::vector<int32_t>& prompt, int max_tokens, bool whole_prompts) {
  static std::mutex mu;
  static std::unique_ptr<engine::Engine> engines[2];
  static std::map<std::tuple<std::vector<int32_t>, int, bool>, std::vector<int32_t>> cache;
  std::lock_guard<std::mutex> lock(mu);
  auto key = std::make_tuple(prompt, max_tokens, whole_prompts);
  if (auto it = cache.find(key); it != cache.end()) return it->second;
  std::unique_ptr<engine::Engine>& eng = engines[whole_prompts ? 1 : 0];
  if (!eng) {
    engine::EngineOptions eo;
    eo.model_dir = ModelDir();
    eo.kv_cache_gib = 0.125;
    eo.scheduler.whole_prompts = whole_prompts;
    eo.prefix_cache = false;  // every reply a cold one
    eng = engine::Engine::Create(eo).value();
  }
  std::vector<int32_t> out;
  engine::RequestOptions ro;
  ro.sampling.temperature = 0;
  ro.sampling.max_tokens = max_tokens;
  ro.on_event = [&out](const engine::TokenEvent& ev) {
    if (ev.token >= 0) out.push_back(ev.token);
  };
  EXPECT_TRUE(eng->AddRequest(prompt, ro).ok());
  while (eng->Step()) {
  }
  cache[key] = out;
  return out;
}

std::string Text(const std::vector<int32_t>& tokens) { return Tok().Decode(tokens, {true}).value(); }

std::string Body(const std::vector<int32_t>& prompt, int max_tokens, bool stream) {
  json b = {{"model", "pdserve"}, {"prompt", prompt}, {"max_tokens", max_tokens}, {"temperature", 0},
            {"ignore_eos", true}};
  if (stream) {
    b["stream"] = true;
    b["stream_options"] = {{"include_usage", true}};
  }
  return b.dump();
}

Streamed Collect(const services::testing::SseReply& r) {
  Streamed out;
  for (size_t i = 0; i < r.events.size(); ++i) {
    json j = json::parse(r.events[i], nullptr, false);
    if (j.is_discarded()) continue;
    if (j.contains("error")) {
      out.error = true;
      out.error_message = j["error"].value("message", std::string());
      out.error_at = r.arrival_seconds[i];
      continue;
    }
    if (j.contains("usage") && !j["usage"].is_null()) out.usage = j["usage"];
    for (const auto& c : j["choices"])
      if (c.contains("text")) out.text += c["text"].get<std::string>();
  }
  return out;
}

bool UcxTcpUsable() { return std::filesystem::exists("/sys/class/net"); }

namespace {

std::vector<std::string> WorkerArgs(const std::string& router, const std::string& id, const std::string& ready) {
  return {"--router", router, "--worker-id", id, "--model", ModelDir(), "--model-name", "pdserve",
          "--ready-file", ready, "--register-retry-ms", "50", "--kv-gib", "0.0625", "--threads", "1",
          "--kv-lease-ms", "4000", "--kv-transfer-timeout-ms", "4000"};
}

// The default worker flags (pairs of flag and value) then `extra`; a flag that `extra` gives
// replaces its default (the workers refuse a flag given twice).
void AppendArgs(const std::vector<std::string>& defaults, const std::vector<std::string>& extra,
                std::vector<std::string>* argv) {
  for (size_t i = 0; i + 1 < defaults.size(); i += 2) {
    if (std::find(extra.begin(), extra.end(), defaults[i]) != extra.end()) continue;
    argv->push_back(defaults[i]);
    argv->push_back(defaults[i + 1]);
  }
  argv->insert(argv->end(), extra.begin(), extra.end());
}

// The binary of a worker of `role`: the shipped pdserve-<role>, or the test-only
// pdserve-fault-worker when `extra` asks for a fault (--fault-...).
std::vector<std::string> WorkerBinary(const std::string& role, const std::vector<std::string>& extra) {
  for (const std::string& a : extra)
    if (a.rfind("--fault-", 0) == 0) return {kBin + "/pdserve-fault-worker", "--role", role};
  return {kBin + "/pdserve-" + role};
}

}  // namespace

Status Workers::Start(const std::string& id, const std::string& role, std::vector<std::string> extra) {
  const std::string ready = c_->dir() + "/" + id + ".ready";
  auto via = router_endpoints_.find(id);
  const std::string router = via != router_endpoints_.end() ? via->second : c_->control_endpoint();
  std::vector<std::string> argv = WorkerBinary(role, extra);
  AppendArgs(WorkerArgs(router, id, ready), extra, &argv);
  PDSERVE_ASSIGN_OR_RETURN(auto child, ChildProcess::Spawn(argv, c_->dir() + "/" + id + ".log",
                                                           {"UCX_TLS=tcp", "UCX_NET_DEVICES=lo"}));
  ChildProcess* p = child.get();
  procs_[id] = std::move(child);
  PDSERVE_ASSIGN_OR_RETURN(json r, WaitForReadyFile(ready, p, 60s));
  ports_[id] = r["metrics_port"].get<int>();
  return Status::Ok();
}

Status Workers::StartInstance(const std::string& id, const std::string& role, int ranks, const std::string& plan,
                              int dp, std::vector<std::string> extra) {
  const std::string ready = c_->dir() + "/" + id + ".ready";
  std::vector<std::string> argv = {PDSERVE_MPIEXEC, "-n", std::to_string(ranks)};
  for (std::string& a : WorkerBinary(role, extra)) argv.push_back(std::move(a));
  argv.insert(argv.end(), {"--plan", plan});
  AppendArgs(WorkerArgs(c_->control_endpoint(), id, ready), extra, &argv);
  std::vector<std::string> env = services::testing::LoopbackMpiEnv();
  env.insert(env.end(), {"UCX_TLS=tcp", "UCX_NET_DEVICES=lo"});
  PDSERVE_ASSIGN_OR_RETURN(auto child, ChildProcess::Spawn(argv, c_->dir() + "/" + id + ".log", env));
  ChildProcess* p = child.get();
  procs_[id] = std::move(child);
  for (int k = 0; k < dp; ++k) {
    const std::string rank_id = dp > 1 ? id + "-dp" + std::to_string(k) : id;
    const std::string rank_ready = dp > 1 ? ready + ".dp" + std::to_string(k) : ready;
    PDSERVE_ASSIGN_OR_RETURN(json r, WaitForReadyFile(rank_ready, p, 60s));
    ports_[rank_id] = r["metrics_port"].get<int>();
  }
  return Status::Ok();
}

std::string Workers::Metrics(const std::string& id) { return HttpGet(port(id), "/metrics", 5s).body; }

bool Workers::NoBlocksUsed(const std::string& id, std::chrono::milliseconds timeout) {
  return WaitFor([&] { return MetricValue(Metrics(id), "pdserve_worker_kv_blocks", "used") == 0; }, timeout, 100ms);
}

bool Workers::KillWhenBusy(const std::string& id, std::chrono::milliseconds timeout) {
  const bool busy = WaitFor(
      [&] {
        for (const auto& w : c_->Workers())
          if (w["id"] == id && w["outstanding_requests"].get<int64_t>() > 0) return true;
        return false;
      },
      timeout, 2ms);
  if (busy) proc(id)->Kill();
  return busy;
}

std::string Workers::Logs() {
  std::string s = c_->Logs();
  for (auto& [id, p] : procs_) s += "==== " + id + "\n" + p->Log();
  return s;
}

}  // namespace pdserve::services::worker::e2e
